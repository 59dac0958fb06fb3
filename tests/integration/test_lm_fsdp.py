"""The LM job with ``--fsdp N`` and ``--offload``: sharded workers, anchors in host memory.

LoRDO on the tiny LM, 4 workers x 2-way FSDP on the 8 simulated devices, with its
anchor offloaded, trained through ``examples/main.py`` (in this process): its mid-round
checkpoint, resumed by a ``train`` call (which rebuilds the mesh, the placement and the
jitted step, and restores the sharded, offloaded checkpoint), must end bit-identical to
the run that never stopped, its state still split over ``fsdp`` and its anchor still in
``pinned_host`` memory; the same checkpoint resumed unsharded and without offload must
continue the same run; and the sharded run must give the ``--fsdp 1`` run's result to
float rounding. Likewise with a message in flight (``--overlap``). Then the refusals of
layouts that cannot work, and the command line.
"""

import dataclasses
import pathlib

import jax
import numpy as np
import pytest

import lordo_jax
from lordo_jax import checkpoint
from tests.helpers import lm_example
from tests.helpers import stderr as stderr_lib
from tests.helpers.lm_example import PRESET
from tests.helpers.lm_example import main
from tests.helpers.lm_example import model
from tests.helpers.lm_example import report
from tests.helpers.lm_example import train

# Host-offloaded state: without the compilation cache (tests/conftest.py).
pytestmark = [pytest.mark.timeout(240, method="thread"), pytest.mark.no_compilation_cache]

ROOT = pathlib.Path(__file__).resolve().parents[2]

M, F, N, K, STOP = 4, 2, 12, 4, 6  # workers, FSDP ways, steps, sync_every; a mid-round stop
assert STOP % K
CONFIG = lm_example.short_run(M, N, K, eval_every=4, fsdp=F, offload=True)


@pytest.fixture(scope="module")
def dataset():
  return lm_example.dataset(M)


def run(config, directory, dataset, **changes):
  config = dataclasses.replace(config, checkpoint_dir=str(directory), **changes)
  return train.train("lordo", config, PRESET, dataset, progress=False)


@pytest.fixture(scope="module")
def runs(dataset, tmp_path_factory):
  """The sharded, offloaded run straight through ``examples/main.py`` (in this process),
  saving at STOP too; its checkpoint of STOP resumed as it was and unsharded without
  offload (as if it had stopped there); and the --fsdp 1 run."""
  root = tmp_path_factory.mktemp("fsdp")
  argv = [*lm_example.main_args(CONFIG), "--methods", "lordo", "--out", str(root / "out")]
  argv += ["--checkpoint-dir", str(root / "cli"), "--checkpoint-every", str(STOP)]
  stdout, written, (straight,) = lm_example.run_main(argv)
  for name in ("resumed", "relaid"):
    lm_example.copy_checkpoint(root / "cli" / "lordo", root / name, STOP)
  return {
    "straight": straight,
    "stdout": stdout,
    "written": written,
    "root": root,
    "resumed": run(CONFIG, root / "resumed", dataset, resume=True),
    "relaid": run(CONFIG, root / "relaid", dataset, resume=True, fsdp=1, offload=False),
    "unsharded": run(CONFIG, root / "unsharded", dataset, fsdp=1, offload=False),
  }


def placed_targets(config):
  """Fresh params and state placed as ``train`` places them: the restore's targets."""
  tx = train.make_optimizer("lordo", config)
  _, params = model.init(PRESET, config.seed)
  state = train.stack(tx.init(params), M)
  params = train.stack(params, M)
  mesh = train.make_mesh(M, config.fsdp)
  params = jax.device_put(params, train.param_shardings(mesh, params, config.fsdp))
  shardings = lordo_jax.state_sharding(tx, params, worker_axis=train.AXIS)
  return params, jax.device_put(state, shardings), shardings


def final_trees(directory, config=CONFIG):
  """The run's params and state at step N, restored onto the loop's own placement."""
  params, state, _ = placed_targets(config)
  return checkpoint.restore(directory, N, params, state)


def assert_bit_identical(actual, expected):
  assert jax.tree.structure(actual) == jax.tree.structure(expected)
  paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(expected)]
  for path, a, e in zip(paths, jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(e), err_msg=path, strict=True)


def test_resumed_sharded_offloaded_run_is_bit_identical(runs):
  straight, resumed = runs["straight"], runs["resumed"]
  assert resumed.resumed_from == STOP
  params, state = final_trees(runs["root"] / "cli" / "lordo")
  resumed_params, resumed_state = final_trees(runs["root"] / "resumed")
  assert_bit_identical(resumed_params, params)
  assert_bit_identical(resumed_state, state)  # The ledger, bases, moments, anchor too.
  assert resumed.train_loss == straight.train_loss
  assert resumed.bytes_sent == straight.bytes_sent
  assert [(e["step"], e["val_loss"]) for e in resumed.evals] == [
    (e["step"], e["val_loss"]) for e in straight.evals
  ]
  assert resumed.communicated_bytes == straight.communicated_bytes > 0
  assert straight.train_loss[-1] < straight.train_loss[0] - 0.3  # It trained.


def test_after_resume_the_state_is_split_over_fsdp_with_the_anchor_on_the_host(runs):
  params, state, shardings = placed_targets(CONFIG)
  resumed_params, resumed_state = final_trees(runs["root"] / "resumed")
  for restored, placed in ((resumed_params, params), (resumed_state, shardings)):
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(placed), strict=True):
      want = getattr(want, "sharding", want)
      assert got.sharding.is_equivalent_to(want, got.ndim), (got.sharding, want)
      assert got.sharding.memory_kind == want.memory_kind
  up = resumed_state.anchor["blocks"][0]["mlp"]["up"]["kernel"]  # 32 x 128 per worker
  assert tuple(up.sharding.spec) == (train.AXIS, train.FSDP_AXIS, None)  # The kept side.
  assert up.sharding.memory_kind == "pinned_host"
  assert {a.sharding.memory_kind for a in jax.tree.leaves(resumed_state.anchor)} == {"pinned_host"}
  split = [x for x in jax.tree.leaves(resumed_state) if train.FSDP_AXIS in x.sharding.spec]
  assert len(split) > len(jax.tree.leaves(resumed_state.anchor))  # Moments too, not only it.
  # The live state at the end of the resumed call: anchor in host memory, and a
  # device holds half of the worker's device-resident state, but for its counters.
  sizes, unsharded = runs["resumed"].state_bytes, runs["unsharded"].state_bytes
  assert sizes["host"] == sizes["offloadable"] == unsharded["offloadable"] > 0
  assert sizes["total"] == unsharded["total"] == unsharded["device"]
  assert unsharded["host"] == 0 and unsharded["per_device"] == unsharded["device"]
  assert sizes["device"] / 2 <= sizes["per_device"] < 0.6 * sizes["device"]


def test_two_way_fsdp_gives_the_unsharded_result(runs):
  sharded, unsharded = runs["straight"], runs["unsharded"]
  np.testing.assert_allclose(sharded.final_val_loss, unsharded.final_val_loss, rtol=1e-5)
  np.testing.assert_allclose(sharded.train_loss, unsharded.train_loss, rtol=1e-5)
  assert sharded.bytes_sent == unsharded.bytes_sent  # Ledgers equal.
  params, _ = final_trees(runs["root"] / "cli" / "lordo")
  reference, _ = final_trees(
    runs["root"] / "unsharded", dataclasses.replace(CONFIG, fsdp=1, offload=False)
  )
  for name, a, b in zip(params, params.values(), reference.values(), strict=True):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
      x, y = np.asarray(x), np.asarray(y)
      np.testing.assert_allclose(x, y, rtol=0, atol=1e-5 * np.max(np.abs(y)), err_msg=name)


def test_a_checkpoint_resumes_in_another_layout(runs):
  """Resumed with --fsdp 1 and no offload: placed anew, the same run to float rounding."""
  straight, relaid = runs["straight"], runs["relaid"]
  assert relaid.resumed_from == STOP
  assert relaid.state_bytes["host"] == 0 and relaid.state_bytes["per_device"] > 0
  np.testing.assert_allclose(relaid.train_loss, straight.train_loss, rtol=1e-5)
  np.testing.assert_allclose(relaid.final_val_loss, straight.final_val_loss, rtol=1e-5)
  assert relaid.bytes_sent == straight.bytes_sent


def test_layouts_that_cannot_work_are_refused():
  with pytest.raises(ValueError, match=r"--workers 4 x --fsdp 3 does not divide the 8 devices"):
    train.make_mesh(4, 3)
  for method in ("ddp", "low_rank_ddp"):
    config = dataclasses.replace(CONFIG, offload=True)
    with pytest.raises(ValueError, match=rf"--offload: {method} has no anchor.*lordo,"):
      train.make_optimizer(method, config)
  assert {"lordo", "diloco", "local_adam", "desloc"} <= set(train.offload_methods())
  assert not {"ddp", "low_rank_ddp"} & set(train.offload_methods())
  bad = {
    ("--workers", "4", "--fsdp", "3"): "--fsdp 3 does not divide each worker's 2 devices",
    ("--workers", "2", "--fsdp", "2", "--batch", "3"): "over each worker's 2 data-parallel",
    ("--fsdp", "0"): "--fsdp 0 is not allowed",
  }
  for argv, expected in bad.items():
    with pytest.raises(main.UsageError, match=expected):
      main.check_args(main.parse_args(list(argv)))
  main.check_args(main.parse_args(["--workers", "2", "--fsdp", "4", "--batch", "1"]))
  main.check_offload(False, ["lordo", "ddp"], train.offload_methods())
  with pytest.raises(main.UsageError, match=r"--offload: ddp,low_rank_ddp have no anchor"):
    main.check_offload(True, ["lordo", "ddp", "low_rank_ddp"], train.offload_methods())


def test_main_trains_sharded_and_offloaded_and_refuses_offload_without_an_anchor(
  runs, tmp_path, capsys
):
  """The sharded, offloaded run through ``examples/main.py`` (the fixture's straight
  run: its banner, results.json and table); the refusal, which stops before training
  (exit status, its one line)."""
  refused = [*lm_example.main_args(dataclasses.replace(CONFIG, fsdp=1, offload=False))]
  refused += ["--out", str(tmp_path / "no"), "--methods", "lordo,ddp", "--offload"]
  capsys.readouterr()
  assert main.main(refused) == 2
  lines = stderr_lib.error_lines(capsys.readouterr().err)
  assert len(lines) == 1, lines
  assert "--offload: ddp has no anchor" in lines[0] and "among lordo," in lines[0]
  assert not (tmp_path / "no").exists()
  stdout, results = runs["stdout"], runs["written"]
  assert "4 worker(s) on 8 devices, each sharded 2 ways (FSDP), anchors in host memory" in stdout
  assert results["train_config"]["fsdp"] == 2 and results["train_config"]["offload"]
  (result,) = results["results"]
  host = result["state_bytes"]["host"]
  assert host == result["state_bytes"]["offloadable"] > 0
  lines = stdout.splitlines()
  header = next(i for i, line in enumerate(lines) if line.startswith("method"))
  row = lines[header + 2]
  assert row.startswith("lordo ") and f"  {report.human_bytes(host)}  " in row
  assert len(result["train_loss"]) == N and result["final_val_loss"] < 5.0


def test_a_message_in_flight_resumes_bit_identically_sharded_and_offloaded(dataset, tmp_path):
  """--overlap 3 (K = 4): the checkpoint of step 6 holds the message frozen at step 4,
  two chunks of three sent; resumed from it, the run ends where the run that never
  stopped does, its message in flight in host memory and split over fsdp. The steps
  that send a chunk run their own program (the static phase)."""
  config = dataclasses.replace(CONFIG, overlap=3, merge="streaming")
  straight = run(config, tmp_path / "straight", dataset, checkpoint_every=STOP)
  lm_example.copy_checkpoint(tmp_path / "straight", tmp_path / "resumed", STOP)
  resumed = run(config, tmp_path / "resumed", dataset, resume=True)
  assert resumed.resumed_from == STOP
  params, state = final_trees(tmp_path / "straight", config)
  resumed_params, resumed_state = final_trees(tmp_path / "resumed", config)
  assert_bit_identical(resumed_params, params)
  assert_bit_identical(resumed_state, state)
  assert resumed.train_loss == straight.train_loss
  assert resumed.bytes_sent == straight.bytes_sent
  for buffer in jax.tree.leaves(resumed_state.in_flight[:2]):
    assert buffer.sharding.memory_kind == "pinned_host"
  assert straight.train_loss[-1] < straight.train_loss[0] - 0.3  # It trained.


def test_the_phase_of_streamed_fragments_counts_them():
  """With ``fragments`` among the options the steps' phase is computed for them: the
  steps that send are the tau after each fragment's sync."""
  streamed = dataclasses.replace(
    CONFIG, sync_every=4, overlap=1, optimizer_options=(("fragments", 2),)
  )
  assert train.fragments_of("lordo", streamed) == 2
  assert train.fragments_of("lordo", CONFIG) == 1
  phases = [train.step_phase(t, streamed, 1, 2)[1] for t in range(1, 9)]
  # Fragment 0 syncs at t = 2 (mod 4), fragment 1 at t = 4: the steps after each send.
  assert phases == ["local", "local", "send", "local", "send", "local", "send", "local"]


def test_overlap_options_that_cannot_work_are_refused():
  with pytest.raises(ValueError, match=r"--overlap: ddp has no round to overlap"):
    train.make_optimizer("ddp", dataclasses.replace(CONFIG, offload=False, overlap="round"))
  assert "desloc" not in train.overlap_methods() and "lordo" in train.overlap_methods()
  bad = {
    ("--merge", "eager"): "--merge eager needs --overlap",
    ("--overlap", "16"): "--overlap 16 is not between 1 and --sync-every 16 - 1",
  }
  for argv, expected in bad.items():
    with pytest.raises(main.UsageError, match=expected):
      args = main.parse_args(list(argv))
      main.check_overlap(args, ["lordo"], train.overlap_methods())
  args = main.parse_args(["--overlap", "round"])
  with pytest.raises(main.UsageError, match=r"--overlap: ddp has no round to overlap"):
    main.check_overlap(args, ["lordo", "ddp"], train.overlap_methods())
