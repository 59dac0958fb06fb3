"""Host offload (``offload=True``): the sync-only state in ``pinned_host`` memory.

Every method with an anchor runs twice, offload off and on, on 4 workers x 2-way
FSDP (parameters split over the ``fsdp`` axis inside each worker) and on one worker
under a plain ``jit``: the results must be bit-identical, the anchor, outer state and
compression residual must lie in host memory after every step (and on the device
without offload), and the compiled step must need less device memory by at least
the anchor's size.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import lordo_jax
from tests.helpers import sharded_mlp
from tests.helpers.sharded_mlp import AXIS
from tests.helpers.sharded_mlp import FSDP_SPECS

# Host-offloaded state: without the compilation cache (tests/conftest.py).
pytestmark = [pytest.mark.timeout(300, method="thread"), pytest.mark.no_compilation_cache]

STEPS = 5  # Syncs at steps 2 and 4 (K = 2); with 2 fragments, one fragment each step.
METHODS = {
  # With int8 messages, whose residual is read only at a sync too.
  "lordo": lambda **kw: lordo_jax.lordo(
    1e-2,
    rank=2,
    sync_every=2,
    error_feedback=True,
    outer_optimizer=optax.sgd(0.8, 0.5),
    compression="int8",
    **kw,
  ),
  "diloco": lambda **kw: lordo_jax.diloco(1e-2, sync_every=2, **kw),
  "local_adam_streaming": lambda **kw: lordo_jax.local_adam(1e-2, sync_every=2, fragments=2, **kw),
  # A message in flight, in host memory too: one row of it comes in at each step.
  "diloco_overlap_round": lambda **kw: lordo_jax.diloco(1e-2, sync_every=2, overlap="round", **kw),
  "lordo_overlap_window": lambda **kw: lordo_jax.lordo(
    1e-2, rank=2, sync_every=2, overlap=1, merge="streaming", merge_alpha=0.5, **kw
  ),
  # Two fragments frozen at steps 2 and 4, each landing a step later.
  "local_adam_overlap_fragments": lambda **kw: lordo_jax.local_adam(
    1e-2, sync_every=4, overlap=1, fragments=2, **kw
  ),
}
# Every other method with an anchor: the option reaches its synchronize.
OTHERS = {
  "desloc": lambda **kw: lordo_jax.desloc(1e-2, sync_every=2, **kw),
  "lordo_local_projection": lambda **kw: lordo_jax.lordo_local_projection(
    1e-2, rank=2, sync_every=2, **kw
  ),
  "lordo_global_projection_only": lambda **kw: lordo_jax.lordo_global_projection_only(
    1e-2, rank=2, sync_every=2, **kw
  ),
}


def _sync_only(state) -> list:
  """The anchor, outer state, residual and message in flight of the state's synchronize."""
  return jax.tree.leaves((state.anchor, state.outer_state, state.residual, state.in_flight))


def _train(tx, step, params, state, workers, place=lambda b: b, steps=STEPS):
  """``steps`` steps; the memory kinds of the sync-only leaves after each one."""
  kinds = []
  for t in range(steps):
    params, state = step(params, state, place(sharded_mlp.batch(t, workers)))
    jax.block_until_ready((params, state))
    kinds.append({leaf.sharding.memory_kind for leaf in _sync_only(state)})
  return params, state, kinds


@functools.cache
def run_sharded(method: str, offload: bool, axis_type=AxisType.Explicit):
  """The method on 4 workers x 2-way FSDP; (params, state, kinds, compiled step)."""
  tx = METHODS[method](axis_name=AXIS, offload=offload)
  mesh = jax.make_mesh((4, 2), (AXIS, "fsdp"), axis_types=(axis_type,) * 2)
  return run(tx, mesh, FSDP_SPECS)


def run(tx, mesh, specs):
  """STEPS steps of ``tx`` on ``mesh`` (one worker per slice of the worker axis)."""
  workers = mesh.shape[AXIS]
  manual = functools.partial(
    jax.shard_map, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS), axis_names={AXIS}
  )

  def one_worker(fn):
    return lambda *args: jax.tree.map(lambda a: a[None], fn(*jax.tree.map(lambda a: a[0], args)))

  def step(params, state, batch):
    updates, state = tx.update(jax.grad(sharded_mlp.loss)(params, batch), state, params)
    return optax.apply_updates(params, updates), state

  step = jax.jit(manual(one_worker(step)))
  params = jax.tree.map(
    lambda a, spec: jax.device_put(jnp.stack([a] * workers), jax.NamedSharding(mesh, spec)),
    sharded_mlp.params(),
    specs,
  )
  state = jax.jit(manual(one_worker(tx.init)))(params)
  place = lambda b: jax.device_put(b, jax.NamedSharding(mesh, P(AXIS)))  # noqa: E731
  params, state, kinds = _train(tx, step, params, state, workers, place)
  compiled = step.lower(params, state, place(sharded_mlp.batch(0, workers))).compile()
  return params, state, kinds, compiled


@pytest.mark.parametrize("method", list({**METHODS, **OTHERS}))
def test_every_method_with_an_anchor_places_it_in_host_memory(method):
  tx = {**METHODS, **OTHERS}[method](offload=True)
  state = tx.init(sharded_mlp.params())
  assert {leaf.sharding.memory_kind for leaf in _sync_only(state)} == {"pinned_host"}
  assert state.inner_state is not None
  kinds = {leaf.sharding.memory_kind for leaf in jax.tree.leaves(state.inner_state)}
  assert kinds == {"device"}  # What a local step reads stays on the device.


def test_offload_must_be_a_bool():
  with pytest.raises(ValueError, match="offload='yes' is not accepted"):
    lordo_jax.diloco(1e-2, sync_every=2, offload="yes")


def _assert_bit_identical(a, b):
  leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(leaves_a) == len(leaves_b)
  for x, y in zip(leaves_a, leaves_b, strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("method", list(METHODS))
def test_offload_is_bit_identical_with_the_sync_state_in_host_memory(method):
  params, state, kinds, _ = run_sharded(method, offload=False)
  off_params, off_state, off_kinds, _ = run_sharded(method, offload=True)
  assert kinds == [{"device"}] * STEPS
  assert off_kinds == [{"pinned_host"}] * STEPS
  moved = np.max(np.abs(np.asarray(params["up"])[0] - np.asarray(sharded_mlp.params()["up"])))
  assert moved > 1e-3  # The runs trained: equal results are not equal initial values.
  _assert_bit_identical((params, state), (off_params, off_state))
  # Offloaded leaves keep their parameter's split over the FSDP axis.
  assert off_state.anchor["up"].sharding.spec == params["up"].sharding.spec


def test_offload_under_auto_axes():
  params, state, _, _ = run_sharded("lordo", offload=False, axis_type=AxisType.Auto)
  off_params, off_state, off_kinds, _ = run_sharded("lordo", True, axis_type=AxisType.Auto)
  assert off_kinds == [{"pinned_host"}] * STEPS
  _assert_bit_identical((params, state), (off_params, off_state))


def test_offload_keeps_the_compression_residual_in_host_memory():
  """Compression adds a residual, also read only at a sync (LoRDO's run above)."""
  params, state, kinds, _ = run_sharded("lordo", offload=False)
  off_params, off_state, off_kinds, _ = run_sharded("lordo", offload=True)
  assert state.residual["up"].sharding.memory_kind == "device"
  assert off_state.residual["up"].sharding.memory_kind == "pinned_host"
  # Split over the FSDP axis like its parameter.
  assert off_state.residual["up"].sharding.spec == params["up"].sharding.spec
  assert off_kinds == [{"pinned_host"}] * STEPS and kinds == [{"device"}] * STEPS
  _assert_bit_identical((params, state), (off_params, off_state))


def test_offload_on_one_worker_under_jit():
  """No worker axis (a single worker): a plain ``jit`` honours the placement too."""
  results = []
  for offload in (False, True):
    tx = METHODS["diloco"](offload=offload)

    def step(params, state, batch, tx=tx):
      updates, state = tx.update(jax.grad(sharded_mlp.loss)(params, batch), state, params)
      return optax.apply_updates(params, updates), state

    first = lambda b: jax.tree.map(lambda a: a[0], b)  # noqa: E731
    results.append(
      _train(tx, jax.jit(step), sharded_mlp.params(), tx.init(sharded_mlp.params()), 1, first)
    )
  (params, state, kinds), (off_params, off_state, off_kinds) = results
  assert off_kinds == [{"pinned_host"}] * STEPS and kinds == [{"device"}] * STEPS
  _assert_bit_identical((params, state), (off_params, off_state))


def _per_device_bytes(leaves) -> int:
  """Bytes of one device's shard of each array in ``leaves``."""
  return sum(int(np.prod(x.sharding.shard_shape(x.shape))) * x.dtype.itemsize for x in leaves)


def _device_bytes(compiled, state) -> int:
  """Per-device bytes the compiled step needs on the device: its arguments, outputs
  and temporaries, less the state's leaves in host memory, which are both an argument
  and an output (the CPU backend's memory analysis counts host buffers with the
  others)."""
  stats = compiled.memory_analysis()
  total = (
    stats.argument_size_in_bytes
    + stats.output_size_in_bytes
    - stats.alias_size_in_bytes
    + stats.temp_size_in_bytes
  )
  on_host = [x for x in jax.tree.leaves(state) if x.sharding.memory_kind == "pinned_host"]
  return total - 2 * _per_device_bytes(on_host)


@pytest.mark.parametrize("method", ["lordo", "diloco", "diloco_overlap_round"])
def test_offload_shrinks_the_compiled_steps_device_memory(method):
  """By the anchor at least; with a message in flight, by it and its means too, less
  the one row of each a step brings in."""
  _, state, _, compiled = run_sharded(method, offload=False)
  _, off_state, _, off_compiled = run_sharded(method, offload=True)
  kept = _per_device_bytes(jax.tree.leaves((state.anchor, state.in_flight)))
  rows = sum(_per_device_bytes([x]) // x.shape[1] for x in jax.tree.leaves(state.in_flight))
  saved = _device_bytes(compiled, state) - _device_bytes(off_compiled, off_state)
  assert saved >= kept - rows > 0, (saved, kept, rows)


def test_state_bytes_reads_the_placement_of_a_sharded_offloaded_state():
  _, state, _, _ = run_sharded("diloco", offload=True)
  sizes = lordo_jax.state_bytes(state)
  anchor_and_momentum = 2 * sum(
    4 * 4 * int(np.prod(a.shape)) for a in sharded_mlp.params().values()
  )
  assert sizes["host"] == sizes["offloadable"] == anchor_and_momentum
