"""Multi-process runs on JAX's distributed runtime give the single-process result.

The job (``examples/multiprocess_job.py``) runs LoRDO on 8 workers, once as
2 processes x 4 CPU devices (collectives through gloo, coordinator on 127.0.0.1) and
once as 1 process x 8 devices, both launched as subprocesses by
``examples/launch_multiprocess.py``, which kills every process it started when one
fails or the time runs out.
"""

import contextlib
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))

import launch_multiprocess  # noqa: E402

pytestmark = pytest.mark.timeout(150, method="thread")

STEPS, SYNC_EVERY = 24, 4  # 6 syncs, the last one ending the run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """The 2 x 4 run (saving a checkpoint), then the 1 x 8 run (also restoring it)."""
  root = tmp_path_factory.mktemp("multiprocess")
  job = (f"--steps={STEPS}", f"--sync-every={SYNC_EVERY}")
  multi = launch_multiprocess.launch(
    2, 4, root / "multi", job_args=(*job, f"--checkpoint-dir={root / 'ckpt'}"), timeout=75
  )
  single = launch_multiprocess.launch(
    1, 8, root / "single", job_args=(*job, f"--restore-from={root / 'ckpt'}"), timeout=45
  )
  return multi, single


def test_two_processes_train_the_parameters_of_one(runs):
  multi, single = runs
  assert (multi["processes"], multi["workers"]) == (2, 8)
  assert (single["processes"], single["workers"]) == (1, 8)
  assert multi["params"].keys() == single["params"].keys() == {"w1", "b1", "w2"}
  for name, value in multi["params"].items():
    assert value.shape[0] == 8  # every worker's copy
    np.testing.assert_allclose(value, single["params"][name], rtol=0, atol=1e-6, err_msg=name)
    # The run ends on a sync: the 8 workers, 4 in each process, hold one value.
    np.testing.assert_allclose(value, np.broadcast_to(value[0], value.shape), rtol=0, atol=1e-6)
  np.testing.assert_allclose(multi["losses"], single["losses"], rtol=1e-5)
  assert multi["losses"][-1] < 0.8 * multi["losses"][0]  # it trained
  assert multi["communicated_bytes"] == single["communicated_bytes"] > 0


def test_a_multi_process_checkpoint_restores_on_one_process(runs):
  multi, single = runs
  for name, value in multi["params"].items():
    np.testing.assert_array_equal(single["restored"][name], value, err_msg=name)


def test_launcher_kills_every_process_when_the_job_fails(tmp_path):
  with pytest.raises(launch_multiprocess.LaunchError, match="ran past 1 s") as error:
    launch_multiprocess.launch(2, 4, tmp_path, job_args=(f"--steps={STEPS}",), timeout=1)
  assert len(error.value.pids) == 2
  for pid in error.value.pids:
    with pytest.raises(ProcessLookupError):
      os.kill(pid, 0)  # gone, and reaped


def _children(pid: int) -> list[int]:
  """The pids whose parent is ``pid`` (Linux /proc)."""
  found = []
  for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
    try:
      fields = stat.read_text().rsplit(")", 1)[1].split()
    except OSError:
      continue
    if int(fields[1]) == pid:
      found.append(int(stat.parent.name))
  return found


def _alive(pid: int) -> bool:
  try:
    state = (pathlib.Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
  except OSError:
    return False
  return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_job_processes_die_with_a_killed_launcher(tmp_path):
  """A launcher killed outright (no finally runs) does not leave its processes behind."""
  code = (
    f"import sys; sys.path.insert(0, {str(EXAMPLES)!r}); import launch_multiprocess as l; "
    f"l.launch(2, 4, {str(tmp_path)!r}, job_args=('--steps=1000',), timeout=300)"
  )
  launcher = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
  children = []
  try:
    deadline = time.monotonic() + 30
    while len(children) < 2 and time.monotonic() < deadline:
      children = _children(launcher.pid)
      time.sleep(0.1)
    assert len(children) == 2
    time.sleep(1.0)  # let them get past their start
    launcher.kill()
    launcher.wait(timeout=10)
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
      time.sleep(0.1)
    assert not any(_alive(pid) for pid in children)
  finally:
    for pid in [launcher.pid, *children]:
      with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
