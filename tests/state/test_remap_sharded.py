"""``remap_workers`` on worker groups that shard their model, and on offloaded state.

LoRDO on 4 workers x 2-way FSDP (``Explicit`` and ``Auto`` axes), saved at the boundary
of step 8 and continued to step 12 on 2 workers x 2: the remapped state, placed with the
new run's shardings (parameter specs, ``state_sharding``), lies as a fresh state does and
trains bit for bit like 2 workers started from worker 0's synchronised state. With
``offload=True`` the sync-only leaves land in ``pinned_host`` memory again, and the run
equals the one without offload. A sharded state saved mid-round, or an offloaded one
with a message in flight, is refused with what to do.
"""

import functools
from typing import NamedTuple

import jax
import numpy as np
import optax
import pytest
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import lordo_jax
from tests.helpers import sharded_mlp
from tests.helpers.sharded_mlp import AXIS
from tests.helpers.sharded_mlp import FSDP_SPECS
from tests.state.test_remap_workers import assert_same
from tests.state.test_remap_workers import round_of
from tests.state.test_remap_workers import worker0

# Host-offloaded state: without the compilation cache (tests/conftest.py).
pytestmark = [pytest.mark.timeout(300), pytest.mark.no_compilation_cache]

K = 4
SAVED, NEW = 4, 2  # workers, each a group of 2 devices
BOUNDARY = 8  # the step the run is saved at: it ends the second round
AXIS_TYPES = pytest.mark.parametrize(
  "axis_type", [AxisType.Explicit, AxisType.Auto], ids=["explicit", "auto"]
)


class Job(NamedTuple):
  """A run on ``workers`` groups of 2 devices: its optimizer, mesh, shardings and step."""

  tx: optax.GradientTransformation
  mesh: jax.sharding.Mesh
  params: dict
  state: object
  step: object


def _one_worker(fn):
  return lambda *args: jax.tree.map(lambda a: a[None], fn(*jax.tree.map(lambda a: a[0], args)))


def _manual(mesh):
  return functools.partial(
    jax.shard_map, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS), axis_names={AXIS}
  )


def _mesh(workers: int, axis_type):
  devices = jax.devices()[: 2 * workers]
  return jax.make_mesh((workers, 2), (AXIS, "fsdp"), axis_types=(axis_type,) * 2, devices=devices)


def _abstract_params(mesh):
  """The parameters stacked over the mesh's workers, split by ``FSDP_SPECS``."""
  workers = mesh.shape[AXIS]
  return {
    name: jax.ShapeDtypeStruct(
      (workers, *a.shape), a.dtype, sharding=NamedSharding(mesh, FSDP_SPECS[name])
    )
    for name, a in sharded_mlp.params().items()
  }


@functools.cache
def job(workers: int, axis_type, offload: bool = False) -> Job:
  """The run's placement on ``workers`` x 2 devices, and its step that keeps it."""
  tx = lordo_jax.lordo(1e-2, rank=2, sync_every=K, axis_name=AXIS, offload=offload)
  mesh = _mesh(workers, axis_type)
  params = jax.tree.map(lambda a: a.sharding, _abstract_params(mesh))
  state = lordo_jax.state_sharding(tx, _abstract_params(mesh), worker_axis=AXIS)

  def step(params, opt_state, batch):
    updates, opt_state = tx.update(jax.grad(sharded_mlp.loss)(params, batch), opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  step = jax.jit(_manual(mesh)(_one_worker(step)), out_shardings=(params, state))
  return Job(tx, mesh, params, state, step)


def fresh(tx, workers: int):
  """A new run's parameters and state on the host, stacked over ``workers``."""
  stack = lambda tree: jax.tree.map(lambda a: np.stack([np.asarray(a)] * workers), tree)  # noqa: E731
  return stack(sharded_mlp.params()), stack(jax.device_get(tx.init(sharded_mlp.params())))


def train(job: Job, params, state, first: int, last: int):
  """Placed as ``job`` places them, steps ``first + 1 .. last``; the arrays as they lie."""
  params, state = jax.device_put((params, state), (job.params, job.state))
  for t in range(first, last):
    batch = sharded_mlp.batch(t, job.mesh.shape[AXIS])
    batch = jax.device_put(batch, NamedSharding(job.mesh, P(AXIS)))
    params, state = jax.block_until_ready(job.step(params, state, batch))
  return params, state


def _split_over_fsdp(leaf) -> bool:
  entries = [e if isinstance(e, tuple) else (e,) for e in leaf.sharding.spec]
  return any("fsdp" in entry for entry in entries)


def _layout(sharding, ndim: int):
  spec = tuple(sharding.spec) + (None,) * ndim
  return spec[:ndim], sharding.memory_kind or "device"


@functools.cache
def initial_state(tx, workers: int):
  """``tx.init`` inside the step on ``workers`` x 2 devices (``Explicit`` axes), compiled
  once per optimizer and number of workers."""
  explicit = _mesh(workers, AxisType.Explicit)
  shardings = jax.tree.map(lambda a: a.sharding, _abstract_params(explicit))
  placed = jax.device_put(fresh(tx, workers)[0], shardings)
  return jax.jit(_manual(explicit)(_one_worker(tx.init)))(placed)


def assert_placed_as_a_fresh_state(job: Job, params, state):
  """Every leaf carries the job's sharding, which is the layout ``tx.init`` gives inside
  the step on these devices (``Explicit`` axes): split over ``fsdp`` like its parameter."""
  initial = initial_state(job.tx, job.mesh.shape[AXIS])
  want = (job.params, job.state)
  assert jax.tree.structure((params, state)) == jax.tree.structure(want)
  for leaf, sharding in zip(jax.tree.leaves((params, state)), jax.tree.leaves(want), strict=True):
    assert leaf.sharding == sharding
  for leaf, reference in zip(jax.tree.leaves(state), jax.tree.leaves(initial), strict=True):
    assert _layout(leaf.sharding, leaf.ndim) == _layout(reference.sharding, leaf.ndim)
  split = [leaf for leaf in jax.tree.leaves(round_of(state)) if _split_over_fsdp(leaf)]
  assert len(split) >= 6  # The anchor and the moments, at least: the check has teeth.


def sync_only_kinds(state) -> set:
  """The memory kinds of the anchor, outer state and residual."""
  leaves = jax.tree.leaves((state.anchor, state.outer_state, state.residual))
  return {leaf.sharding.memory_kind for leaf in leaves}


@functools.cache
def saved_run(axis_type, offload: bool = False):
  """4 workers x 2 trained to the boundary of step 8; the arrays of step 6 too."""
  saved = job(SAVED, axis_type, offload)
  mid_round = train(saved, *fresh(saved.tx, SAVED), 0, BOUNDARY - 2)
  at_boundary = train(saved, *mid_round, BOUNDARY - 2, BOUNDARY)
  return saved, at_boundary, mid_round


@functools.cache
def continued(axis_type, offload: bool = False):
  """The saved run remapped to 2 workers, placed, checked and trained to step 12; and the
  reference, 2 workers started from worker 0's synchronised state (computed once: the
  test of offload compares with the run without it)."""
  _, (params, state), _ = saved_run(axis_type, offload)
  host_params, host_state = jax.device_get((params, state))
  # At a boundary LoRDO's workers hold one state, every leaf of it.
  for leaf in jax.tree.leaves(host_state):
    assert (leaf == leaf[:1]).all()
  new = job(NEW, axis_type, offload)
  remapped = lordo_jax.remap_workers(host_params, host_state, NEW, sync_every=K)
  start = (worker0(host_state.anchor, NEW), worker0(host_state, NEW))
  assert_same(remapped, start)
  # The sharded arrays as they lie (in host memory too) remap alike.
  assert_same(lordo_jax.remap_workers(params, state, NEW, sync_every=K), remapped)
  placed = jax.device_put(remapped, (new.params, new.state))
  assert_placed_as_a_fresh_state(new, *placed)
  result = train(new, *placed, BOUNDARY, BOUNDARY + K)
  assert_placed_as_a_fresh_state(new, *result)
  reference = train(new, *start, BOUNDARY, BOUNDARY + K)
  return placed, result, reference


def assert_synchronised_at_step_12(params, state):
  assert (np.asarray(lordo_jax.step_count(state)) == BOUNDARY + K).all()
  for leaf in jax.tree.leaves(jax.device_get(params)):  # The third round ended: one model.
    np.testing.assert_allclose(leaf, np.broadcast_to(leaf[:1], leaf.shape), rtol=1e-6, atol=1e-7)


@AXIS_TYPES
def test_four_fsdp_groups_saved_at_a_boundary_continue_on_two(axis_type):
  placed, result, reference = continued(axis_type)
  assert_same(jax.device_get(result), jax.device_get(reference))
  assert_synchronised_at_step_12(*result)
  moved = np.abs(np.asarray(result[0]["up"]) - np.asarray(placed[0]["up"])).max()
  assert moved > 1e-3  # The third round trained: equal results are not equal inputs.


def test_offloaded_state_remaps_to_host_memory_and_equals_the_run_without_offload():
  _, (_, state), _ = saved_run(AxisType.Explicit, offload=True)
  assert sync_only_kinds(state) == {"pinned_host"}
  placed, result, reference = continued(AxisType.Explicit, offload=True)
  for _, state in (placed, result):
    assert sync_only_kinds(state) == {"pinned_host"}
    inner = {leaf.sharding.memory_kind for leaf in jax.tree.leaves(state.inner_state)}
    assert inner == {"device"}  # What a local step reads stays on the device.
  assert_same(jax.device_get(result), jax.device_get(reference))
  assert_synchronised_at_step_12(*result)
  _, on_device, _ = continued(AxisType.Explicit, offload=False)
  assert sync_only_kinds(on_device[1]) == {"device"}
  assert_same(jax.device_get(result), jax.device_get(on_device))  # Offload changes no bit.


@pytest.mark.parametrize("offload", [False, True], ids=["on_device", "offloaded"])
def test_a_sharded_state_saved_mid_round_is_refused_unless_restarted(offload):
  _, _, (params, state) = saved_run(AxisType.Explicit, offload)  # As they lie, sharded.
  assert sync_only_kinds(state) == {"pinned_host" if offload else "device"}
  with pytest.raises(ValueError, match=r"saved mid-round \(update 6\).*mid_round='restart'"):
    lordo_jax.remap_workers(params, state, NEW, sync_every=K)
  restarted, _ = lordo_jax.remap_workers(params, state, NEW, sync_every=K, mid_round="restart")
  assert_same(restarted, worker0(state.anchor, NEW))


def test_an_offloaded_message_in_flight_is_refused():
  """An FSDP-placed state with ``overlap``, its message in host memory: refused."""
  tx = lordo_jax.lordo(1e-2, rank=2, sync_every=K, axis_name=AXIS, overlap="round", offload=True)
  mesh = _mesh(SAVED, AxisType.Explicit)
  shardings = lordo_jax.state_sharding(tx, _abstract_params(mesh), worker_axis=AXIS)
  params, state = fresh(tx, SAVED)
  state = jax.device_put(state, shardings)
  assert {leaf.sharding.memory_kind for leaf in jax.tree.leaves(state.in_flight)} == {"pinned_host"}
  with pytest.raises(ValueError, match=r"message in flight \(overlap\).*without overlap"):
    lordo_jax.remap_workers(params, state, NEW, sync_every=K)
