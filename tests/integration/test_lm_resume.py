"""The LM example's checkpoints: a stopped and resumed run is the run that never stopped.

For DiLoCo, the tiny LM is trained N steps straight, saving after k steps (mid-round)
too; that checkpoint alone, as if the run had stopped there, is resumed through
``examples/main.py`` (in this process) by a call that rebuilds everything (model,
optimizer, mesh, jitted step, data generators) and restores it. (A stop by
``--stop-after`` through ``examples/main.py``, the curve it saves carried on by its
resume, is checked in ``test_lm_elastic.py``.) The final parameters and optimizer states,
read back from each run's last checkpoint, must be bit-identical, and so must the
curves. Then resumes that cannot work (of that checkpoint) stopping with one line that
says what to change. (LoRDO's mid-round stop and resume, bit-identical, its bases,
ledger, moments and anchor included, is checked sharded and offloaded in
``test_lm_fsdp.py``, and after a change of workers in ``test_lm_elastic.py``.)
"""

import dataclasses
import pathlib

import jax
import numpy as np
import pytest

from lordo_jax import checkpoint
from tests.helpers import lm_example
from tests.helpers import stderr as stderr_lib
from tests.helpers.lm_example import PRESET
from tests.helpers.lm_example import checkpoints
from tests.helpers.lm_example import data
from tests.helpers.lm_example import model
from tests.helpers.lm_example import train

pytestmark = pytest.mark.timeout(240, method="thread")

ROOT = pathlib.Path(__file__).resolve().parents[2]

M, N, K, STOP = 4, 24, 8, 12  # workers, steps, sync_every; the stop is mid-round
assert STOP % K
CONFIG = lm_example.short_run(M, N, K, eval_every=8)


@pytest.fixture(scope="module")
def dataset():
  return lm_example.dataset(M)


def final_trees(method: str, directory: pathlib.Path):
  """The params and optimizer state of the run's checkpoint at step N, on the host."""
  tx = train.make_optimizer(method, CONFIG)
  _, params = model.init(PRESET, CONFIG.seed)
  like = train.stack(params, M), train.stack(tx.init(params), M)
  return jax.device_get(checkpoint.restore(directory, N, *like))


def assert_trees_equal(actual, expected):
  """Same structure, and every leaf bit-identical (same dtype, shape and values)."""
  assert jax.tree.structure(actual) == jax.tree.structure(expected)
  paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(expected)]
  for path, a, e in zip(paths, jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(e), err_msg=path, strict=True)


def stop_and_resume(method: str, root: pathlib.Path, dataset) -> dict:
  """``method`` trained N steps straight (``train``), saving at STOP too; its checkpoint
  of STOP alone (``copy_checkpoint``: the run as if stopped after STOP, kept as
  ``stopped``) resumed to N through ``examples/main.py`` (in this process): the
  results."""
  config = dataclasses.replace(CONFIG, checkpoint_dir=str(root / "straight"), checkpoint_every=STOP)
  straight = train.train(method, config, PRESET, dataset, progress=False)
  for copy in (method, "stopped"):
    lm_example.copy_checkpoint(root / "straight", root / copy, STOP)
  argv = [*lm_example.main_args(CONFIG), "--methods", method, "--checkpoint-dir", str(root)]
  _, written, (resumed,) = lm_example.run_main([*argv, "--resume", "--out", str(root)])
  return {"straight": straight, "resumed": resumed, "written": written}


@pytest.fixture(scope="module")
def diloco_runs(dataset, tmp_path_factory):
  return stop_and_resume("diloco", tmp_path_factory.mktemp("diloco"), dataset)


def test_stop_and_resume_is_bit_identical(diloco_runs):
  method, runs = "diloco", diloco_runs
  straight, resumed = runs["straight"], runs["resumed"]
  root = pathlib.Path(runs["written"]["args"]["checkpoint_dir"])
  assert checkpoints.latest_step(root / "stopped") == STOP
  assert resumed.resumed_from == STOP

  params, state = final_trees(method, root / "straight")
  resumed_params, resumed_state = final_trees(method, root / method)
  assert_trees_equal(resumed_params, params)
  assert_trees_equal(resumed_state, state)
  # The curves continue the saved ones, and equal the straight run's.
  assert resumed.train_loss == straight.train_loss
  assert resumed.bytes_sent == straight.bytes_sent
  assert [(e["step"], e["val_loss"]) for e in resumed.evals] == [
    (e["step"], e["val_loss"]) for e in straight.evals
  ]
  assert resumed.communicated_bytes == straight.communicated_bytes > 0
  # And the run trained.
  assert straight.train_loss[-1] < straight.train_loss[0] - 0.5


def test_the_data_position_round_trips(dataset):
  """``Batches.seek(position())`` in a new generator continues the same stream."""
  batches = data.Batches(dataset, seq_len=PRESET.seq_len, batch_size=4, seed=3)
  for _ in range(3):
    batches()
  position = batches.position()
  expected = [batches() for _ in range(2)]
  restarted = data.Batches(dataset, seq_len=PRESET.seq_len, batch_size=4, seed=3)
  restarted.seek(position)
  np.testing.assert_array_equal(np.stack([restarted() for _ in range(2)]), np.stack(expected))
  assert not np.array_equal(expected[0], expected[1])


@pytest.fixture(scope="module")
def stopped_checkpoint(diloco_runs):
  """The DiLoCo run of CONFIG as if stopped after STOP steps: (a copy of) its checkpoint
  of STOP, alone. (Every setting of ``checkpoints.OPTIONS`` is compared whatever the
  method: its rank too.)"""
  return pathlib.Path(diloco_runs["written"]["args"]["checkpoint_dir"]) / "stopped"


RESUME_ERRORS = {
  "another_method": ("lordo", {}, "is a diloco run, not lordo; resume it with --methods diloco"),
  "another_rank": ("diloco", {"rank": 2}, "with --rank 4, this run has --rank 2; use --rank 4"),
  "another_dtype": ("diloco", {"param_dtype": "bfloat16"}, "use --param-dtype float32"),
  "another_seed": ("diloco", {"seed": 1}, "use --seed 0"),
}  # fmt: skip


@pytest.mark.parametrize("case", RESUME_ERRORS)
def test_a_checkpoint_of_other_settings_says_what_to_change(case, stopped_checkpoint, dataset):
  method, changes, expected = RESUME_ERRORS[case]
  config = dataclasses.replace(
    CONFIG, checkpoint_dir=str(stopped_checkpoint), resume=True, **changes
  )
  with pytest.raises(checkpoints.ResumeError) as error:
    train.train(method, config, PRESET, dataset, progress=False)
  message = str(error.value)
  assert "\n" not in message
  assert expected in message
  assert "or another --checkpoint-dir to start afresh" in message


def test_resume_without_a_checkpoint_and_start_over_one(stopped_checkpoint, dataset, tmp_path):
  empty = dataclasses.replace(CONFIG, checkpoint_dir=str(tmp_path / "none"), resume=True)
  with pytest.raises(checkpoints.ResumeError, match=r"^--resume: no checkpoint in .*none; train"):
    train.train("lordo", empty, PRESET, dataset, progress=False)
  assert not (tmp_path / "none").exists()
  fresh = dataclasses.replace(CONFIG, checkpoint_dir=str(stopped_checkpoint))
  held = rf"already holds a checkpoint \(step {STOP}\); add"
  with pytest.raises(checkpoints.ResumeError, match=held):
    train.train("diloco", fresh, PRESET, dataset, progress=False)


def test_a_checkpoint_from_elsewhere_is_refused(dataset, tmp_path):
  """A checkpoint saved by ``lordo_jax.checkpoint`` directly has no loop settings."""
  params = {"w": np.zeros((2, 2), np.float32)}
  checkpoint.save(tmp_path, 3, params, params)
  config = dataclasses.replace(CONFIG, checkpoint_dir=str(tmp_path), resume=True)
  with pytest.raises(checkpoints.ResumeError, match=r"\(step 3\) was not written by this training"):
    train.train("lordo", config, PRESET, dataset, progress=False)


def test_main_resumes_and_rejects_what_cannot_resume(diloco_runs, tmp_path, capsys):
  """The resume through ``examples/main.py`` (the DiLoCo runs above); the resumes that
  cannot work, which stop before training (exit status, stderr)."""
  ckpt = diloco_runs["written"]["args"]["checkpoint_dir"]
  bad = {
    "--rank 4": ["--methods", "diloco", "--resume", "--rank", "2"],
    "--methods diloco": ["--methods", "lordo", "--resume"],
    "add --resume": ["--methods", "diloco"],
  }
  for expected, args in bad.items():
    capsys.readouterr()
    argv = [*lm_example.main_args(CONFIG), "--out", str(tmp_path / "x"), "--checkpoint-dir", ckpt]
    assert lm_example.main.main([*argv, *args]) == 2, expected
    lines = stderr_lib.error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and expected in lines[0], (expected, lines)
  assert not (tmp_path / "x").exists()
  (result,) = diloco_runs["written"]["results"]
  assert result["resumed_from"] == STOP
  assert len(result["train_loss"]) == N
  assert [e["step"] for e in result["evals"]] == [0, 8, 16, 24]
