"""The examples run end to end, in subprocesses, as a user would run them.

The main command runs once with the tiny preset (LoRDO, DDP and the int8 round in flight;
without ``--methods`` it trains every default method, which is checked without
training); its table, JSON and plots are checked, and its numbers: LoRDO learns
(validation loss below the unigram entropy of the text) and each method's byte count
equals the communication formula of MATH.md §7 for this model (low-rank DDP's and
DiLoCo's formulas on the same loop: ``tests/benchmark/test_benchmarks_quality.py``).
Bad input must stop before training with one line that says what to change.
"""

import json
import math
import os
import pathlib
import re
import subprocess
import sys

import pytest

from tests.helpers import stderr as stderr_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

STEPS, SYNC_EVERY, RANK = 48, 8, 8
METHODS = ("lordo", "ddp", "lordo_int8_overlap")  # Each program compiled costs the suite.
TINY = [
  "--preset", "tiny", "--steps", str(STEPS), "--sync-every", str(SYNC_EVERY),
  "--rank", str(RANK), "--eval-every", "16", "--lr", "1e-2", "--warmup", "8",
  "--methods", ",".join(METHODS),
]  # fmt: skip


def env() -> dict[str, str]:
  """The environment of a subprocess: the repository importable, nothing else set.

  The entry points configure the eight simulated CPU devices themselves.
  """
  return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


def run(script: str, *args: str, timeout: float = 300, cwd=None) -> subprocess.CompletedProcess:
  return subprocess.run(
    [sys.executable, str(EXAMPLES / script), *args],
    capture_output=True,
    text=True,
    timeout=timeout,
    env=env(),
    cwd=cwd or ROOT,
  )


@pytest.fixture(scope="module")
def lm_model():
  sys.path.insert(0, str(EXAMPLES))
  try:
    from lm import model
  finally:
    sys.path.remove(str(EXAMPLES))
  return model


@pytest.fixture(scope="module")
def main_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("lm")
  proc = run("main.py", *TINY, "--out", str(out))
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc, out, json.loads((out / "results.json").read_text())


@pytest.fixture(scope="module")
def lm_main():
  """``examples/main.py`` and the ``lm`` modules it uses, as modules."""
  sys.path.insert(0, str(EXAMPLES))
  try:
    import main
    from lm import report
    from lm import train
    from lm import tuned
  finally:
    sys.path.remove(str(EXAMPLES))
  return main, train, tuned, report


def test_main_prints_the_table(main_run, lm_main):
  proc, _, results = main_run
  _, _, tuned, report = lm_main
  lines = proc.stdout.splitlines()
  header = next(i for i, line in enumerate(lines) if line.startswith("method"))
  columns = ("lr", "val loss (nats)", "sent per worker", "90% busy at", "opt. state", "wall time")
  for column in columns:
    assert column in lines[header]
  methods = [r["method"] for r in results["results"]]
  assert methods == list(METHODS)
  busy = tuned.bandwidth_table()["gbit_for"]
  for offset, method in enumerate(methods, start=2):
    row = lines[header + offset]
    assert row.split()[:2] == [method, "0.01"]  # --lr 1e-2: every method at it.
    assert f"  {report.gbit(busy[method]['0.9'])}  " in row
  assert results["learning_rates"] == dict.fromkeys(methods, 1e-2)
  assert "unigram entropy of the text" in proc.stdout
  assert "90% busy at: the bandwidth per worker" in proc.stdout
  assert "lordo" in proc.stderr  # The tqdm progress bars.


def test_main_writes_json_and_plots(main_run):
  _, out, results = main_run
  for name in ("val_loss_vs_step.png", "val_loss_vs_bytes.png"):
    assert (out / name).read_bytes()[:8] == PNG_MAGIC
  assert results["data"]["name"] == "pydoc_data.topics"
  assert results["data"]["bytes"] > 400_000
  for r in results["results"]:
    assert len(r["train_loss"]) == STEPS
    assert [e["step"] for e in r["evals"]] == list(range(0, STEPS + 1, 16))
    assert r["communicated_bytes"] == r["evals"][-1]["bytes"] > 0
    assert r["state_bytes"]["total"] > 0
    assert r["wall_time_s"] > 0


def test_lordo_learns_below_unigram_entropy(main_run):
  _, _, results = main_run
  entropy = results["data"]["unigram_entropy_nats"]
  assert 3.0 < entropy < 3.5  # English bytes: about 4.7 bits.
  lordo = next(r for r in results["results"] if r["method"] == "lordo")
  assert lordo["evals"][0]["val_loss"] == pytest.approx(math.log(256), abs=0.1)
  assert lordo["final_val_loss"] < entropy - 0.2
  for r in results["results"]:
    assert math.isfinite(r["final_val_loss"])
    assert r["final_val_loss"] < r["evals"][0]["val_loss"]


def test_bytes_match_the_communication_formula(main_run, lm_model):
  """MATH.md §7, float32 payloads, for this model's matrices."""
  _, _, results = main_run
  config = lm_model.PRESETS["tiny"]
  shapes = lm_model.param_shapes(config)
  n = lm_model.num_params(shapes)
  low_rank = [shape for _, shape in lm_model.low_rank_shapes(config)]
  n_low_rank = sum(p * q for p, q in low_rank)
  moments = sum(2 * RANK * min(p, q) for p, q in low_rank)
  syncs = STEPS // SYNC_EVERY
  expected = {
    "ddp": STEPS * n,
    "low_rank_ddp": STEPS * n,  # communicate="full": the gradient every step.
    "diloco": syncs * n,  # The pseudo-gradient; DiLoCo keeps its moments local.
    # The first gradient of the low-rank matrices (the first basis), then per sync
    # the pseudo-gradient, the r x q low-rank moments and the full-rank Adam moments.
    "lordo": n_low_rank + syncs * (n + moments + 2 * (n - n_low_rank)),
  }
  by_method = {r["method"]: r for r in results["results"]}
  for method, elements in expected.items():
    if method in by_method:
      assert by_method[method]["communicated_bytes"] == 4 * elements, method
  assert by_method["ddp"]["communicated_bytes"] > 3 * by_method["lordo"]["communicated_bytes"]


def test_metrics_from_the_optimizer_state(main_run):
  _, _, results = main_run
  lordo = next(r for r in results["results"] if r["method"] == "lordo")
  last = lordo["evals"][-1]
  assert last["rounds"] == STEPS // SYNC_EVERY
  assert last["error_norm"] is None  # Error feedback is off by default.
  similarities = [e["projection_similarity"] for e in lordo["evals"][2:]]
  assert all(0.0 < s <= 1.0 + 1e-6 for s in similarities)
  ddp = next(r for r in results["results"] if r["method"] == "ddp")
  assert ddp["evals"][-1]["projection_similarity"] is None
  assert ddp["evals"][-1]["rounds"] == STEPS


def test_each_method_at_its_tuned_learning_rate(lm_main):
  """Without --lr each method trains at the best rate of the quality study's sweep, on
  the study's settings (the main command's defaults); --lr sets one for all."""
  main, train, tuned, _ = lm_main
  study = json.loads((ROOT / "benchmarks" / "results" / "quality.json").read_text())
  best = study["best_lr"]
  assert tuned.TUNED_LEARNING_RATES == {m: best[m] for m in tuned.TUNED_LEARNING_RATES}
  args = main.parse_args([])
  assert args.lr is None and args.methods is None
  assert main.resolve_methods(None, train.optimizers) == list(train.optimizers.DEFAULT_METHODS)
  settings = study["study"]
  assert (args.preset, args.steps, args.batch, args.sync_every, args.warmup) == (
    settings["preset"], settings["steps"], settings["batch_size"], settings["sync_every"],
    settings["warmup_steps"],
  )  # fmt: skip
  config = main.make_config(args, settings["rank"], train)
  for method, lr in tuned.TUNED_LEARNING_RATES.items():
    assert main.learning_rate_config(config, None, method, tuned).learning_rate == lr
    assert main.learning_rate_config(config, 3e-3, method, tuned).learning_rate == 3e-3


def test_main_help_documents_every_option(lm_main):
  proc = run("main.py", "--help", timeout=60)
  assert proc.returncode == 0
  help_text = " ".join(proc.stdout.split())
  for method, lr in lm_main[2].TUNED_LEARNING_RATES.items():
    assert f"{method} {lr:g}" in help_text
  for option in (
    "--methods", "--workers", "--rank", "--sync-every", "--steps", "--seed", "--preset",
    "--lr", "--batch", "--out", "--text", "--devices", "--param-dtype", "--checkpoint-dir",
    "--checkpoint-every", "--resume", "--stop-after", "--warm-start-steps",
    "--warm-start-method", "--warm-start-moments", "--option", "--fsdp", "--offload",
  ):  # fmt: skip
    assert option in proc.stdout


BAD_INPUTS = {
  "missing_text": (["--text", "{tmp}/no_such_file.txt"], "no such file"),
  "short_text": (["--text", "{tmp}/short.txt"], "shorter than one batch"),
  "workers_not_dividing": (["--workers", "3"], "does not divide the 8"),
  "too_many_workers": (["--workers", "16"], "more than the 8"),
  "rank_too_large": (["--preset", "tiny", "--rank", "32"], "not smaller than the model"),
  "unknown_method": (["--methods", "lordo,adam"], "not available"),
  "resume_without_directory": (["--resume"], "--resume needs --checkpoint-dir"),
  "stop_without_directory": (["--stop-after", "5"], "--stop-after needs --checkpoint-dir"),
  "warm_start_too_long": (["--warm-start-steps", "256"], "not between 0 and --steps 256"),
  "option_not_key_value": (["--option", "lordo.omega"], "not METHOD.KEY=VALUE"),
  "option_of_untrained_method": (
    ["--methods", "lordo", "--option", "ddp.b1=0.95"],
    "ddp is not trained",
  ),
  "resume_without_checkpoint": (
    ["--resume", "--checkpoint-dir", "{tmp}/no_checkpoints"],
    "--resume: no checkpoint of lordo",
  ),
}


def test_bad_input_fails_before_training_with_one_line(tmp_path, monkeypatch, capsys, lm_main):
  """Each bad input through ``main.main`` in this process (its exit status, its stdout
  and stderr); the first also as a user runs it, in a process of its own."""
  (tmp_path / "short.txt").write_text("Too short to train on.\n")
  monkeypatch.chdir(tmp_path)
  argvs = {name: [a.format(tmp=tmp_path) for a in args] for name, (args, _) in BAD_INPUTS.items()}
  first = next(iter(argvs))
  proc = subprocess.run(
    [sys.executable, str(EXAMPLES / "main.py"), *argvs[first]],
    capture_output=True,
    text=True,
    timeout=120,
    env=env(),
    cwd=tmp_path,
  )
  ran = [(first, proc.returncode, proc.stdout, proc.stderr)]
  for name, argv in argvs.items():
    capsys.readouterr()
    ran.append((name, lm_main[0].main(argv), *capsys.readouterr()))
  for name, code, stdout, stderr in ran:
    lines = stderr_lib.error_lines(stderr)
    assert code != 0, name
    assert len(lines) == 1, (name, stderr)
    assert BAD_INPUTS[name][1] in lines[0], (name, lines[0])
    assert re.search(r"use|give|choose", lines[0]), (name, lines[0])  # What to change.
    assert "method" not in stdout and not (tmp_path / "runs").exists(), name


def test_pure_optax_example():
  proc = run("pure_optax.py", "--steps", "48", timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  single = re.search(r"1 worker : loss ([\d.]+) -> ([\d.]+) .*, 0 bytes", proc.stdout)
  assert single and float(single[2]) < 0.5 * float(single[1])
  multi = re.search(r"mean loss ([\d.]+) -> ([\d.]+) .* agree to ([\d.e+-]+)", proc.stdout)
  assert multi and float(multi[2]) < 0.5 * float(multi[1]) and float(multi[3]) < 1e-5
  ratio = re.search(r"\(([\d.]+)x more\)", proc.stdout)
  assert ratio and float(ratio[1]) > 1


def test_linen_pmap_example():
  proc = run("linen_pmap.py", "--steps", "64", "--sync-every", "8", timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  accuracies = [float(a) for a in re.findall(r"test accuracy ([\d.]+)", proc.stdout)]
  assert accuracies and accuracies[-1] > 0.5  # 10 classes: chance is 0.1.
  sent = [int(b) for b in re.findall(r"sent (\d+) bytes", proc.stdout)]
  assert sent == sorted(sent) and sent[-1] > 0
  spread = re.search(r"spread across workers: ([\d.e+-]+)", proc.stdout)
  assert spread and float(spread[1]) < 1e-5


def test_a_worker_averages_its_gradient_over_its_devices(lm_model):
  """2 workers x 4 devices: each worker's step uses the mean gradient of its batch."""
  import jax
  import numpy as np
  import optax
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  sys.path.insert(0, str(EXAMPLES))
  try:
    from lm import train
  finally:
    sys.path.remove(str(EXAMPLES))
  config = lm_model.PRESETS["tiny"]
  apply, params = lm_model.init(config, 0)
  tx = optax.sgd(1.0)  # New params = params - gradient.
  mesh = train.make_mesh(2)
  assert dict(mesh.shape) == {train.AXIS: 2, train.DATA_AXIS: 4}
  state = train.stack(tx.init(params), 2)
  step = train.make_step(apply, tx, mesh, jax.tree.map(lambda _: P(train.AXIS), state))
  batch = np.random.default_rng(0).integers(0, 256, (2, 8, config.seq_len + 1)).astype(np.int32)
  workers = NamedSharding(mesh, P(train.AXIS))
  new, _, loss = step(
    jax.device_put(train.stack(params, 2), workers),
    jax.device_put(state, workers),
    jax.device_put(batch, NamedSharding(mesh, P(train.AXIS, train.DATA_AXIS))),
  )
  jax.block_until_ready((new, loss))
  for m in range(2):
    value, grads = jax.value_and_grad(lm_model.loss_fn, argnums=1)(apply, params, batch[m])
    np.testing.assert_allclose(np.asarray(loss)[m], value, rtol=1e-5)
    expected = jax.tree.map(lambda p, g: p - g, params, grads)
    got = jax.tree.map(lambda x, m=m: np.asarray(x)[m], new)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), got, expected)
