"""Worker groups that shard their model, across processes: 2 processes x 4 devices.

The job (``examples/multiprocess_job.py --fsdp 4``) trains with LoRDO on a
``workers x fsdp`` mesh of 2 worker groups, each sharding its copy of the model 4 ways
(FSDP) over the devices of one process; LoRDO's all-reduces over ``workers`` cross the
processes through gloo (coordinator on 127.0.0.1). It must train the parameters that
1 process x 8 devices trains on the same mesh layout (to 1e-6 relative, with the same
ledger), and those of 2 unsharded workers (1 process x 2 devices) to float rounding.
LoRDO's basis comes from subspace iteration, whose first basis is an exact SVD: the
run crosses the processes with both refreshes (the SVD's, gathered inside each group,
and the products of subspace iteration); each method's sharded refresh is checked
against the unsharded run in one process by ``tests/integration/test_sharded_workers.py``.
``examples/launch_multiprocess.py`` starts every process and kills them all when one
fails or the time runs out.
"""

import os
import pathlib
import sys

import numpy as np
import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))

import launch_multiprocess  # noqa: E402
import multiprocess_job  # noqa: E402

pytestmark = pytest.mark.timeout(240, method="thread")

STEPS, SYNC_EVERY = 24, 4  # 6 syncs, the last one ending the run
JOB = (f"--steps={STEPS}", f"--sync-every={SYNC_EVERY}")
NAMES = {"w1", "b1", "w2"}
# One device's slice of each worker's parameter: the hidden dimension (32) split 4 ways.
FSDP_SHARDS = {"w1": [1, 16, 8], "b1": [1, 8], "w2": [1, 8, 8]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """2 x 4 (saving a checkpoint) and 1 x 8 (restoring it), both 2 groups x 4-way FSDP,
  and 1 x 2: the same 2 workers, each model whole on one device."""
  root = tmp_path_factory.mktemp("fsdp")
  job = (*JOB, "--projection=subspace_iteration")
  multi = launch_multiprocess.launch(
    2,
    4,
    root / "multi",
    job_args=(*job, "--fsdp=4", f"--checkpoint-dir={root / 'ckpt'}"),
    timeout=120,
  )
  single = launch_multiprocess.launch(
    1,
    8,
    root / "single",
    job_args=(*job, "--fsdp=4", f"--restore-from={root / 'ckpt'}"),
    timeout=90,
  )
  unsharded = launch_multiprocess.launch(
    1, 2, root / "unsharded", job_args=(*job, "--fsdp=1"), timeout=90
  )
  return multi, single, unsharded


def _assert_close(params, reference, rtol):
  """Each leaf within ``rtol`` of the reference, relative to the leaf's largest value."""
  assert params.keys() == reference.keys() == NAMES
  for name, value in params.items():
    scale = np.max(np.abs(reference[name]))
    np.testing.assert_allclose(value, reference[name], rtol=0, atol=rtol * scale, err_msg=name)


def test_two_processes_of_fsdp_groups_train_the_parameters_of_one(runs):
  multi, single, _ = runs
  assert (multi["processes"], multi["workers"], multi["fsdp"]) == (2, 2, 4)
  assert (single["processes"], single["workers"], single["fsdp"]) == (1, 2, 4)
  assert multi["group_processes"] == [[0], [1]]  # a group's FSDP stays in its process
  for run in (multi, single):  # each device holds a quarter of its worker's copy
    assert run["param_shards"] == run["anchor_shards"] == FSDP_SHARDS
  _assert_close(multi["params"], single["params"], rtol=1e-6)
  for name, value in multi["params"].items():
    assert value.shape[0] == 2, name  # every worker's copy
    # The run ends on a sync: the 2 groups, one in each process, hold one value.
    scale = np.max(np.abs(value))
    np.testing.assert_allclose(value[1], value[0], rtol=0, atol=1e-6 * scale, err_msg=name)
  np.testing.assert_allclose(multi["losses"], single["losses"], rtol=1e-6)
  assert multi["losses"][-1] < 0.8 * multi["losses"][0]  # it trained
  assert multi["communicated_bytes"] == single["communicated_bytes"] > 0


def test_a_sharded_multi_process_checkpoint_restores_on_one_process(runs):
  multi, single, _ = runs
  for name, value in multi["params"].items():
    np.testing.assert_array_equal(single["restored"][name], value, err_msg=name)


def test_fsdp_groups_train_the_parameters_of_unsharded_workers(runs):
  multi, _, unsharded = runs
  assert (unsharded["workers"], unsharded["fsdp"]) == (2, 1)
  assert unsharded["param_shards"]["w1"] == [1, 16, 32]  # the whole matrix on one device
  for name, initial in multiprocess_job.init_params(0).items():
    value = unsharded["params"][name]
    moved = np.max(np.abs(value - initial[None]))
    assert moved > 1e-2 * np.max(np.abs(value)), name  # the comparison below could fail
  _assert_close(multi["params"], unsharded["params"], rtol=1e-5)
  assert multi["communicated_bytes"] == unsharded["communicated_bytes"]


def test_a_failing_fsdp_job_leaves_no_process(tmp_path):
  """Each process fails at its mesh (4 devices do not split into groups of 3): the
  launcher reports it and every process is gone, reaped."""
  with pytest.raises(launch_multiprocess.LaunchError, match="must divide") as error:
    launch_multiprocess.launch(2, 4, tmp_path, job_args=(*JOB, "--fsdp=3"), timeout=60)
  assert len(error.value.pids) == 2
  for pid in error.value.pids:
    with pytest.raises(ProcessLookupError):
      os.kill(pid, 0)
