"""Multi-process runs on JAX's distributed runtime: 2 processes train what 1 trains, and a
run saved on 8 workers resumes on 4, across processes (``remap_workers``).

``examples/multiprocess_job.py`` trains LoRDO on 8 workers to a round boundary and
saves, once as 2 processes x 4 devices (collectives through gloo, coordinator on
127.0.0.1) and once as 1 process x 8, which also restores the first's checkpoint
(``--restore-from``): the two give one result, and the checkpoint the two processes
wrote restores in one. ``--resume-from``
continues the first on 1 process x 4 devices and the second on 2 processes x 2 devices
(the restored arrays span both processes: remap_workers gathers them). The state each
process continues from must be, bit for bit, the checkpoint restored onto one device
and remapped here; and the two continued runs, on 4 workers, must agree (to the rounding
of gloo's cross-process sums): the two saves trained the same 8 workers, and both
continue from the same remap of their state.
"""

import pathlib
import sys

import numpy as np
import pytest

import lordo_jax
from lordo_jax import checkpoint

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))

import launch_multiprocess  # noqa: E402
import multiprocess_job  # noqa: E402

pytestmark = pytest.mark.timeout(300, method="thread")

SAVED_AT, RESUMED_TO, SYNC_EVERY = 8, 12, 4  # saved at the 2nd sync, resumed to the 3rd
SAVED, RESUMED = 8, 4  # workers
NAMES = {"w1", "b1", "w2"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """Two saves on 8 workers, each resumed on 4 by another number of processes."""
  root = tmp_path_factory.mktemp("multiprocess_remap")
  save = (f"--steps={SAVED_AT}", f"--sync-every={SYNC_EVERY}")
  resume = (f"--steps={RESUMED_TO}", f"--sync-every={SYNC_EVERY}")
  restore = (f"--restore-from={root / 'two'}",)  # The 2-process save, restored in one.

  def job(processes, devices, out, *args, timeout):
    return launch_multiprocess.launch(
      processes, devices, root / out, job_args=args, timeout=timeout
    )

  saved = {  # keyed by the processes that saved
    2: job(2, 4, "save_2x4", *save, f"--checkpoint-dir={root / 'two'}", timeout=75),
    1: job(1, 8, "save_1x8", *save, f"--checkpoint-dir={root / 'one'}", *restore, timeout=45),
  }
  resumed = {  # keyed by the processes that saved
    2: job(1, 4, "two_on_1x4", *resume, f"--resume-from={root / 'two'}", timeout=45),
    1: job(2, 2, "one_on_2x2", *resume, f"--resume-from={root / 'one'}", timeout=75),
  }
  return root, saved, resumed


def remapped_states(out: pathlib.Path, processes: int) -> list[dict]:
  """The state each process continued from (``remapped_<process>.npz``)."""
  states = []
  for i in range(processes):
    with np.load(out / f"remapped_{i}.npz") as state:
      states.append(dict(state))
  return states


def remapped_here(directory: pathlib.Path):
  """The checkpoint restored onto this process's first device and remapped to 4 workers;
  and its params as saved."""
  config = multiprocess_job.Config(steps=SAVED_AT, sync_every=SYNC_EVERY)
  params, state = checkpoint.restore(
    directory, SAVED_AT, *multiprocess_job.saved_like(config, SAVED)
  )
  remapped = lordo_jax.remap_workers(params, state, RESUMED, sync_every=SYNC_EVERY)
  return multiprocess_job.flat(remapped), {k: np.asarray(v) for k, v in params.items()}


def assert_identical(state: dict, expected: dict) -> None:
  assert state.keys() == expected.keys()
  for key, value in expected.items():
    assert state[key].dtype == value.dtype, key
    np.testing.assert_array_equal(state[key], value, err_msg=key)


def assert_resumed(run: dict, processes: int) -> None:
  """4 workers, resumed at the saved step, ended on a sync at RESUMED_TO."""
  assert (run["processes"], run["workers"], run["saved_workers"]) == (processes, RESUMED, SAVED)
  assert run["resumed_at"] == SAVED_AT and run["steps"] == [RESUMED_TO] * RESUMED
  assert len(run["losses"]) == RESUMED_TO - SAVED_AT
  assert run["params"].keys() == NAMES
  for name, value in run["params"].items():
    assert value.shape[0] == RESUMED, name
    # The run ended on a sync: the 4 workers hold one value (up to params + (anchor - params)).
    np.testing.assert_allclose(value, np.broadcast_to(value[0], value.shape), rtol=0, atol=1e-6)


def test_two_processes_train_the_parameters_of_one(runs):
  _, saved, _ = runs
  multi, single = saved[2], saved[1]
  assert (multi["processes"], multi["workers"]) == (2, SAVED)
  assert (single["processes"], single["workers"]) == (1, SAVED)
  assert multi["params"].keys() == single["params"].keys() == NAMES
  for name, value in multi["params"].items():
    assert value.shape[0] == SAVED  # every worker's copy
    np.testing.assert_allclose(value, single["params"][name], rtol=0, atol=1e-6, err_msg=name)
    # The run ends on a sync: the 8 workers, 4 in each process, hold one value.
    np.testing.assert_allclose(value, np.broadcast_to(value[0], value.shape), rtol=0, atol=1e-6)
  np.testing.assert_allclose(multi["losses"], single["losses"], rtol=1e-5)
  assert multi["losses"][-1] < 0.8 * multi["losses"][0]  # it trained
  assert multi["communicated_bytes"] == single["communicated_bytes"] > 0


def test_a_multi_process_checkpoint_restores_on_one_process(runs):
  _, saved, _ = runs
  for name, value in saved[2]["params"].items():
    np.testing.assert_array_equal(saved[1]["restored"][name], value, err_msg=name)


@pytest.mark.parametrize("saved_on", [2, 1], ids=["2x4_on_1x4", "1x8_on_2x2"])
def test_every_process_continues_from_the_checkpoint_remapped_in_one_process(runs, saved_on):
  root, saved, resumed = runs
  directory = root / ("two" if saved_on == 2 else "one")
  expected, saved_params = remapped_here(directory)
  # The checkpoint holds what the saving processes held, and the remap starts every
  # worker from the anchor, on which each saved worker landed.
  for name, value in saved[saved_on]["params"].items():
    np.testing.assert_array_equal(saved_params[name], value, err_msg=name)
    np.testing.assert_allclose(expected[f"[0]['{name}']"], value[:RESUMED], rtol=0, atol=1e-6)
  out = root / ("two_on_1x4" if saved_on == 2 else "one_on_2x2")
  states = remapped_states(out, resumed[saved_on]["processes"])
  assert len(states) == (1 if saved_on == 2 else 2)
  assert len(expected) > 20 and expected["[1].count"].tolist() == [SAVED_AT] * RESUMED
  for state in states:
    assert_identical(state, expected)


def test_a_two_process_save_continues_on_one_process(runs):
  """Its continuation is the 1-process save's continued on 2 processes: the two saves
  trained the same 8 workers up to the order of gloo's sums (1e-6, as
  above), and each continuation starts from its save's remap (bit for
  bit, above); only the 4 workers' sums then cross the processes in another order."""
  _, saved, resumed = runs
  run = resumed[2]
  assert saved[2]["processes"] == 2
  assert_resumed(run, processes=1)
  for name, value in run["params"].items():
    np.testing.assert_allclose(value, resumed[1]["params"][name], rtol=0, atol=1e-6, err_msg=name)
  np.testing.assert_allclose(run["losses"], resumed[1]["losses"], rtol=1e-5)


def test_a_one_process_save_continues_on_two_processes(runs):
  root, saved, resumed = runs
  run = resumed[1]
  assert saved[1]["processes"] == 1
  assert_resumed(run, processes=2)
  # Both processes continue from one state (each the remap made in one process, above).
  assert_identical(*remapped_states(root / "one_on_2x2", 2))
  assert run["losses"][-1] < saved[1]["losses"][0]  # it trained on from the save
