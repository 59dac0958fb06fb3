"""The LM job's elastic runs: resumed on another number of workers, workers away for rounds.

A LoRDO run saved on 4 workers at a boundary continues on 2 (and on 8): its first steps'
curves are the saved run's, and a stop and resume on 2 workers after the remap is the
resumed run that never stopped (the data generators restarted at the remap carry on).
Mid-round the job refuses, in one line naming ``--resume-mid-round``, restarts the
round with it, or finishes it on the saved workers first. With ``absent`` a worker away
for rounds 2-3 holds, after each of their boundaries, exactly what the others hold, and
is counted out of exactly those syncs.
"""

import dataclasses
import json
import shutil

import jax
import numpy as np
import pytest
from test_lm_resume import main_py  # examples/main.py: the tiny preset, 16 steps, K = 8

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

M, N, K = 4, 24, 8  # workers saved on, steps, sync_every
CONFIG = lm_example.short_run(M, N, K, eval_every=8)


def run(config, workers: int, **changes):
  config = dataclasses.replace(config, num_workers=workers, **changes)
  return train.train("lordo", config, PRESET, lm_example.dataset(workers), progress=False)


def saved_trees(directory, step: int, workers: int):
  """The params and state of the run's checkpoint at ``step``, on the host."""
  tx = train.make_optimizer("lordo", CONFIG)
  _, params = model.init(PRESET, CONFIG.seed)
  like = train.stack(params, workers), train.stack(tx.init(params), workers)
  return jax.device_get(checkpoint.restore(directory, step, *like))


@pytest.fixture(scope="module")
def saved_at_boundary(tmp_path_factory):
  """The run on 4 workers stopped after step 8, the end of round 1."""
  directory = tmp_path_factory.mktemp("elastic")
  config = dataclasses.replace(CONFIG, checkpoint_dir=str(directory))
  return config, run(config, M, stop_after=K)


def copied(config, tmp_path):
  """``config`` with a copy of its checkpoint directory (each resume writes its own)."""
  shutil.copytree(config.checkpoint_dir, tmp_path / "ckpt")
  return dataclasses.replace(config, checkpoint_dir=str(tmp_path / "ckpt"))


@pytest.mark.parametrize("workers", [2, 8])
def test_a_run_saved_on_4_workers_continues_on_another_number(saved_at_boundary, workers, tmp_path):
  config, saved = saved_at_boundary
  config = copied(config, tmp_path)
  resumed = run(config, workers, resume=True)
  assert resumed.resumed_from == K
  assert resumed.train_loss[:K] == saved.train_loss  # the saved run's curve, carried
  assert len(resumed.train_loss) == N
  assert resumed.evals[: len(saved.evals)] == saved.evals
  assert np.isfinite(resumed.train_loss).all()
  assert resumed.evals[-1]["val_loss"] < saved.evals[-1]["val_loss"] - 0.2  # it trains on
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
  saved_at_boundary, tmp_path
):
  config, _ = saved_at_boundary
  straight_config = copied(config, tmp_path / "a")
  straight = run(straight_config, 2, resume=True)
  stopped_config = copied(config, tmp_path / "b")
  run(stopped_config, 2, resume=True, stop_after=12)  # mid-round, on the new workers
  resumed = run(stopped_config, 2, resume=True)
  assert resumed.resumed_from == 12
  assert_same_run(resumed, stopped_config, straight, straight_config)


def test_mid_round_is_refused_in_one_line_unless_the_round_restarts(tmp_path):
  config = dataclasses.replace(CONFIG, checkpoint_dir=str(tmp_path))
  run(config, M, stop_after=12)  # mid-round 2
  with pytest.raises(checkpoints.ResumeError) as error:
    run(config, 2, resume=True)
  message = str(error.value)
  assert "\n" not in message
  assert "saved mid-round (update 12)" in message
  assert message.endswith("In this job: --resume-mid-round restart, or --workers 4.")
  resumed = run(config, 2, resume=True, resume_mid_round="restart")
  assert resumed.resumed_from == 12 and len(resumed.train_loss) == N
  assert np.isfinite(resumed.train_loss).all()


def test_mid_round_the_round_can_finish_on_its_own_workers_first(tmp_path):
  """The other choice: resume on the saved 4 to the round's end, save, move to 2. It is
  the run saved at that boundary without a stop, moved to 2, bit for bit."""
  finished = dataclasses.replace(CONFIG, checkpoint_dir=str(tmp_path / "finished"))
  run(finished, M, stop_after=12)  # mid-round 2
  run(finished, M, resume=True, stop_after=2 * K)  # finish round 2 on the 4 workers
  moved = run(finished, 2, resume=True)
  straight = dataclasses.replace(CONFIG, checkpoint_dir=str(tmp_path / "straight"))
  run(straight, M, stop_after=2 * K)
  reference = run(straight, 2, resume=True)
  assert moved.resumed_from == reference.resumed_from == 2 * K
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


def test_main_resumes_on_fewer_workers_and_refuses_a_worker_it_does_not_have(tmp_path):
  ckpt = str(tmp_path / "ckpt")
  first = lm_example_main(
    "--workers", "4", "--checkpoint-dir", ckpt, "--stop-after", "8", out=tmp_path
  )
  assert first.wait(timeout=120) == 0, first.stderr.read()[-3000:]
  resumed = lm_example_main("--workers", "2", "--checkpoint-dir", ckpt, "--resume", out=tmp_path)
  _, stderr = resumed.communicate(timeout=120)
  assert resumed.returncode == 0, stderr[-3000:]
  (result,) = json.loads((tmp_path / "results.json").read_text())["results"]
  assert result["resumed_from"] == 8 and len(result["train_loss"]) == 16
  bad = lm_example_main("--workers", "4", "--absent", "4:1-2", out=tmp_path / "x")
  _, stderr = bad.communicate(timeout=120)
  lines = stderr_lib.error_lines(stderr)
  assert bad.returncode == 2 and len(lines) == 1, stderr
  assert "--absent 4:1-2: give a worker in 0..3" in lines[0]


def lm_example_main(*args, out):
  """LoRDO through ``examples/main.py``, 4 windows a worker (2 workers: 4 devices each)."""
  return main_py("--methods", "lordo", "--batch", "4", *args, out=out)


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
