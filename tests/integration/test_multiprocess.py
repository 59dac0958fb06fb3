"""The launcher of multi-process runs, ``examples/launch_multiprocess.py``: it kills every
process it started when one fails or the time runs out, and its processes die with it.

That 2 processes x 4 CPU devices (collectives through gloo, coordinator on 127.0.0.1)
train what 1 process x 8 devices trains, and that a checkpoint of the first restores
on the second: ``test_multiprocess_remap.py``, whose saves are those two runs.
"""

import contextlib
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))

import launch_multiprocess  # noqa: E402

pytestmark = pytest.mark.timeout(150, method="thread")

STEPS = 24


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
