"""The LM job's elastic runs: resumed on another number of workers, workers away for rounds.

A LoRDO run saved on 4 workers at a boundary continues on 2 (and on 8), the first stop
and the resume on 2 through ``examples/main.py`` in this process: its first steps'
curves are the saved run's, and a stop and resume on 2 workers after the remap is the
resumed run that never stopped (the data generators restarted at the remap carry on).
Mid-round the job refuses, in one line naming ``--resume-mid-round``, restarts the
round with it, or finishes it on the saved workers first. With ``absent`` a worker away
for rounds 2-3 holds, after each of their boundaries, exactly what the others hold, and
is counted out of exactly those syncs.
"""

import dataclasses
import shutil

import jax
import numpy as np
import pytest

import lordo_jax
from lordo_jax import checkpoint
from tests.helpers import lm_example
from tests.helpers import readme_examples
from tests.helpers import stderr as stderr_lib
from tests.helpers.lm_example import PRESET
from tests.helpers.lm_example import checkpoints
from tests.helpers.lm_example import model
from tests.helpers.lm_example import train

pytestmark = pytest.mark.timeout(300, method="thread")

M, N, K = 4, 16, 4  # workers saved on, steps, sync_every
B, MID = 2 * K, 2 * K - K // 2  # the boundary saved at (end of round 2); a stop mid-round 2
CONFIG = lm_example.short_run(M, N, K, eval_every=K)


def run(config, workers: int, **changes):
  config = dataclasses.replace(config, num_workers=workers, **changes)
  return train.train("lordo", config, PRESET, lm_example.dataset(workers), progress=False)


def saved_trees(directory, step: int, workers: int):
  """The params and state of the run's checkpoint at ``step``, on the host."""
  tx = train.make_optimizer("lordo", CONFIG)
  _, params = model.init(PRESET, CONFIG.seed)
  like = train.stack(params, workers), train.stack(tx.init(params), workers)
  return jax.device_get(checkpoint.restore(directory, step, *like))


def main_py(config, *args: str, out) -> tuple[str, list]:
  """LoRDO of ``config`` through ``examples/main.py`` in this process (``run_main``)."""
  argv = [*lm_example.main_args(config), "--methods", "lordo", "--out", str(out), *args]
  _, _, results = lm_example.run_main(argv)
  return results


@pytest.fixture(scope="module")
def saved_at_boundary(tmp_path_factory):
  """The run on 4 workers stopped after step B, the end of round 2, through
  ``examples/main.py``; it saved at step MID (mid-round) too."""
  root = tmp_path_factory.mktemp("boundary")
  args = ("--checkpoint-dir", str(root), "--stop-after", str(B), "--checkpoint-every", str(MID))
  (result,) = main_py(CONFIG, *args, out=root)
  return dataclasses.replace(CONFIG, checkpoint_dir=str(root / "lordo")), result


@pytest.fixture(scope="module")
def saved_mid_round(saved_at_boundary, tmp_path_factory):
  """The run on 4 workers as if stopped after step MID, mid-round 2: its checkpoint of
  step MID alone (``copy_checkpoint``), its config."""
  directory = tmp_path_factory.mktemp("mid_round") / "ckpt"
  lm_example.copy_checkpoint(saved_at_boundary[0].checkpoint_dir, directory, MID)
  return dataclasses.replace(CONFIG, checkpoint_dir=str(directory))


@pytest.fixture(scope="module")
def moved_to_2(saved_at_boundary, tmp_path_factory):
  """The run saved at the boundary resumed on 2 workers to the end (its own copy),
  through ``examples/main.py``."""
  root = tmp_path_factory.mktemp("moved_to_2")
  shutil.copytree(saved_at_boundary[0].checkpoint_dir, root / "lordo")
  on_2 = dataclasses.replace(CONFIG, num_workers=2)
  (result,) = main_py(on_2, "--checkpoint-dir", str(root), "--resume", out=root)
  return dataclasses.replace(CONFIG, checkpoint_dir=str(root / "lordo")), result


def copied(config, tmp_path):
  """``config`` with a copy of its checkpoint directory (each resume writes its own)."""
  shutil.copytree(config.checkpoint_dir, tmp_path / "ckpt")
  return dataclasses.replace(config, checkpoint_dir=str(tmp_path / "ckpt"))


@pytest.mark.parametrize("workers", [2, 8])
def test_a_run_saved_on_4_workers_continues_on_another_number(
  saved_at_boundary, moved_to_2, workers, tmp_path
):
  config, saved = saved_at_boundary
  if workers == 2:
    config, resumed = moved_to_2
  else:
    config = copied(config, tmp_path)
    resumed = run(config, workers, resume=True)
  assert resumed.resumed_from == B
  assert resumed.train_loss[:B] == saved.train_loss  # the saved run's curve, carried
  assert len(resumed.train_loss) == N
  assert resumed.evals[: len(saved.evals)] == saved.evals
  assert np.isfinite(resumed.train_loss).all()
  assert resumed.evals[-1]["val_loss"] < saved.evals[-1]["val_loss"] - 0.1  # it trains on
  assert resumed.communicated_bytes > saved.communicated_bytes
  # Its checkpoints hold the new number of workers, every one on the synchronised state
  # (the parameters up to the rounding of params + (anchor - params)).
  params, state = saved_trees(config.checkpoint_dir, N, workers)
  assert all(leaf.shape[0] == workers for leaf in jax.tree.leaves((params, state)))
  assert_workers_agree(round_of(state).anchor, round_of(state).inner_state)
  for leaf in jax.tree.leaves(params):
    np.testing.assert_allclose(leaf, np.broadcast_to(leaf[:1], leaf.shape), rtol=1e-6, atol=1e-9)
  assert int(lordo_jax.step_count(state)[0]) == N


def test_after_the_remap_a_stop_and_resume_is_the_run_that_never_stopped(
  saved_at_boundary, moved_to_2, tmp_path
):
  straight_config, straight = moved_to_2
  stopped_config = copied(saved_at_boundary[0], tmp_path)
  run(stopped_config, 2, resume=True, stop_after=B + K // 2)  # mid-round, on the new workers
  resumed = run(stopped_config, 2, resume=True)
  assert resumed.resumed_from == B + K // 2
  assert_same_run(resumed, stopped_config, straight, straight_config)


def test_mid_round_is_refused_in_one_line_unless_the_round_restarts(saved_mid_round, tmp_path):
  config = copied(saved_mid_round, tmp_path)
  with pytest.raises(checkpoints.ResumeError) as error:
    run(config, 2, resume=True)
  message = str(error.value)
  assert "\n" not in message
  assert f"saved mid-round (update {MID})" in message
  assert message.endswith("In this job: --resume-mid-round restart, or --workers 4.")
  resumed = run(config, 2, resume=True, resume_mid_round="restart")
  assert resumed.resumed_from == MID and len(resumed.train_loss) == N
  assert np.isfinite(resumed.train_loss).all()


def test_mid_round_the_round_can_finish_on_its_own_workers_first(
  saved_mid_round, moved_to_2, tmp_path
):
  """The other choice: resume on the saved 4 to the round's end, save, move to 2. It is
  the run saved at that boundary without a stop, moved to 2, bit for bit."""
  finished = copied(saved_mid_round, tmp_path)
  run(finished, M, resume=True, stop_after=B)  # finish round 2 on the 4 workers
  moved = run(finished, 2, resume=True)
  straight, reference = moved_to_2
  assert moved.resumed_from == reference.resumed_from == B
  assert_same_run(moved, finished, reference, straight)


def test_a_worker_away_for_rounds_2_and_3_holds_the_synchronised_state(tmp_path):
  config = dataclasses.replace(
    CONFIG, steps=4 * K, absent=((3, 2, 3),), checkpoint_dir=str(tmp_path), checkpoint_every=K
  )
  result = run(config, M)
  assert np.isfinite(result.train_loss).all()
  losses = [e["val_loss"] for e in result.evals]
  assert losses == sorted(losses, reverse=True)  # decreasing, round after round
  for step, excluded in ((3 * K, 2), (4 * K, 2)):  # out of the syncs of rounds 2 and 3
    params, state = jax.device_get(checkpoint.restore(tmp_path, step, *saved_like(config)))
    state = round_of(state)
    assert_workers_agree(state.anchor, state.inner_state)
    for leaf in jax.tree.leaves(params):
      np.testing.assert_allclose(leaf, np.broadcast_to(leaf[:1], leaf.shape), rtol=1e-6, atol=1e-9)
    assert state.faults.excluded.tolist() == [excluded] * M


def assert_same_run(result, config, expected, expected_config):
  """The same curve, and the same trees at step N on 2 workers, bit for bit."""
  assert result.train_loss == expected.train_loss
  for a, b in zip(
    jax.tree.leaves(saved_trees(config.checkpoint_dir, N, 2)),
    jax.tree.leaves(saved_trees(expected_config.checkpoint_dir, N, 2)),
    strict=True,
  ):
    np.testing.assert_array_equal(a, b)


def assert_workers_agree(*trees):
  """Every leaf the same on every worker, bit for bit."""
  for leaf in jax.tree.leaves(trees):
    np.testing.assert_array_equal(leaf, np.broadcast_to(leaf[:1], leaf.shape))


def round_of(state) -> lordo_jax.SynchronizeState:
  is_round = lambda x: isinstance(x, lordo_jax.SynchronizeState)  # noqa: E731
  (found,) = [x for x in jax.tree.leaves(state, is_leaf=is_round) if is_round(x)]
  return found


def saved_like(config):
  tx = train.make_optimizer("lordo", config)
  _, params = model.init(PRESET, config.seed)
  return train.stack(params, M), train.stack(tx.init(params), M)


def test_main_resumes_on_fewer_workers_and_refuses_a_worker_it_does_not_have(
  moved_to_2, tmp_path, capsys
):
  """The stop on 4 workers and the resume on 2 through ``examples/main.py`` (the
  fixtures' runs); the refusal, which stops before training (exit status, one line)."""
  _, result = moved_to_2
  assert result.resumed_from == B and len(result.train_loss) == N
  capsys.readouterr()
  bad = ["--methods", "lordo", "--workers", "4", "--absent", "4:1-2", "--out", str(tmp_path / "x")]
  assert lm_example.main.main(bad) == 2
  lines = stderr_lib.error_lines(capsys.readouterr().err)
  assert len(lines) == 1 and "--absent 4:1-2: give a worker in 0..3" in lines[0], lines
  assert not (tmp_path / "x").exists()


def test_the_checkpoints_guide_gives_the_jobs_real_options():
  """The preemptible recipe's two commands parse and pass the job's checks."""
  page = readme_examples.section(
    "A preemptible cluster: save every few rounds, resume on what is left",
    page="docs/guides/checkpoints.md",
  )
  commands = [
    line.split("examples/main.py", 1)[1].split()
    for line in page.splitlines()
    if line.startswith("python examples/main.py")
  ]
  assert len(commands) == 2 and "--resume" in commands[1]
  for argv in commands:
    lm_example.main.check_args(lm_example.main.parse_args(argv))
