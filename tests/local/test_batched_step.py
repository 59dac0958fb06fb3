"""A local step batched by shape group equals the step taken one matrix at a time.

Compiled for an accelerator, low-rank Adam projects and steps the matrices of one shape
and layout in one batched computation (:func:`lordo_jax.local._shape_groups.step_grouped`),
so a transformer's layers cost a few kernels instead of a few per matrix; compiled for a
CPU it keeps one matrix at a time, where stacking the gradients would cost more than it
saves. Here, on a CPU, the batched step is forced (``FORCED_STEP_GROUPING = "batched"``)
and compared with the per-matrix one: every kind of basis the step reads (one-sided,
DCT, two-sided), both sides, 2-D and stacked leaves, error feedback and the authors'
variants, low-rank DDP's
``project``/``step`` entry points, ``lordo`` itself, and FSDP-split matrices on
``Explicit`` and ``Auto`` meshes.
The compiled programs are read for the products: two per group, not two per matrix.
Tolerances: float32 rounding of a batched and an unbatched program.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import lordo_jax
from lordo_jax.local import _shape_groups as shape_groups
from tests.references import basis_numpy as ref

RANK = 3
STEPS = 5
# Three 24 x 10 matrices, a stack of two more (a scanned leaf), one stored transposed
# (its matrix also 24 x 10): one group of 6 matrices; and a 10 x 24 matrix alone.
AXES = {
  **{name: lordo_jax.MatrixAxes() for name in ("a", "b", "c", "wide")},
  "stacked": lordo_jax.MatrixAxes(batch=0, rows=1, cols=2),
  "transposed": lordo_jax.MatrixAxes(rows=1, cols=0),
}
VARIANTS = {
  "plain": {},
  "error_fed_vector_right": dict(
    error_feedback=True,
    full_rank_numerator="error_fed",
    omega=0.5,
    mu=2.0,
    full_rank_scale="vector",
    side="right",
  ),
  "bfloat16_error_scalar": dict(error_feedback=True, error_feedback_dtype="bfloat16", omega=0.7),
  "qh_momentum": dict(qh_nu=0.7, low_rank_term="momentum", omega=0.8),
}


def _matrix(shape, seed):
  return jnp.asarray(ref.separated(*shape, RANK + 1, seed=seed), jnp.float32)


def _params():
  return {
    "a": _matrix((24, 10), 0),
    "b": _matrix((24, 10), 1),
    "c": _matrix((24, 10), 2),
    "stacked": jnp.stack([_matrix((24, 10), 3), _matrix((24, 10), 4)]),
    "transposed": _matrix((24, 10), 5).T,
    "wide": _matrix((10, 24), 6),
  }


def _grads(params, t):
  return jax.tree.map(lambda x: jnp.cos(x * (t + 1)) + 0.1 * t * x, params)


def _close(a, b, rtol=1e-5, atol=1e-6):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    assert x.shape == y.shape and x.dtype == y.dtype
    np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), rtol, atol)


def _trajectory(tx, params, steps=STEPS):
  """Every step's updates and state of ``tx`` on :func:`_grads` (computed in the step's
  program), traced anew (a new function: jit's cache would give the program the policy
  of an earlier trace)."""
  state, out = tx.init(params), []
  update = jax.jit(lambda params, state, t: tx.update(_grads(params, t), state, params))
  for t in range(steps):
    updates, state = update(params, state, t)
    out.append((updates, state))
  return out


def test_a_platform_the_policy_names_steps_one_matrix_at_a_time(monkeypatch):
  """The policy itself: one group per matrix on a platform it names (this CPU, run
  eagerly: the platform is known), the shape groups when forced."""
  batched = shape_groups.groups([jnp.zeros((4, 3)), jnp.zeros((4, 3)), jnp.zeros((3, 4))])
  seen = []

  def step(groups):
    seen.append(groups)
    return jnp.zeros(())

  assert "cpu" in shape_groups.PER_MATRIX_STEP_PLATFORMS
  shape_groups.step_grouped(batched, step)
  assert seen.pop() == [[0], [1], [2]]
  monkeypatch.setattr(shape_groups, "FORCED_STEP_GROUPING", "batched")
  shape_groups.step_grouped(batched, step)
  assert seen == [[[0, 1], [2]]]


# The step reads a basis through its strategy's dense / project / unproject, and these
# are one code per kind of basis: a one-sided Q (the SVD, subspace iteration and the
# randomized SVD share it), the DCT's frequencies, and a two-sided U and V (both two-sided
# methods). How a method refreshes is no part of the step: every refresh is batched by
# shape group, batched step or not (``test_basis_batched.py`` checks a group's refresh
# against each matrix's alone). So each kind of basis is stepped here, with the cheapest
# refresh of its kind, and every variant with a one-sided and a two-sided basis (a
# two-sided projection has no side and a scalar full-rank scale): the batching of the
# step depends on the basis (projected on and from) and on the variant (its moments and
# error buffers), not on the pair. Subspace iteration, LoRDO's default, is the method of
# the LoRDO and FSDP tests below.
CASES = [
  ("svd", False, "plain"),
  ("svd", False, "error_fed_vector_right"),
  ("svd", False, "bfloat16_error_scalar"),
  ("dct", False, "qh_momentum"),
  ("svd", True, "bfloat16_error_scalar"),
  ("svd", True, "qh_momentum"),
]


@pytest.mark.parametrize(("projection", "two_sided", "variant"), CASES)
def test_a_batched_step_equals_the_per_matrix_step(projection, two_sided, variant, monkeypatch):
  """Updates, bases, moments and error buffers at every one of 5 steps (3 refreshes,
  moments rotated), batched and per matrix."""
  options = VARIANTS[variant]
  tx = lordo_jax.scale_by_low_rank_adam(
    RANK, refresh_every=2, matrix_axes=AXES, projection=projection, two_sided=two_sided, **options
  )
  params = _params()
  per_matrix = _trajectory(tx, params)
  monkeypatch.setattr(shape_groups, "FORCED_STEP_GROUPING", "batched")
  together = _trajectory(tx, params)
  for got, want in zip(together, per_matrix, strict=True):
    _close(got, want)


def _products(tx, params) -> int:
  """The dot products in the compiled update of ``tx`` after its first step (lowered
  for the state's shapes: the first step is traced, not run)."""
  state = tx.init(params)
  grads = jax.eval_shape(_grads, params, 1)
  _, state = jax.eval_shape(tx.update, grads, state, params)
  text = jax.jit(lambda *args: tx.update(*args)).lower(grads, state, params).compile().as_text()
  return len(re.findall(r" dot\(", text))


def test_the_compiled_step_has_two_products_per_group_not_per_matrix(monkeypatch):
  """7 matrices in 6 leaves (one a stack of 2), 6 of one shape, refreshed never: the
  local step's products are project and unproject once per group (4) when batched,
  once per leaf (12) on this CPU's own policy."""
  tx = lordo_jax.scale_by_low_rank_adam(
    RANK, refresh_every=None, init_projection="random", seed=0, matrix_axes=AXES
  )
  params = _params()
  assert _products(tx, params) == 2 * 6
  monkeypatch.setattr(shape_groups, "FORCED_STEP_GROUPING", "batched")
  assert _products(tx, params) == 2 * 2


def test_low_rank_ddp_projected_steps_batched_as_per_matrix(monkeypatch):
  """``communicate="projected"`` takes the step apart (``project``, then ``step`` on
  the coordinates): the same iterates batched and per matrix."""
  tx = lordo_jax.low_rank_ddp(
    1e-2, rank=RANK, refresh_every=2, communicate="projected", low_rank_labels=AXES
  )
  params = _params()
  per_matrix = _trajectory(tx, params)
  monkeypatch.setattr(shape_groups, "FORCED_STEP_GROUPING", "batched")
  _close(_trajectory(tx, params), per_matrix)


def test_lordo_trains_batched_as_per_matrix(monkeypatch):
  """The whole method, rounds of 3 steps with weight decay: the parameters after 7
  steps. Batched, each step jitted with ``round_phase``'s phase (its three programs);
  per matrix, the one program of every phase, whose numbers the phased programs equal
  to float32 rounding (``tests/round/test_round_phase.py``)."""
  tx = lordo_jax.lordo(1e-2, rank=RANK, sync_every=3, weight_decay=0.1, low_rank_labels=AXES)

  def train(phased):
    params = _params()
    state = tx.init(params)
    step = jax.jit(
      lambda p, s, t, phase: tx.update(_grads(p, t), s, p, round_phase=phase), static_argnums=3
    )
    for t in range(7):
      phase = lordo_jax.round_phase(t, sync_every=3) if phased else None
      updates, state = step(params, state, t, phase)
      params = optax.apply_updates(params, updates)
    return params

  per_matrix = train(phased=False)
  monkeypatch.setattr(shape_groups, "FORCED_STEP_GROUPING", "batched")
  _close(train(phased=True), per_matrix, rtol=1e-5, atol=1e-6)


def _group_params():
  return {f"m{i}": _matrix((32, 16), i) for i in range(4)}


def _group_tx(projection):
  return lordo_jax.scale_by_low_rank_adam(RANK, refresh_every=2, projection=projection)


@functools.cache
def _unsharded_group_trajectory(projection):
  """3 steps of :func:`_group_tx` on the unsharded group, per matrix: the reference."""
  return _trajectory(_group_tx(projection), _group_params(), steps=3)


def _on_host(state):
  """The moments per matrix, of a state fetched to the host (no program for slicing the
  sharded stacks)."""
  return jax.device_get(state.moments).matrices()


@pytest.mark.parametrize("explicit", [True, False], ids=["Explicit", "Auto"])
def test_a_sharded_group_steps_batched_as_the_unsharded_per_matrix_step(explicit, monkeypatch):
  """Same-shape matrices split over an FSDP axis, batched and per matrix: the updates and
  moments of the unsharded per-matrix run, split alike by both.

  ``Explicit``: two split by rows, two by columns (two groups: the types say how each
  is split), refreshed by subspace iteration, whose bases stay split as their matrices
  are, so the step projects split gradients on split bases. This is subspace
  iteration's sharded refresh; the other methods' are in ``test_basis_batched.py``.
  ``Auto``: the types say nothing, so same-shape matrices form one group however they
  are split; here split alike, as a model's layers are. On ``Auto`` axes every method
  traces as unsharded (``test_basis_batched.py``), so the cheapest, the SVD, stands for
  all."""
  axis_type = AxisType.Explicit if explicit else AxisType.Auto
  mesh = jax.make_mesh((8,), ("fsdp",), axis_types=(axis_type,))
  params = _group_params()
  by_rows = {0, 1} if explicit else set()
  specs = {f"m{i}": P("fsdp", None) if i in by_rows else P(None, "fsdp") for i in range(4)}
  projection = "subspace_iteration" if explicit else "svd"
  tx = _group_tx(projection)
  set_mesh = getattr(jax, "set_mesh", None) or jax.sharding.use_mesh

  def sharded():
    with set_mesh(mesh):
      split = {k: jax.device_put(x, NamedSharding(mesh, specs[k])) for k, x in params.items()}
      return _trajectory(tx, split, steps=3)

  want, sharded_per_matrix = _unsharded_group_trajectory(projection), sharded()
  monkeypatch.setattr(shape_groups, "FORCED_STEP_GROUPING", "batched")
  got = sharded()
  for run in (sharded_per_matrix, got):
    for (updates, state), (want_updates, want_state) in zip(run, want, strict=True):
      _close(updates, want_updates, atol=5e-6)
      _close(_on_host(state), _on_host(want_state), atol=5e-6)
  shardings = lambda run: [x.sharding for x in jax.tree.leaves(run[-1])]  # noqa: E731
  assert shardings(got) == shardings(sharded_per_matrix)
  # The column-split matrices' updates and moments stay split, batched or not.
  assert tuple(got[-1][0]["m2"].sharding.spec) == (None, "fsdp")
  moments = got[-1][1].moments.matrices()
  assert tuple(moments["m2"].mu.sharding.spec) == (None, "fsdp")
  if explicit:
    assert tuple(moments["m0"].basis.sharding.spec)[:1] == ("fsdp",)
