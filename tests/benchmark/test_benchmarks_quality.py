"""The studies that train the LM, in quick mode, end to end.

``benchmarks/run_all.py --quick --only quality,time_to_target`` trains, in a subprocess,
every variant of the quality study on the tiny LM (a few steps, one seed), then the time
to target, and writes their JSON, markdown and plots; the checks here recompute from
those files what the studies claim: every method's bytes against the communication
formulas of MATH.md §7, the learning-rate choice, the claim numbers, every simulated
time. A second run on the same cache must train nothing.

The studies that build on the quality study (extensions, the paper's variants, its
protocol, the long horizon) then run their own ``main`` in this process on its output,
with training faked (the ``dependents`` fixture: a run the quality study cached is read
back, any other is the cached run of its method with a loss of its own; the protocol's
commands are read by the LM job's own parser, not trained), writing their JSON, markdown
and plots; the checks here read from those files each study's use of the quality study's
own runs and rates, the runs it asked for, and its numbers recomputed. What only their
training shows (the extension rows' bytes, the paper's variants changing a run that
still learns) is checked on real steps of their optimizers in
``tests/benchmark/test_benchmarks_quality_promises.py``; the warm start the protocol's
paper arm asks for, in ``tests/integration/test_lm_warm_start.py``.
"""

import dataclasses
import hashlib
import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # benchmarks.*, imported where a test reads the studies' code.
BENCHMARKS = ROOT / "benchmarks"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FLOAT32 = 4

# Limits that only end a hang: the fixture, when it also trained the four studies it now
# fakes, took about 5 minutes alone on 2 cores and 11 under a load of 20 (2026-11-27), so a
# busy host never meets them.
pytestmark = pytest.mark.timeout(3600)
STUDIES = ("quality", "time_to_target")  # Trained, in the subprocess.
DEPENDENT = ("extensions", "fidelity", "paper_protocol", "long_horizon")  # Faked, in process.


def run(*args: str, timeout: float) -> str:
  """The stdout of ``python *args``; on a timeout its whole process group is killed."""
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
  proc = subprocess.Popen(
    [sys.executable, *args],
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    env=env,
    cwd=ROOT,
    start_new_session=True,  # run_all.py starts the studies as its own children.
  )
  try:
    stdout, stderr = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    raise
  assert proc.returncode == 0, stdout[-2000:] + stderr[-3000:]
  return stdout


@pytest.fixture(scope="module")
def out(tmp_path_factory):
  out = tmp_path_factory.mktemp("benchmarks")
  run(
    str(BENCHMARKS / "run_all.py"), "--quick", "--only", ",".join(STUDIES),
    "--out", str(out), timeout=3000,
  )  # fmt: skip
  return out


@pytest.fixture(scope="module")
def quality(out):
  return json.loads((out / "quality.json").read_text())


@pytest.fixture(scope="module")
def rows(quality):
  return {r["variant"]: r for r in quality["methods"]}


@pytest.fixture(scope="module")
def lm_model():
  sys.path.insert(0, str(ROOT / "examples"))
  try:
    from lm import model
  finally:
    sys.path.remove(str(ROOT / "examples"))
  return model


def offset(key: dict) -> float:
  """A made-up run's own loss offset, 1e-8 to 1e-2, from its settings: no two alike."""
  digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()
  return (1 + int(digest[:8], 16) % 10**6) / 1e8


@pytest.fixture(scope="module")
def dependents(out, quality):
  """Each study of :data:`DEPENDENT`, ``main(["--quick", "--out", OUT])`` in this process
  on the quality study's output, with training faked. ``lm_runs.run`` reads a run the
  quality study cached; any other is made up from the quality study's run of its method
  (same seed) with a loss of its own (:func:`offset`), and not cached. The protocol's
  ``examples/main.py`` commands are read by that command's own parser and checks (each
  ``--option`` names a method it trains) and answered with a ``results.json`` of made-up
  numbers. Returns what the studies asked for: ``read`` (cached files), ``faked`` (file
  name -> (RunSpec, record)), ``commands`` (the arm's folder -> (parsed arguments, its
  results.json))."""
  from benchmarks.harness import lm_runs
  from benchmarks.paper import fidelity
  from benchmarks.paper import long_horizon
  from benchmarks.paper import paper_protocol
  from benchmarks.quality import extensions
  from tests.helpers.lm_example import main as lm_main

  methods = {r["variant"]: r for r in quality["methods"]}
  asked = {"read": [], "faked": {}, "commands": {}}

  def fake_run(spec, cache, fresh=False, log=print):
    path = cache / spec.file_name()
    if path.exists() and not fresh:
      asked["read"].append(path.name)
      return json.loads(path.read_text())
    base = methods[spec.variant.method]
    record = json.loads((cache / base["run_files"][base["seeds"].index(spec.seed)]).read_text())
    record["spec"] = spec.key()
    record["result"]["final_val_loss"] += offset(spec.key())
    asked["faked"][spec.file_name()] = (spec, record)
    return record

  def fake_main(line, cwd, check):
    assert line[:2] == [sys.executable, "examples/main.py"] and check
    args = lm_main.parse_args(line[2:])
    lm_main.check_args(args)
    trained = args.methods.split(",")
    lm_main.check_option_methods(args, trained)
    folder = pathlib.Path(args.out)
    made_up = lambda what: offset({"arm": folder.name, "what": what})  # noqa: E731
    saved = {
      "command": " ".join(line[1:]),  # sys.argv, as main.py writes it
      "results": [
        {
          "method": m,
          "final_val_loss": methods[m]["mean"] + made_up(m),
          "communicated_bytes": round(1e9 * made_up(f"{m} bytes")),
        }
        for m in trained
      ],
      "warm_start": {"final_val_loss": 5 + made_up("warm")} if args.warm_start_steps else None,
    }
    asked["commands"][folder.name] = (args, saved)
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps(saved))

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(lm_runs, "run", fake_run)
    patch.setattr(lm_runs, "simulate_devices", lambda count=lm_runs.DEVICES: None)  # Started.
    patch.setattr(paper_protocol, "subprocess", types.SimpleNamespace(run=fake_main))
    for study in (extensions, fidelity, paper_protocol, long_horizon):
      assert study.main(["--quick", "--out", str(out)]) == 0
  return asked


def test_every_output_is_written(out):
  for name in ("quality_loss_vs_bytes.png", "quality_similarity.png", "quality_rank_batch.png",
               "time_to_target.png"):  # fmt: skip
    assert (out / name).read_bytes()[:8] == PNG_MAGIC, name
  markdown = (out / "quality.md").read_text()
  for heading in ("| method |", "| rank |", "Claims of the paper"):
    assert heading in markdown
  assert "| method | step reached |" in (out / "time_to_target.md").read_text()
  assert set(json.loads((out / "run_all.json").read_text())["wall_time_s"]) == set(STUDIES)


def test_every_dependent_study_writes_its_report(out, dependents):
  for name in DEPENDENT:
    assert json.loads((out / f"{name}.json").read_text())
    assert (out / f"{name}.md").read_text().startswith("#"), name
  for name in ("extensions", "long_horizon"):
    assert (out / f"{name}.png").read_bytes()[:8] == PNG_MAGIC


def test_every_method_ran_every_seed_and_learned(quality, rows):
  study = quality["study"]
  assert list(rows) == [
    "ddp", "low_rank_ddp", "low_rank_ddp_projected", "lordo", "lordo_local_projection",
    "lordo_global_projection_only", "diloco", "desloc", "local_adam",
  ]  # fmt: skip
  for row in rows.values():
    assert row["seeds"] == study["seeds"]
    assert row["bytes_same_every_seed"]
    assert all(math.isfinite(x) and x < math.log(256) for x in row["final_val_loss"])
    assert row["mean"] == pytest.approx(sum(row["final_val_loss"]) / len(row["seeds"]))
    assert len(row["run_files"]) == len(study["seeds"])


def test_bytes_equal_the_formulas_of_spec_section_7(quality, rows, lm_model):
  """Payload elements per worker, float32, from the model's shapes alone."""
  study = quality["study"]
  config = lm_model.PRESETS[study["preset"]]
  n = lm_model.num_params(lm_model.param_shapes(config))
  low_rank = [shape for _, shape in lm_model.low_rank_shapes(config)]
  matrices = sum(p * q for p, q in low_rank)  # On the low-rank path.
  full_rank = n - matrices  # Embeddings, head, norms: AdamW, moments averaged by LoRDO.
  coordinates = sum(study["rank"] * min(p, q) for p, q in low_rank)  # r x q per matrix.
  steps, k, t = study["steps"], study["sync_every"], study["refresh_every"]
  syncs = steps // k
  expected = {
    "ddp": steps * n,
    "low_rank_ddp": steps * n,
    # Coordinates (and the full-rank leaves) every step; the matrices' full gradient
    # at the refresh steps 1, T + 1, ...
    "low_rank_ddp_projected": steps * (full_rank + coordinates) + math.ceil(steps / t) * matrices,
    # The first gradient of the matrices, then per sync the pseudo-gradient, both
    # low-rank moments and both moments of the full-rank leaves.
    "lordo": matrices + syncs * (n + 2 * coordinates + 2 * full_rank),
    "lordo_global_projection_only": matrices + syncs * (n + 2 * coordinates + 2 * full_rank),
    "lordo_local_projection": syncs * n,
    "diloco": syncs * n,
    "desloc": n * (syncs + steps // (3 * k) + steps // (6 * k)),
    "local_adam": syncs * 3 * n,
  }
  assert {name: row["bytes"] for name, row in rows.items()} == {
    name: FLOAT32 * elements for name, elements in expected.items()
  }


def test_learning_rates_are_tuned_the_same_way(quality, rows):
  rates = [f"{x:g}" for x in quality["study"]["learning_rates"]]
  for name, losses in quality["sweep"].items():
    assert list(losses) == rates
    assert f"{quality['best_lr'][name]:g}" == min(rates, key=lambda x: losses[x])
    assert rows[name]["final_val_loss"][0] == losses[f"{quality['best_lr'][name]:g}"]
  assert "low_rank_ddp_projected" not in quality["sweep"]
  projected, full = rows["low_rank_ddp_projected"], rows["low_rank_ddp"]
  assert projected["learning_rate"] == full["learning_rate"]
  # Same iterates, other messages: the losses agree to float rounding.
  assert projected["mean"] == pytest.approx(full["mean"], abs=1e-3)
  assert projected["bytes"] < full["bytes"]


def test_each_method_trains_at_the_rate_of_its_lowest_loss(monkeypatch):
  """The study's choice of rates on made-up losses, without training: each tuned method's
  best rate is that of its lowest final loss, a diverged run (NaN) the worst whatever its
  place; a method with another's iterates takes that one's rate; every seed runs at it;
  the rank x batch sweep runs its variants at each of their best rates, every cell and
  seed, and its table pairs them by cell and seed. (The quick study sweeps one rate and
  its rank x batch grid is its own cell, so only this test sees a choice made.)"""
  from benchmarks.harness import lm_runs
  from benchmarks.harness import quality_summary
  from benchmarks.harness import variants
  from benchmarks.quality import quality as study

  rates = (1e-3, 3e-3, 1e-2)
  tuned = [v.name for v in variants.QUALITY if v.same_iterates_as is None]
  best = {name: rates[1 + k % 2] for k, name in enumerate(tuned)}  # never the first
  trained = []

  def run(spec, cache, fresh=False):
    trained.append(spec)
    name, lr = spec.variant.name, spec.learning_rate
    loss = math.nan if lr == rates[0] else 1.0 if lr == best.get(name) else 2.0
    if name == "lordo":  # Ahead of the others by its rank and seed over 1000.
      loss -= (spec.rank + spec.seed) / 1000
    return {"spec": spec, "result": {"final_val_loss": loss}}

  monkeypatch.setattr(lm_runs, "run", run)
  settings = dataclasses.replace(
    study.QUICK, learning_rates=rates, seeds=(0, 1), ranks=(4, 8), batch_sizes=(8,)
  )
  found = study.run_study(settings, pathlib.Path("unused"))
  expected = {v.name: best[v.same_iterates_as or v.name] for v in variants.QUALITY}
  assert found["best_lr"] == expected
  assert {name: list(runs) for name, runs in found["sweep"].items()} == {
    name: list(rates) for name in tuned
  }
  for name, records in found["seeds"].items():
    assert [r["spec"].seed for r in records] == [0, 1]
    assert {r["spec"].learning_rate for r in records} == {expected[name]}
  batch_rates = sorted({expected[name] for name in variants.RANK_BATCH})
  assert len(batch_rates) == 2  # Each variant also at the other's rate.
  assert set(found["rank_batch"]) == set(variants.RANK_BATCH)
  for cells in found["rank_batch"].values():
    assert list(cells) == [(4, 8), (8, 8)]
    for (rank, batch), by_rate in cells.items():
      assert list(by_rate) == batch_rates
      for lr, records in by_rate.items():
        specs = [r["spec"] for r in records]
        assert [(s.rank, s.batch_size, s.learning_rate, s.seed) for s in specs] == [
          (rank, batch, lr, 0), (rank, batch, lr, 1)
        ]  # fmt: skip
  assert len(trained) == len(tuned) * len(rates) + 2 * len(variants.QUALITY) + sum(
    2 * 2 * len(batch_rates) for _ in variants.RANK_BATCH
  )
  table = quality_summary.rank_batch_rows(found["rank_batch"])
  assert [(row["rank"], row["batch_size"]) for row in table] == [(4, 8), (8, 8)]
  for row in table:
    assert row["learning_rate"] == {name: expected[name] for name in variants.RANK_BATCH}
    assert row["advantage"] == pytest.approx([(row["rank"] + seed) / 1000 for seed in (0, 1)])


def test_claims_follow_from_the_tables(quality, rows):
  claims = quality["claims"]
  lordo, full = rows["lordo"], rows["low_rank_ddp"]
  a = claims["a"]["numbers"]
  assert a["loss_gap"] == pytest.approx((lordo["mean"] - full["mean"]) / full["mean"])
  assert a["bytes_ratio_vs_full"] == pytest.approx(full["bytes"] / lordo["bytes"])
  assert a["bytes_ratio_vs_projected"] == pytest.approx(
    rows["low_rank_ddp_projected"]["bytes"] / lordo["bytes"]
  )
  assert claims["a"]["holds"] == (a["loss_gap"] <= 0.02 and a["bytes_ratio_vs_full"] >= 10)
  local = rows["lordo_local_projection"]["final_val_loss"]
  beaten = all(x > y for x, y in zip(local, lordo["final_val_loss"], strict=True))
  assert claims["b"]["holds"] == beaten
  frozen = quality["similarity"]["lordo_global_projection_only"]["projection_similarity"]
  assert frozen and min(frozen) > 0.99  # Successive bases span the same subspace.
  assert claims["c"]["numbers"]["lowest_similarity_without_full_rank"] == min(frozen)
  for row in quality["rank_batch"]:
    advantage = [b - a for a, b in zip(row["lordo"], row["lordo_local_projection"], strict=True)]
    assert row["advantage"] == pytest.approx(advantage)
    for name, by_rate in row["mean_by_learning_rate"].items():
      assert by_rate[f"{row['learning_rate'][name]:g}"] == min(by_rate.values())
      assert min(by_rate.values()) == pytest.approx(sum(row[name]) / len(row[name]))
  cells = {(r["rank"], r["batch_size"]) for r in quality["rank_batch"]}
  study = quality["study"]
  assert cells == {(r, b) for r in study["ranks"] for b in study["batch_sizes"]}


def simulated_seconds(result: dict, method: dict, i: int, gbit: float) -> float:
  """The cost model of time_to_target.py, written out again."""
  m = result["workers"]
  ring = 2 * (m - 1) / m * 8 * method["bytes"][i] / (gbit * 1e9)
  return method["compute_s"][i] + ring + result["alpha_s"] * method["all_reduces"][i]


def test_time_to_target_recomputes_from_the_json(out, quality, rows):
  result = json.loads((out / "time_to_target.json").read_text())
  methods = {x["variant"]: x for x in result["methods"]}
  finals = {name: x["val_loss_mean"][-1] for name, x in methods.items()}
  targets = [t["val_loss"] for t in result["targets"]]
  assert set(targets) == {max(finals.values()), max(finals["ddp"], finals["lordo"])}
  for name, method in methods.items():
    assert method["val_loss_mean"][-1] == pytest.approx(rows[name]["mean"])
    assert method["bytes"][-1] == rows[name]["bytes"]
    period, cost = method["period"], method["step_cost_s"]
    assert all(c <= m for c, m in zip(cost, method["step_median_s"], strict=True))
    for step, compute in zip(method["steps"], method["compute_s"], strict=True):
      expected = result["compute_scale"] * sum(cost[s % period] for s in range(1, step + 1))
      assert compute == pytest.approx(expected)
  for table in result["targets"]:
    ddp = next(r for r in table["methods"] if r["variant"] == "ddp")
    for r in table["methods"]:
      method = methods[r["variant"]]
      reached = [i for i, x in enumerate(method["val_loss_mean"]) if x <= table["val_loss"]]
      if table["val_loss"] == max(finals.values()) or r["variant"] in ("ddp", "lordo"):
        assert reached
      if not reached:
        assert r["step"] is None and r["time_s"] is None
        continue
      i = reached[0]
      assert r["step"] == method["steps"][i]
      for gbit in result["bandwidths_gbit"]:
        assert r["time_s"][str(gbit)] == pytest.approx(simulated_seconds(result, method, i, gbit))
      if r["variant"] == "ddp":
        continue

      # The break-even bandwidth: on its one side the method is first, on the other DDP.
      def faster(g, method=method, i=i, j=ddp["index"]):
        ours = simulated_seconds(result, method, i, g)
        return ours < simulated_seconds(result, methods["ddp"], j, g)

      when, gbit = r["vs_ddp"]["when"], r["vs_ddp"]["gbit"]
      if when in ("always", "never"):
        assert all(faster(g) == (when == "always") for g in (1e-3, 1, 10, 100, 1e3))
      else:
        assert faster(gbit / 2) == (when == "below") != faster(2 * gbit)


def test_a_second_run_reads_every_run_from_the_cache(out, quality, monkeypatch):
  """The quick study again on the same cache, in this process, with training turned into
  a failure: every run it asks for is read back (the cache's names are stable), and the
  summary of what it reads is the JSON the first run wrote (but for its date and time)."""
  from benchmarks.harness import lm_runs
  from benchmarks.harness import quality_summary
  from benchmarks.harness import studies
  from benchmarks.quality import quality as study

  def train(*args, **kwargs):
    raise AssertionError("a run the first pass trained was trained again")

  monkeypatch.setattr(lm_runs.train, "train", train)
  summary = quality_summary.summarize(
    study.QUICK, study.run_study(study.QUICK, studies.runs(out, "lm"))
  )
  when = ("provenance", "command", "study_wall_time_s")
  assert json.loads(json.dumps({k: v for k, v in summary.items() if k not in when})) == {
    k: v for k, v in quality.items() if k not in when
  }


def test_run_all_reads_what_a_study_offers_from_its_source(tmp_path, monkeypatch):
  """run_all gives a study ``--quick`` and ``--out`` where its command line offers them,
  read from the script without starting it (its own ``add_argument`` calls, or
  ``studies.parse_args``, which adds both); in quick mode a study without them is
  skipped, so that it never writes over the committed full results. (The fixture runs
  the real studies this way.)"""
  from benchmarks import run_all

  scripts = {
    "own_out": 'import argparse\nargparse.ArgumentParser().add_argument("--out")\n',
    "shared": "from benchmarks.harness import studies\nstudies.parse_args(__doc__, 'q')\n",
    "none": "print('no options')\n",
  }
  for name, source in scripts.items():
    (tmp_path / "topic").mkdir(exist_ok=True)
    (tmp_path / "topic" / f"{name}.py").write_text(source)
    monkeypatch.setitem(run_all.STUDIES, name, "topic")
  monkeypatch.setattr(run_all, "HERE", tmp_path)

  def command(name, quick, default_out):
    return run_all.command(name, quick, tmp_path, default_out=default_out)

  assert run_all.offered(tmp_path / "topic" / "own_out.py") == {"--out"}
  assert command("shared", True, False)[1:] == [
    str(tmp_path / "topic" / "shared.py"), "--quick", "--out", str(tmp_path)
  ]  # fmt: skip
  assert command("own_out", True, True) is None and command("none", True, True) is None
  assert command("own_out", False, False)[2:] == ["--out", str(tmp_path)]
  assert command("none", False, True)[1:] == [str(tmp_path / "topic" / "none.py")]
  assert command("none", False, False) is None  # It would write to its own place.


def test_extensions_run_each_row_at_its_rate_and_read_the_quality_runs(
  quality, rows, out, dependents
):
  """Each quick row is the run of its variant (its options) at the best rate of the
  method it extends; the rows the quality study has are its own runs, read from its
  cache; every number of a row is its run's; the headline is recomputed from the JSON.
  (What each row sends, on real steps: ``test_benchmarks_quality_promises.py``.)"""
  from benchmarks.quality import extensions

  ext = json.loads((out / "extensions.json").read_text())
  found = {r["variant"]: r for r in ext["rows"]}
  assert list(found) == list(extensions.QUICK_ROWS)
  chosen = {variant.name: (variant, tuned_as) for variant, tuned_as in extensions.ROWS}
  cached = {name: row["run_files"] for name, row in rows.items()}
  for name, row in found.items():
    variant, tuned_as = chosen[name]
    assert row["learning_rate"] == quality["best_lr"][tuned_as]
    (file,) = row["run_files"]
    if name in cached:  # The quality study's own run, read back.
      assert [file] == cached[name] and file in dependents["read"]
      assert row["final_val_loss"] == rows[name]["final_val_loss"]
      assert row["bytes"] == rows[name]["bytes"]
      continue
    spec, record = dependents["faked"][file]
    assert spec.variant == variant and spec.learning_rate == row["learning_rate"]
    assert row["final_val_loss"] == [record["result"]["final_val_loss"]]
    assert row["bytes"] == record["result"]["communicated_bytes"]
    assert row["peak_step_bytes"] == extensions.peak_step_bytes(record)
  assert {"lordo", "low_rank_ddp"} <= set(cached) & set(found)
  headline = ext["headline"]
  ours, reference = found[extensions.HEADLINE], found["low_rank_ddp"]
  assert math.isclose(headline["bytes_ratio"], reference["bytes"] / ours["bytes"])
  gap = (ours["mean"] - reference["mean"]) / reference["mean"]
  assert math.isclose(headline["loss_gap"], gap)
  assert headline["holds"] == (gap <= 0.02 and headline["bytes_ratio"] >= 40)
  assert math.isclose(
    headline["peak_ratio"], reference["peak_step_bytes"] / ours["peak_step_bytes"]
  )


def test_each_paper_variant_is_paired_with_the_quality_study_run(out, quality, rows, dependents):
  """Each quick row runs its change (K, clipping, an option of its method) at the quality
  study's rate, against that study's own run of the method. (That each change changes a
  run that still learns, on real steps: ``test_benchmarks_quality_promises.py``.)"""
  from benchmarks.paper import fidelity as study

  fidelity = json.loads((out / "fidelity.json").read_text())
  assert [r["name"] for r in fidelity["rows"]] == list(study.QUICK_CHANGES)
  assert list(study.QUICK_CHANGES) == ["K=32", "clip 0.5", "QH inside, nu=0.94"]
  changes = {c.name: c for c in study.CHANGES}
  for r in fidelity["rows"]:
    assert r["base_losses"] == rows[r["base"]]["final_val_loss"]  # Read, not retrained.
    assert r["learning_rate"] == quality["best_lr"][r["base"]]
    assert r["effect"] == pytest.approx(
      [a - b for a, b in zip(r["losses"], r["base_losses"], strict=True)]
    )
    assert r["losses"] != r["base_losses"]  # A run of its own.
    (spec,) = [
      spec
      for spec, record in dependents["faked"].values()
      if [record["result"]["final_val_loss"]] == r["losses"]
    ]
    change = changes[r["name"]]
    assert spec.variant.method == r["base"] and spec.learning_rate == r["learning_rate"]
    assert spec.variant.options == change.options and spec.clip_norm == change.clip_norm
    assert spec.sync_every == (change.sync_every or quality["study"]["sync_every"])
  assert "| lordo | K=32 (12) |" in (out / "fidelity.md").read_text()


def test_the_paper_protocol_warm_starts_its_arm_and_pairs_the_seeds(out, dependents):
  """Each arm's command, read by ``examples/main.py``'s own parser: the paper arm starts
  after a shared phase of a third of the run, at a constant rate, clipped; ours does
  not. Its row holds what its results.json holds. (The warm start the command asks for,
  its loss reported and its bytes not counted: ``tests/integration/test_lm_warm_start.py``;
  LoRDO's bytes against low-rank DDP's: the quality study's rows, above.)"""
  protocol = {r["arm"]: r for r in json.loads((out / "paper_protocol.json").read_text())["rows"]}
  assert set(protocol) == {"paper", "ours"}
  commands = dependents["commands"]
  assert set(commands) == {"paper_s0", "ours_s0"}
  for arm, row in protocol.items():
    args, saved = commands[f"{arm}_s0"]
    assert row["command"] == saved["command"]
    results = {r["method"]: r for r in saved["results"]}
    assert set(results) == {"lordo", "low_rank_ddp"}
    for method, result in results.items():
      assert row[method] == [result["final_val_loss"]]
      assert row["bytes"][method] == result["communicated_bytes"]
    gap = [(a - b) / b for a, b in zip(row["lordo"], row["low_rank_ddp"], strict=True)]
    assert row["gap"] == pytest.approx(gap)
  paper, ours = protocol["paper"], protocol["ours"]
  (paper_args, paper_saved), (ours_args, _) = commands["paper_s0"], commands["ours_s0"]
  assert paper_args.warm_start_steps == paper_args.steps // 3 and not ours_args.warm_start_steps
  assert paper_args.schedule == "constant" and ours_args.schedule == "cosine"
  assert paper_args.clip_norm == 0.5 and ours_args.clip_norm is None
  assert paper["warm_start_loss"] == [paper_saved["warm_start"]["final_val_loss"]]
  assert ours["warm_start_loss"] == [None]
  assert "--warm-start-steps" in paper["command"] and "--warm-start" not in ours["command"]


def test_the_long_horizon_gap_reads_the_quality_study_and_its_own_runs(
  out, quality, rows, dependents
):
  result = json.loads((out / "long_horizon.json").read_text())
  (steps,) = result["horizons"]
  assert int(steps) > quality["study"]["steps"]
  found = {r["method"]: r for r in result["horizons"][steps]}
  assert set(found) == {"lordo", "low_rank_ddp"}
  k = quality["study"]["sync_every"]
  gaps = {(g["method"], g["rounds"]): g["gap"] for g in result["gaps"]}
  short = quality["study"]["steps"] // k
  reference = rows["low_rank_ddp"]["mean"]
  assert gaps["lordo", short] == pytest.approx((rows["lordo"]["mean"] - reference) / reference)
  lordo, low_rank = found["lordo"]["mean"], found["low_rank_ddp"]["mean"]
  assert gaps["lordo", int(steps) // k] == pytest.approx((lordo - low_rank) / low_rank)
  for row in found.values():
    assert row["complete"] and row["tuned_lr"] == quality["best_lr"][row["method"]]
    assert row["mean"] == min(sum(x) / len(x) for x in row["seeds"].values())
    ((spec, record),) = [
      (spec, record)
      for spec, record in dependents["faked"].values()
      if spec.steps == int(steps) and spec.variant.name == row["method"]
    ]  # Its own run at the longer horizon, at the quality study's rate.
    assert spec.learning_rate == row["tuned_lr"]
    assert row["seeds"] == {f"{spec.learning_rate:g}": [record["result"]["final_val_loss"]]}
  assert (out / "long_horizon.png").read_bytes()[:8] == PNG_MAGIC
