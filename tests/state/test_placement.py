"""state_sharding: a fresh state placed like its parameters, on Explicit and Auto meshes.

The reference is the state ``tx.init`` makes inside the worker step's ``shard_map`` on
an ``Explicit`` mesh (it follows the parameters' types): ``state_sharding`` must give
the same layout leaf by leaf, for the same mesh with ``Auto`` axes too, and a state
placed with it on an ``Auto`` mesh must train to the Explicit run's result.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import lordo_jax

# Host-offloaded state: without the compilation cache (tests/conftest.py).
pytestmark = [pytest.mark.timeout(300, method="thread"), pytest.mark.no_compilation_cache]

AXIS = "workers"
METHODS = {
  "lordo_offload": lambda: lordo_jax.lordo(
    1e-2, rank=2, sync_every=2, axis_name=AXIS, error_feedback=True, offload=True
  ),
  "low_rank_ddp": lambda: lordo_jax.low_rank_ddp(1e-2, rank=2, refresh_every=2, axis_name=AXIS),
  "diloco_int8": lambda: lordo_jax.diloco(1e-2, sync_every=2, axis_name=AXIS, compression="int8"),
  "lordo_two_sided": lambda: lordo_jax.lordo(
    1e-2, rank=2, sync_every=2, axis_name=AXIS, two_sided=True
  ),
}
SPECS = {"up": P(AXIS, "fsdp", None), "down": P(AXIS, None, "fsdp"), "bias": P(AXIS, "fsdp")}


def _params(workers=4):
  keys = jax.random.split(jax.random.key(0), 2)
  one = {
    "up": jax.random.normal(keys[0], (16, 24)) / 4,
    "down": jax.random.normal(keys[1], (24, 16)) / 5,
    "bias": jnp.zeros((24,)),
  }
  return jax.tree.map(lambda a: jnp.stack([a] * workers), one)


def _loss(params, x):
  hidden = jnp.tanh(x @ params["up"] + params["bias"])
  return jnp.mean((hidden @ params["down"] - x) ** 2)


def _mesh(axis_type):
  return jax.make_mesh((4, 2), (AXIS, "fsdp"), axis_types=(axis_type,) * 2)


def _manual(mesh):
  return functools.partial(
    jax.shard_map, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS), axis_names={AXIS}
  )


def _one_worker(fn):
  return lambda *args: jax.tree.map(lambda a: a[None], fn(*jax.tree.map(lambda a: a[0], args)))


def _placed_params(mesh):
  return jax.tree.map(
    lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec)), _params(), SPECS
  )


def _layout(sharding):
  spec = tuple(sharding.spec)
  return spec + (None,) * (4 - len(spec)), sharding.memory_kind or "device"


@pytest.mark.parametrize("axis_type", [AxisType.Explicit, AxisType.Auto], ids=["explicit", "auto"])
@pytest.mark.parametrize("method", list(METHODS))
def test_state_sharding_is_the_layout_init_gives_inside_the_step(method, axis_type):
  tx = METHODS[method]()
  explicit = _mesh(AxisType.Explicit)
  reference = jax.jit(_manual(explicit)(_one_worker(tx.init)))(_placed_params(explicit))
  mesh = _mesh(axis_type)
  shardings = lordo_jax.state_sharding(tx, _placed_params(mesh), worker_axis=AXIS)
  assert jax.tree.structure(shardings) == jax.tree.structure(reference)
  for got, want in zip(jax.tree.leaves(shardings), jax.tree.leaves(reference), strict=True):
    assert got.mesh == mesh
    assert _layout(got) == _layout(want.sharding)
  # Something is split and, with offload, something is on the host: the test has teeth.
  layouts = [_layout(s) for s in jax.tree.leaves(shardings)]
  assert any("fsdp" in spec for spec, _ in layouts)
  assert ("pinned_host" in {kind for _, kind in layouts}) == method.endswith("offload")


def test_a_state_placed_on_an_auto_mesh_trains_like_the_explicit_run():
  tx = METHODS["lordo_offload"]()
  results = []
  for axis_type in (AxisType.Explicit, AxisType.Auto):
    mesh = _mesh(axis_type)
    params = _placed_params(mesh)
    shardings = lordo_jax.state_sharding(tx, params, worker_axis=AXIS)
    one = jax.tree.map(lambda a: np.asarray(a)[0], params)
    state = jax.device_put(jax.tree.map(lambda a: jnp.stack([a] * 4), tx.init(one)), shardings)

    def step(params, state, x):
      updates, state = tx.update(jax.grad(_loss)(params, x), state, params)
      return optax.apply_updates(params, updates), state

    step = jax.jit(
      _manual(mesh)(_one_worker(step)),
      out_shardings=(jax.tree.map(lambda a: a.sharding, params), shardings),
    )
    for t in range(4):
      x = jax.device_put(
        jax.random.normal(jax.random.key(t), (4, 8, 16)), NamedSharding(mesh, P(AXIS))
      )
      params, state = step(params, state, x)
      jax.block_until_ready((params, state))
    per_device = sum(
      int(np.prod(s.sharding.shard_shape(s.shape))) * s.dtype.itemsize
      for s in jax.tree.leaves(state.anchor)
    )
    whole = sum(int(np.prod(s.shape)) * s.dtype.itemsize for s in jax.tree.leaves(state.anchor))
    assert per_device * 2 * 4 == whole  # Split over 4 workers x 2-way FSDP.
    assert state.anchor["up"].sharding.memory_kind == "pinned_host"
    results.append(jax.device_get(params))
  for name in results[0]:
    scale = np.max(np.abs(results[0][name]))
    np.testing.assert_allclose(results[1][name], results[0][name], rtol=0, atol=1e-5 * scale)


def test_state_sharding_refuses_params_without_a_mesh():
  with pytest.raises(ValueError, match="NamedSharding of one mesh"):
    lordo_jax.state_sharding(METHODS["diloco_int8"](), {"w": jnp.ones((4, 3))})


def test_state_sharding_refuses_params_not_stacked_over_the_worker_axis():
  mesh = _mesh(AxisType.Auto)
  w = jax.ShapeDtypeStruct((16, 8), jnp.float32, sharding=NamedSharding(mesh, P("fsdp")))
  with pytest.raises(ValueError, match="stacked over the workers"):
    lordo_jax.state_sharding(METHODS["diloco_int8"](), {"w": w}, worker_axis=AXIS)


def test_init_under_jit_follows_explicit_params():
  """``jax.jit(tx.init)`` of params split over an Explicit axis, in the mesh's context:
  the moments split along the kept dimension, the basis along its rows, the anchor like w."""
  mesh = jax.make_mesh((2,), ("fsdp",), devices=jax.devices()[:2])
  w = jax.device_put(jnp.ones((16, 8)), NamedSharding(mesh, P(None, "fsdp")))
  tx = lordo_jax.lordo(1e-2, rank=2, sync_every=2, init_projection="random")
  set_mesh = getattr(jax, "set_mesh", None) or jax.sharding.use_mesh
  with set_mesh(mesh):
    state = jax.jit(tx.init)({"w": w})
  leaves = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(state)}
  # w's shape group, of one matrix: its state as it is (GroupedMoments).
  (mu,) = [v for k, v in leaves.items() if k.endswith("moments.groups[0].mu")]
  (basis,) = [v for k, v in leaves.items() if k.endswith("moments.groups[0].basis")]
  assert _layout(mu.sharding)[0][:2] == (None, "fsdp")  # r x q, q split
  assert _layout(basis.sharding)[0][:2] == ("fsdp", None)  # p x r, p split
  assert _layout(state.anchor["w"].sharding)[0][:2] == (None, "fsdp")


def test_init_under_jit_runs_without_a_mesh_context():
  """Outside any mesh context (where jax 0.10 still types arrays by their sharding) the
  init must not ask for one: every split buffer is made on the parameter's own mesh."""
  mesh = jax.make_mesh((2,), ("fsdp",), devices=jax.devices()[:2])
  w = jax.device_put(jnp.ones((16, 8)), NamedSharding(mesh, P(None, "fsdp")))
  tx = lordo_jax.lordo(1e-2, rank=2, sync_every=2, init_projection="random")
  state = jax.jit(tx.init)({"w": w})
  assert _layout(state.anchor["w"].sharding)[0][:2] == (None, "fsdp")
