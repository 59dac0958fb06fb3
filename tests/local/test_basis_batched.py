"""A batch of matrices is refreshed as each matrix would be alone (every basis method).

The bases (:mod:`lordo_jax.local.bases`) take leading batch axes, and low-rank Adam
stacks the matrices of one shape and layout to refresh them in one batched
computation: the bases of a stack equal the bases of its matrices one at a time, on
either side, for every method and for a leaf that is itself a stack
(``MatrixAxes(batch=...)``), and a sharded stack (``Explicit`` or ``Auto`` FSDP axes)
equals the unsharded one. Tolerances: float32 rounding of different but equivalent
programs (batched and unbatched calls, fused differently).
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
from lordo_jax.local import bases
from tests.references import basis_numpy as ref

RANK = 3
METHODS = [(name, False) for name in bases.ONE_SIDED] + [(name, True) for name in bases.TWO_SIDED]
SHAPES = {"left": (24, 10), "right": (10, 24)}


def _matrices(shape, count, seed=0):
  return [
    jnp.asarray(ref.separated(*shape, RANK + 1, seed=seed + i), jnp.float32) for i in range(count)
  ]


def _close(a, b, atol=2e-5):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), atol=atol)


@pytest.mark.parametrize("side", SHAPES)
@pytest.mark.parametrize(("projection", "two_sided"), METHODS)
def test_the_bases_of_a_stack_are_those_of_its_matrices_alone(projection, two_sided, side):
  method = bases.method(projection, two_sided=two_sided, options=bases.Options(rank=RANK))
  strategy = method.strategy(*SHAPES[side])
  xs = _matrices(SHAPES[side], 3)
  keys = [jax.random.key(i) for i in range(3)]
  # A previous basis to warm-start from (subspace iteration): each matrix's exact one.
  exact = jax.jit(strategy.exact or strategy.compute)
  previous = [
    exact(x + 0.3 * x[::-1], strategy.init(k), k)[0] for x, k in zip(xs, keys, strict=True)
  ]
  compute = jax.jit(strategy.compute)
  alone = [compute(x, p, k) for x, p, k in zip(xs, previous, keys, strict=True)]
  stack = lambda items: jax.tree.map(lambda *leaves: jnp.stack(leaves), *items)  # noqa: E731
  ((together, ok),) = jax.jit(
    lambda x, p, k: method.bases_of_mean([strategy], [x], [p], [k], False, lambda xs: xs)
  )(jnp.stack(xs), stack(previous), jnp.stack(keys))
  assert ok.shape == (3,) and bool(jnp.all(ok))
  for i, (basis, ok_alone) in enumerate(alone):
    assert bool(ok_alone)
    _close(jax.tree.map(lambda b, i=i: b[i], together), basis)


@pytest.mark.parametrize("side", SHAPES)
@pytest.mark.parametrize(("projection", "two_sided"), METHODS)
def test_a_stack_keeps_each_failed_matrix_previous_basis_alone(projection, two_sided, side):
  method = bases.method(projection, two_sided=two_sided, options=bases.Options(rank=RANK))
  strategy = method.strategy(*SHAPES[side])
  xs = _matrices(SHAPES[side], 2)
  xs[1] = xs[1].at[0, 0].set(jnp.nan)
  keys = jnp.stack([jax.random.key(0), jax.random.key(1)])
  previous = jax.tree.map(lambda b: jnp.stack([b, b]), strategy.init(jax.random.key(5)))
  ((basis, ok),) = jax.jit(
    lambda x, p, k: method.bases_of_mean([strategy], [x], [p], [k], False, lambda xs: xs)
  )(jnp.stack(xs), previous, keys)
  assert np.asarray(ok).tolist() == [True, False]
  _close(jax.tree.map(lambda b: b[1], basis), jax.tree.map(lambda b: b[1], previous), atol=0)


def _tx(projection, two_sided=False, matrix_axes=None):
  options = dict(projection=projection, two_sided=two_sided, transport="rotate")
  return lordo_jax.scale_by_low_rank_adam(RANK, refresh_every=2, matrix_axes=matrix_axes, **options)


DETERMINISTIC = [("svd", False), ("subspace_iteration", False), ("dct", False), ("svd", True)]


@pytest.mark.parametrize(("projection", "two_sided"), DETERMINISTIC)
def test_low_rank_adam_on_same_shape_matrices_equals_it_on_each_alone(projection, two_sided):
  """Three same-shape matrices (one refresh group) and one other: their moments and
  bases after 5 steps with 3 refreshes (rotated moments) equal each matrix's alone."""
  names = ["a", "b", "c", "d"]
  shapes = [(24, 10)] * 3 + [(10, 24)]
  params = {
    n: m
    for n, m in zip(names, [_matrices(s, 1, seed=i)[0] for i, s in enumerate(shapes)], strict=True)
  }
  grads = [
    jax.tree.map(lambda x, t=t: jnp.roll(x, t, axis=0) * (1 + 0.1 * t), params) for t in range(5)
  ]
  tx = _tx(projection, two_sided)

  def run(tree_grads):
    state = tx.init(tree_grads[0])
    for g in tree_grads:
      updates, state = jax.jit(tx.update)(g, state)
    return updates, state.moments.matrices()

  together = run(grads)
  for n in names:
    # Under one name: the three matrices of one shape share a program (a leaf's name
    # is not part of its computation).
    alone = run([{"alone": g[n]} for g in grads])
    _close((together[0][n], together[1][n]), (alone[0]["alone"], alone[1]["alone"]), atol=5e-5)


@pytest.mark.parametrize(("projection", "two_sided"), DETERMINISTIC)
def test_a_stacked_leaf_with_batch_axes_equals_its_matrices_as_leaves(projection, two_sided):
  """A scanned model's kernel ``(layers, p, q)`` with ``MatrixAxes(batch=0, rows=1,
  cols=2)``: each layer's matrix has its own basis and moments, and the updates and
  state equal those of the layers as separate 2-D leaves."""
  layers = _matrices((24, 10), 3)
  stacked = {"kernel": jnp.stack(layers)}
  separate = {f"layer{i}": x for i, x in enumerate(layers)}
  grads = [
    lambda tree, t=t: jax.tree.map(lambda x: jnp.roll(x, t, axis=-2) * (1 + 0.1 * t), tree)
    for t in range(5)
  ]
  scanned = _tx(projection, two_sided, {"kernel": lordo_jax.MatrixAxes(batch=0, rows=1, cols=2)})
  plain = _tx(projection, two_sided)

  def run(tx, params):
    state = tx.init(params)
    for g in grads:
      updates, state = jax.jit(tx.update)(g(params), state)
    return updates, state

  stacked_updates, stacked_state = run(scanned, stacked)
  separate_updates, separate_state = run(plain, separate)
  for i in range(3):
    _close(stacked_updates["kernel"][i], separate_updates[f"layer{i}"], atol=5e-5)
    m, want = (
      stacked_state.moments.matrices()["kernel"],
      separate_state.moments.matrices()[f"layer{i}"],
    )
    basis = jax.tree.map(lambda b, i=i: b[i], m.basis)
    _close((basis, m.mu[i], m.nu[i]), (want.basis, want.mu, want.nu), atol=5e-5)


def test_a_stacked_leaf_in_lordo_trains_like_its_layers_as_leaves():
  """The full method, through its public face: ``low_rank_labels`` with a batch axis."""
  layers = _matrices((24, 10), 2)
  stacked = {"kernel": jnp.stack(layers), "bias": jnp.zeros(10)}
  separate = {"layer0": layers[0], "layer1": layers[1], "bias": jnp.zeros(10)}
  labels = {"kernel": lordo_jax.MatrixAxes(batch=0, rows=1, cols=2), "bias": False}
  grads = lambda tree, t: jax.tree.map(lambda x: jnp.cos(x * (t + 1)), tree)  # noqa: E731

  def run(tx, params):
    state = tx.init(params)
    for t in range(6):
      updates, state = jax.jit(tx.update)(grads(params, t), state, params)
      params = optax.apply_updates(params, updates)
    return params

  common = dict(rank=RANK, sync_every=3, projection="subspace_iteration")
  got = run(lordo_jax.lordo(1e-2, low_rank_labels=labels, **common), stacked)
  want = run(lordo_jax.lordo(1e-2, **common), separate)
  for i in range(2):
    _close(got["kernel"][i], want[f"layer{i}"], atol=1e-5)


def _group_params():
  return {f"m{i}": x for i, x in enumerate(_matrices((32, 16), 4))}


def _refreshed(projection, params):
  """The state of low-rank Adam after 3 steps (2 refreshes) on ``params``."""
  tx = _tx(projection)
  state = tx.init(params)
  update = jax.jit(tx.update)
  for t in range(3):
    g = jax.tree.map(lambda x, t=t: x * (1 + 0.1 * t) + 0.01 * t, params)
    _, state = update(g, state)
  return state


@functools.cache
def _unsharded_refreshed(projection):
  """:func:`_refreshed` on the unsharded group: the reference of both axis types."""
  return _refreshed(projection, _group_params())


@pytest.mark.parametrize(
  ("projection", "explicit"),
  [
    ("svd", True),
    ("subspace_iteration", True),
    ("randomized_svd", True),
    ("randomized_svd", False),
  ],
  ids=["svd-Explicit", "subspace_iteration-Explicit", "randomized_svd-Explicit", "Auto"],
)
def test_a_sharded_group_is_refreshed_as_the_unsharded_one(projection, explicit):
  """Same-shape matrices split over an FSDP axis (by rows and by columns) refresh to the
  bases of the unsharded run, the bases split as their matrices are.

  Every method on ``Explicit`` axes, where the types carry the split through the
  method's own code. On ``Auto`` axes the types say nothing: every method traces as
  unsharded (its program is the reference's, partitioned by the compiler), so one
  method, the randomized SVD (random draws and products), stands for all."""
  axis_type = AxisType.Explicit if explicit else AxisType.Auto
  mesh = jax.make_mesh((8,), ("fsdp",), axis_types=(axis_type,))
  params = _group_params()
  specs = {f"m{i}": P("fsdp", None) if i < 2 else P(None, "fsdp") for i in range(4)}
  want = _unsharded_refreshed(projection)
  set_mesh = getattr(jax, "set_mesh", None) or jax.sharding.use_mesh
  with set_mesh(mesh):
    split = {k: jax.device_put(x, NamedSharding(mesh, specs[k])) for k, x in params.items()}
    got = _refreshed(projection, split)
  for k in params:
    _close(got.moments.matrices()[k].basis, want.moments.matrices()[k].basis, atol=5e-5)
    _close(got.moments.matrices()[k].mu, want.moments.matrices()[k].mu, atol=5e-5)
  if explicit and projection != "svd":  # The SVD gathers its matrix; the others never do.
    basis = got.moments.matrices()["m0"].basis
    assert tuple(basis.sharding.spec)[:1] == ("fsdp",)
