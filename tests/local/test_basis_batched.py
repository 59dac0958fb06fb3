"""A batch of matrices is refreshed as each matrix would be alone (every basis method).

The bases (:mod:`lordo_jax.local.bases`) take leading batch axes, and low-rank Adam
stacks the matrices of one shape and layout to refresh them in one batched
computation: the bases of a stack equal the bases of its matrices one at a time, for
every method (a one-sided one on either side), a failed matrix among them too; low-rank
Adam's refresh of a group equals each matrix's alone, a leaf that is itself a stack
(``MatrixAxes(batch=...)``) among them; and a sharded stack (``Explicit`` or ``Auto``
FSDP axes) equals the unsharded one (subspace iteration's on ``Explicit`` axes in
``test_batched_step.py``). Tolerances: float32 rounding of different but equivalent
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
SHAPES = {"left": (24, 10), "right": (10, 24)}
# A one-sided method on either side. A two-sided method has no side (U and V, its code
# the same for p >= q and p < q), so one shape stands for both.
CASES = [(name, False, side) for name in bases.ONE_SIDED for side in SHAPES] + [
  (name, True, "left") for name in bases.TWO_SIDED
]


def _matrices(shape, count, seed=0):
  return [
    jnp.asarray(ref.separated(*shape, RANK + 1, seed=seed + i), jnp.float32) for i in range(count)
  ]


def _close(a, b, atol=2e-5):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), atol=atol)


@pytest.mark.parametrize(("projection", "two_sided", "side"), CASES)
def test_the_bases_of_a_stack_are_those_of_its_matrices_alone(projection, two_sided, side):
  """Four matrices refreshed in one batched call, the last with a NaN: each gets the
  basis and ``ok`` it gets alone; the failed one keeps its previous basis, and the others
  do not notice it."""
  method = bases.method(projection, two_sided=two_sided, options=bases.Options(rank=RANK))
  strategy = method.strategy(*SHAPES[side])
  xs = _matrices(SHAPES[side], 4)
  keys = [jax.random.key(i) for i in range(4)]
  # A previous basis to warm-start from (subspace iteration): each matrix's exact one.
  exact = jax.jit(strategy.exact or strategy.compute)
  previous = [
    exact(x + 0.3 * x[::-1], strategy.init(k), k)[0] for x, k in zip(xs, keys, strict=True)
  ]
  xs[3] = xs[3].at[0, 0].set(jnp.nan)
  compute = jax.jit(strategy.compute)
  alone = [compute(x, p, k) for x, p, k in zip(xs, previous, keys, strict=True)]
  stack = lambda items: jax.tree.map(lambda *leaves: jnp.stack(leaves), *items)  # noqa: E731
  ((together, ok),) = jax.jit(
    lambda x, p, k: method.bases_of_mean([strategy], [x], [p], [k], False, lambda xs: xs)
  )(jnp.stack(xs), stack(previous), jnp.stack(keys))
  assert [bool(ok_alone) for _, ok_alone in alone] == [True, True, True, False]
  assert np.asarray(ok).tolist() == [True, True, True, False]
  for i, (basis, _) in enumerate(alone):
    _close(jax.tree.map(lambda b, i=i: b[i], together), basis)
  _close(jax.tree.map(lambda b: b[3], together), previous[3], atol=0)


def _tx(projection, two_sided=False, matrix_axes=None):
  options = dict(projection=projection, two_sided=two_sided, transport="rotate")
  return lordo_jax.scale_by_low_rank_adam(RANK, refresh_every=2, matrix_axes=matrix_axes, **options)


# A method whose bases do not depend on a matrix's key (its place in the tree), of each
# kind of basis the refresh carries the moments into (a one-sided Q: subspace iteration,
# LoRDO's default, whose first basis is the SVD's; the DCT's frequencies; a two-sided U
# and V). How each method computes a stack's bases is the test above's.
DETERMINISTIC = [("subspace_iteration", False), ("dct", False), ("svd", True)]


@pytest.mark.parametrize(("projection", "two_sided"), DETERMINISTIC)
def test_low_rank_adam_on_a_refresh_group_equals_it_on_each_matrix_alone(projection, two_sided):
  """One refresh group of five 24 x 10 matrices, two 2-D leaves and a scanned model's
  kernel ``(layers, p, q)`` with ``MatrixAxes(batch=0, rows=1, cols=2)`` holding three,
  and a 10 x 24 matrix alone: the updates, bases and moments after 5 steps with 3
  refreshes (rotated moments) equal each matrix's alone. So each layer of the kernel
  has its own basis and moments, as it would as a 2-D leaf."""
  params = {
    "a": _matrices((24, 10), 1, seed=0)[0],
    "b": _matrices((24, 10), 1, seed=1)[0],
    "kernel": jnp.stack(_matrices((24, 10), 3, seed=2)),
    "d": _matrices((10, 24), 1, seed=5)[0],
  }
  axes = {name: lordo_jax.MatrixAxes() for name in params}
  axes["kernel"] = lordo_jax.MatrixAxes(batch=0, rows=1, cols=2)

  def steps(tx):
    """5 steps of ``tx`` from its ``init``: one program, the gradients computed in it."""
    update = jax.jit(
      lambda params, state, t: tx.update(
        jax.tree.map(lambda x: jnp.roll(x, t, axis=-2) * (1 + 0.1 * t), params), state
      )
    )

    def run(params):
      state = tx.init(params)
      for t in range(5):
        updates, state = update(params, state, t)
      return updates, jax.device_get(state.moments).matrices()

    return run

  updates, moments = steps(_tx(projection, two_sided, axes))(params)
  matrices = [("a", None), ("b", None), ("d", None)] + [("kernel", i) for i in range(3)]
  alone = steps(_tx(projection, two_sided))
  for name, layer in matrices:
    pick = (lambda x: x) if layer is None else (lambda x, i=layer: x[i])  # noqa: E731
    # Under one name: the matrices of one shape share a program (a leaf's name is not
    # part of its computation).
    alone_updates, alone_moments = alone({"alone": pick(params[name])})
    m, want = moments[name], alone_moments["alone"]
    got = (pick(updates[name]), jax.tree.map(pick, m.basis), pick(m.mu), pick(m.nu))
    _close(got, (alone_updates["alone"], want.basis, want.mu, want.nu), atol=5e-5)


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


def _on_host(state):
  """The moments per matrix, of a state fetched to the host (no program for slicing the
  sharded stacks)."""
  return jax.device_get(state.moments).matrices()


@pytest.mark.parametrize(
  ("projection", "explicit"),
  [("svd", True), ("randomized_svd", True), ("randomized_svd", False)],
  ids=["svd-Explicit", "randomized_svd-Explicit", "Auto"],
)
def test_a_sharded_group_is_refreshed_as_the_unsharded_one(projection, explicit):
  """Same-shape matrices split over an FSDP axis (by rows and by columns) refresh to the
  bases of the unsharded run, the bases split as their matrices are.

  On ``Explicit`` axes the types carry the split through the method's own code: the SVD
  (which gathers its matrix) and the randomized SVD here; subspace iteration, the
  default, in ``test_batched_step.py``, whose sharded per-matrix run is this test's. On
  ``Auto`` axes the types say nothing: every method traces as unsharded (its program is
  the reference's, partitioned by the compiler), so one method, the randomized SVD
  (random draws and products), stands for all."""
  axis_type = AxisType.Explicit if explicit else AxisType.Auto
  mesh = jax.make_mesh((8,), ("fsdp",), axis_types=(axis_type,))
  params = _group_params()
  specs = {f"m{i}": P("fsdp", None) if i < 2 else P(None, "fsdp") for i in range(4)}
  want = _on_host(_unsharded_refreshed(projection))
  set_mesh = getattr(jax, "set_mesh", None) or jax.sharding.use_mesh
  with set_mesh(mesh):
    split = {k: jax.device_put(x, NamedSharding(mesh, specs[k])) for k, x in params.items()}
    got = _refreshed(projection, split)
  moments = _on_host(got)
  for k in params:
    _close(moments[k].basis, want[k].basis, atol=5e-5)
    _close(moments[k].mu, want[k].mu, atol=5e-5)
  if explicit and projection != "svd":  # The SVD gathers its matrix; the others never do.
    basis = got.moments.matrices()["m0"].basis
    assert tuple(basis.sharding.spec)[:1] == ("fsdp",)
