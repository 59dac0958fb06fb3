"""The LM job's warm start: a method started after step S of a low-rank DDP checkpoint.

``docs/FIDELITY.md`` (point 1): the paper's LoRDO runs continue the low-rank DDP run's
checkpoint at a third of the run, its optimizer state included. Checked here, on the
tiny model with 4 simulated workers:

* (``lordo_jax.warm_start_state``, which :func:`warm_start.transplant` calls, is
  tested on hand-made states in ``tests/state/test_warm_start_state.py``);
* right after the switch, the LoRDO state built by the training loop holds exactly the
  checkpoint's bases, moments and error buffers, the same on every worker, its anchor
  is the checkpoint's parameters, and the data position is the checkpoint's;
* a LoRDO run warm-started at S (by the main command) reports the source run's
  validation loss at S, and its first training loss is the source's at S + 1 (same
  parameters, same batch);
* low-rank DDP warm-started from its own checkpoint continues that run bit for bit:
  nothing of its state (moments, counters, the schedule's count) is lost;
* a checkpoint of another rank is refused with a message naming the setting;
* the main command's ``--warm-start-steps`` trains the shared phase (with the
  ``--option warm_start.KEY=VALUE`` given) into ``OUT/warm_start/<method>`` and starts
  every method from it.
"""

import dataclasses
import importlib
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import lordo_jax
from tests.helpers import lm_example
from tests.helpers.lm_example import PRESET
from tests.helpers.lm_example import checkpoints
from tests.helpers.lm_example import model
from tests.helpers.lm_example import train
from tests.helpers.lm_example import warm_start

tuned = importlib.import_module("lm.tuned")  # The package lm_example imported.

pytestmark = pytest.mark.timeout(300, method="thread")

M, N, S, K = 4, 16, 8, 4  # workers, steps, warm-start step, sync_every
DDP_OPTIONS = (("error_feedback", True), ("transport", "rotate"))  # FIDELITY.md point 22
# At the tuned rate of both methods (examples/lm/tuned.py), the main command's when no
# --lr is given: its runs are this module's, their programs compiled once.
CONFIG = dataclasses.replace(lm_example.short_run(M, N, K, eval_every=S), learning_rate=1.25e-2)


def assert_trees_equal(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y), strict=True)


def matrices(state):
  """Every low-rank matrix's state in ``state``, in tree order: per matrix, read from the
  stacks each :class:`lordo_jax.GroupedMoments` keeps per shape group."""
  is_grouped = lambda x: isinstance(x, lordo_jax.GroupedMoments)  # noqa: E731
  grouped = [x for x in jax.tree.leaves(state, is_leaf=is_grouped) if is_grouped(x)]
  return [matrix for moments in grouped for matrix in moments.listed()]


def test_transplant_names_the_settings_to_match():
  params = {"w": jnp.ones((16, 8)), "b": jnp.zeros(8)}
  source = lordo_jax.low_rank_ddp(1e-2, rank=2, refresh_every=4).init(params)
  target = lordo_jax.lordo(1e-2, rank=3, sync_every=4).init(params)
  with pytest.raises(warm_start.WarmStartError, match="--warm-start-from: .*same rank.*--rank"):
    warm_start.transplant(source, target)


# --- the training loop --------------------------------------------------------------


@pytest.fixture(scope="module")
def dataset():
  return lm_example.dataset(M)


@pytest.fixture(scope="module")
def source_run(dataset, tmp_path_factory):
  """The low-rank DDP run of N steps, checkpointed at S: (its directory, its result)."""
  directory = tmp_path_factory.mktemp("warm") / "low_rank_ddp"
  config = dataclasses.replace(
    CONFIG, checkpoint_dir=str(directory), checkpoint_every=S, optimizer_options=DDP_OPTIONS
  )
  return directory, train.train("low_rank_ddp", config, PRESET, dataset, progress=False)


def warm_config(source_run, **changes):
  return dataclasses.replace(
    CONFIG, warm_start_from=str(source_run[0]), warm_start_step=S, **changes
  )


@pytest.mark.parametrize("moments", lordo_jax.state._warm_start.MOMENTS)
def test_lordo_state_right_after_the_switch(source_run, dataset, moments):
  config = warm_config(
    source_run, warm_start_moments=moments, optimizer_options=(("error_feedback", True),)
  )
  config, saved = train.resolve_warm_start("lordo", config, PRESET, dataset)
  _, params = model.init(PRESET, config.seed)
  sharding = NamedSharding(train.make_mesh(M), P(train.AXIS))
  stacked = jax.device_put(train.stack(params, M), sharding)
  tx = train.make_optimizer("lordo", config)
  new_params, state, position = train.warm_started(config, saved, tx, stacked, sharding)
  # The checkpoint, restored independently with low-rank DDP's own template.
  source_tx = train.make_optimizer(
    "low_rank_ddp", dataclasses.replace(CONFIG, optimizer_options=DDP_OPTIONS)
  )
  like = jax.device_put(train.stack(source_tx.init(params), M), sharding)
  ddp_params, ddp_state, metadata = checkpoints.restore(source_run[0], S, stacked, like)

  assert_trees_equal(new_params, ddp_params)
  assert_trees_equal(state.anchor, ddp_params)  # LoRDO's anchor: the params at the switch
  assert position == metadata["data_position"]
  for o, n in zip(*map(lordo_jax.state._warm_start.inner_states, (ddp_state, state)), strict=True):
    np.testing.assert_array_equal(n.count, o.count, strict=True)
    assert np.all(np.asarray(n.count) == S)
  ddp_m, lordo_m = matrices(ddp_state), matrices(state)
  assert len(lordo_m) == len(model.low_rank_shapes(PRESET)) == len(ddp_m)
  for o, n in zip(ddp_m, lordo_m, strict=True):
    assert_trees_equal(n.basis, o.basis)
    np.testing.assert_array_equal(n.error, o.error, strict=True)
    assert np.any(np.asarray(o.error)) and np.any(np.asarray(o.mu))  # not a vacuous check
    if moments == "keep":
      np.testing.assert_array_equal(n.mu, o.mu, strict=True)
      np.testing.assert_array_equal(n.nu, o.nu, strict=True)
    else:
      assert not np.any(np.asarray(n.mu)) and not np.any(np.asarray(n.nu))
    for leaf in jax.tree.leaves((n.basis, n.mu, n.nu, n.error)):
      leaf = np.asarray(leaf)  # the same subspace and moments on every worker
      np.testing.assert_array_equal(leaf, np.broadcast_to(leaf[:1], leaf.shape))
  assert int(np.asarray(state.count)[0]) == 0 and lordo_jax.communicated_bytes(state) == 0


@pytest.fixture(scope="module")
def main_run(source_run, tmp_path_factory):
  """The main command (``main.main``, in this process) on this module's settings, at
  the methods' tuned rate, LoRDO warm-started after S steps of low-rank DDP: its
  arguments, its standard output, its results.json and its LoRDO result."""
  assert CONFIG.learning_rate == tuned.TUNED_LEARNING_RATES["low_rank_ddp"]
  assert CONFIG.learning_rate == tuned.TUNED_LEARNING_RATES["lordo"]
  out = tmp_path_factory.mktemp("main")
  argv = lm_example.main_args(CONFIG)
  at = argv.index("--lr")
  args = [*argv[:at], *argv[at + 2 :], "--methods", "lordo", "--warm-start-steps", str(S)]
  args += ["--option", "warm_start.error_feedback=true", "--option", "warm_start.transport=rotate"]
  args += ["--option", "lordo.error_feedback=true", "--option", "lordo.omega=0.97"]
  args += ["--out", str(out)]
  stdout, saved, (result,) = lm_example.run_main(args)
  return args, stdout, saved, result


def test_lordo_warm_started_continues_from_the_switch(source_run, main_run):
  """LoRDO (omega 0.97, error feedback) warm-started at S by the main command, whose
  shared phase is the source run's first S steps (checked below)."""
  straight, result = source_run[1], main_run[3]
  assert result.method == "lordo" and result.warm_start_step == S and result.resumed_from == 0
  assert len(result.train_loss) == N - S
  assert result.evals[0]["step"] == S and result.evals[-1]["step"] == N
  at_s = next(e for e in straight.evals if e["step"] == S)
  assert result.evals[0]["val_loss"] == at_s["val_loss"]  # the checkpoint's parameters
  # Same parameters, same next batch: the first loss is the source run's at step S + 1.
  np.testing.assert_allclose(result.train_loss[0], straight.train_loss[S], rtol=1e-6)
  assert np.all(np.isfinite(result.train_loss))
  assert result.final_val_loss < at_s["val_loss"]  # it goes on learning
  assert result.communicated_bytes > 0  # LoRDO's own ledger, from zero


def test_low_rank_ddp_warm_started_from_itself_continues_bit_for_bit(source_run, dataset):
  straight = source_run[1]
  config = warm_config(source_run, optimizer_options=DDP_OPTIONS)
  result = train.train("low_rank_ddp", config, PRESET, dataset, progress=False)
  assert result.train_loss == straight.train_loss[S:]
  assert result.final_val_loss == straight.final_val_loss
  # The ledger restarts at the switch: the shared phase's bytes are the source run's.
  sent = np.asarray(straight.bytes_sent)
  assert result.bytes_sent == list(sent[S:] - sent[S - 1])


def test_warm_start_refuses_another_rank(source_run, dataset):
  other = warm_config(source_run, rank=2)
  with pytest.raises(warm_start.WarmStartError, match="rank 4, this run 2"):
    train.train("lordo", other, PRESET, dataset, progress=False)


def test_main_command_starts_every_method_from_the_shared_phase(source_run, main_run, capsys):
  """The command end to end (the fixture's run): its shared phase is the source run's
  first S steps; its refusal to reuse the shared phase under other settings, which
  stops before training."""
  args, stdout, saved, _ = main_run
  out = pathlib.Path(args[args.index("--out") + 1])
  assert f"warm start: low_rank_ddp steps 1-{S}" in stdout
  warm = saved["warm_start"]
  assert warm["method"] == "low_rank_ddp" and warm["evals"][-1]["step"] == S
  assert warm["train_loss"] == source_run[1].train_loss[:S]  # The same run, to step S.
  assert checkpoints.latest_step(out / "warm_start" / "low_rank_ddp") == S
  assert [r["method"] for r in saved["results"]] == ["lordo"]
  for result in saved["results"]:
    assert result["evals"][0]["step"] == S
    assert result["evals"][0]["val_loss"] == warm["final_val_loss"]
    assert result["evals"][-1]["step"] == N
  # The shared phase kept there is reused only under the same settings.
  capsys.readouterr()
  assert lm_example.main.main([*args, "--lr", "0.02"]) == 2
  # The shared phase ran at low_rank_ddp's tuned rate, 0.0125 (examples/lm/tuned.py).
  assert "use --lr 0.0125" in capsys.readouterr().err.strip().splitlines()[-1]
