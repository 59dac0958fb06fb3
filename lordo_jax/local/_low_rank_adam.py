r"""Low-rank Adam: :func:`scale_by_low_rank_adam`, moments in an r-dimensional subspace.

The local step of MATH.md §3 for every matrix leaf, with error feedback, the moments'
transport into a refreshed basis (MATH.md §4.6) and the quasi-hyperbolic full-rank
term; the bases are strategies of :mod:`lordo_jax.local.bases`. It never
communicates: :func:`lordo_jax.synchronize` refreshes its bases from the averaged
pseudo-gradient through :attr:`LowRankAdam.refresh`, and low-rank DDP averages
between its pieces (:mod:`lordo_jax.comm._projected_mean`).
"""

import functools
import math
from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from lordo_jax import _checks as checks
from lordo_jax import _keywords as keywords
from lordo_jax import _sharded as sharded
from lordo_jax import _tree_structure as state_structure
from lordo_jax.local import _low_rank_options as low_rank_options
from lordo_jax.local import _moment_groups as moment_groups
from lordo_jax.local import _moment_transport as moment_transport
from lordo_jax.local import _routing as routing
from lordo_jax.local import _shape_groups as shape_groups
from lordo_jax.local import bases as bases_lib
from lordo_jax.local._moment_groups import GroupedMoments
from lordo_jax.local._quasi_hyperbolic import full_rank_scale
from lordo_jax.local._quasi_hyperbolic import qh_momentum
from lordo_jax.local._quasi_hyperbolic import scaled_mix
from lordo_jax.local.bases.dct import DCTBasis
from lordo_jax.local.bases.two_sided import TwoSidedBasis

INIT_PROJECTIONS = ("gradient", "random", "external")
# What optax.tree_utils.tree_map_params calls init on: a pytree of no leaf, in place of
# the params (optax.masked tells it apart by this class too).
_ParamsPlaceholder = optax.tree_utils._state_utils._ParamsPlaceholder


class LowRankMoments(NamedTuple):
  """Low-rank Adam state of one matrix (MATH.md §2's shapes), or of a shape group's
  matrices stacked along a leading axis (:class:`GroupedMoments`)."""

  # Q (p x r left, q x r right) float32, a DCTBasis, or a TwoSidedBasis (U and V).
  basis: jax.Array | DCTBasis | TwoSidedBasis
  mu: jax.Array  # First moment u, float32: r x q (left), p x r (right), r x r (two-sided).
  nu: jax.Array  # Second moment v, float32, shaped like u.
  # Error-feedback buffer E, p x q (the leaf's matrix); () when off: no leaf to store,
  # copy or checkpoint (a (0,) array was copied into each matrix's output every step).
  error: jax.Array | tuple


class LowRankAdamState(NamedTuple):
  """State of :func:`scale_by_low_rank_adam`."""

  count: jax.Array  # int32 scalar: steps taken.
  # LowRankMoments per shape group, stacked; .matrices(): a tree like params, per matrix.
  moments: GroupedMoments
  refresh_failures: jax.Array  # int32 scalar: refreshes that kept the old basis.


class Projected(NamedTuple):
  """One step's projection (:attr:`LowRankAdam.project`), trees like the params."""

  coordinates: Any  # c = project(Q, G + E) per matrix, float32.
  errors: Any  # The new error buffers E (unchanged without error feedback).
  bases: Any  # Each matrix's basis as project and unproject take it (formed once).


class LowRankAdam(NamedTuple):
  """An optax transformation with entry points into its step.

  ``refresh(state, source, *, first=False, mean=identity)`` recomputes every
  matrix's basis from the matching leaf of ``source`` (a tree like params) and
  transports the moments. ``first=True`` marks a run's first basis: exact (SVD for
  ``subspace_iteration``) and no transport, since the moments are still zero.
  ``mean`` averages lists of arrays over the workers: the bases are then those of
  the workers' mean source, and what is averaged (the source, or a randomized SVD's
  sketches) is the method's choice.

  ``update`` is ``step(updates, s, project(updates, s))`` with ``s`` the state after
  the refresh ``refresh_due(count)`` calls for (``None``: never): a caller may
  replace the coordinates between the two.
  """

  init: Callable[[Any], "LowRankAdamState"]  # params -> the state before step 1.
  update: Callable[..., tuple[Any, "LowRankAdamState"]]  # optax's update.
  refresh: Callable[..., "LowRankAdamState"]  # (state, source, *, first, mean) -> state.
  refresh_due: Callable[[jax.Array], jax.Array | None]  # count -> bool array, or None.
  project: Callable[[Any, "LowRankAdamState"], "Projected"]  # (updates, state) -> Projected.
  # (updates, state, projected) -> (updates, state): the step on given coordinates.
  step: Callable[[Any, "LowRankAdamState", "Projected"], tuple[Any, "LowRankAdamState"]]


def _is_node(x) -> bool:
  return isinstance(x, (LowRankMoments, optax.MaskedNode))


def map_matrices(fn, moments, *trees):
  """``fn(moments_leaf, *leaves)`` at every matrix; MaskedNode elsewhere."""

  def one(m, *xs):
    return m if isinstance(m, optax.MaskedNode) else fn(m, *xs)

  return jax.tree.map(one, moments, *trees, is_leaf=_is_node)


def _listed(moments, tree) -> list:
  """The matrices' entries of ``tree``, in order."""
  entries = []
  map_matrices(lambda m, x: entries.append(x), moments, tree)
  return entries


class _Config(NamedTuple):
  """One :func:`scale_by_low_rank_adam`: its step's options, refresh policy and method."""

  options: low_rank_options.LowRankOptions
  refresh_every: int | None
  init_projection: str
  seed: int
  matrix_axes: Any
  method: bases_lib.Method


def _axes_of(c: _Config, tree):
  """The :class:`~lordo_jax.local._routing.MatrixAxes` of every leaf; an error for a non-matrix."""
  axes = routing.route(tree, c.matrix_axes, c.options.rank)

  def check(path, a):
    if a == routing.FULL_RANK:
      raise ValueError(
        f"scale_by_low_rank_adam got the leaf {jax.tree_util.keystr(path)}, "
        f"which is not a matrix with min(p, q) > rank={c.options.rank}. Send such leaves "
        "to another transformation with optax.partition (lordo_jax.lordo does), "
        "or label them with matrix_axes."
      )
    return a

  is_masked = lambda x: isinstance(x, optax.MaskedNode)  # noqa: E731
  return jax.tree_util.tree_map_with_path(check, axes, is_leaf=is_masked)


def _strategy(c: _Config, x, axes) -> bases_lib.BasisStrategy:
  """The basis strategy of the leaf ``x`` seen as a ``p x q`` matrix."""
  return c.method.strategy(*routing.matrix_shape(x.shape, axes))


def _matrix_spec(x, axes) -> tuple:
  """The mesh axes of the rows and columns of a leaf's matrix, where they are two axes
  of the leaf in order (after its batch axes); a reshaped leaf's matrix is taken as whole."""
  batch = len(axes.batch_axes(x.ndim))
  if x.ndim == batch + 2 and axes.normalized(x.ndim) == ((batch,), (batch + 1,)):
    return sharded.spec_of(x)[batch:]
  return (None, None)


def _per_matrix(key: jax.Array, batch: tuple[int, ...]) -> jax.Array:
  """One key per matrix of a stack of ``batch`` matrices, from ``key`` (itself for one)."""
  if not batch:
    return key
  return jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(math.prod(batch))).reshape(batch)


def _init_basis(s: bases_lib.BasisStrategy, key, batch: tuple[int, ...]):
  """The basis ``init`` gives (random from ``key``, or a placeholder), for each matrix of
  a stack of ``batch`` matrices (each its own key)."""
  if not batch:
    return s.init(key)
  if key is None:
    return jax.tree.map(lambda b: jnp.broadcast_to(b, batch + b.shape), s.init(None))
  bases = jax.vmap(s.init)(_per_matrix(key, batch).reshape(-1))
  return jax.tree.map(lambda b: b.reshape(batch + b.shape[1:]), bases)


def _init_leaf(c: _Config, x, axes, key) -> LowRankMoments:
  s = _strategy(c, x, axes)
  batch = routing.batch_shape(x.shape, axes)
  # Sharded like the matrix (Explicit mesh axes); two buffers, so a caller may donate.
  spec = _matrix_spec(x, axes)
  basis = _init_basis(s, key if c.init_projection == "random" else None, batch)
  basis_spec = s.basis_spec(x) if x.ndim == 2 and spec != (None, None) else None
  basis = jax.tree.map(lambda b: sharded.place(b, basis_spec, x), basis)
  unsplit = (None,) * len(batch)
  shape, coordinates_spec = batch + s.coordinates_shape, unsplit + s.coordinates_spec(spec)
  mu = sharded.zeros(shape, jnp.float32, coordinates_spec, x)
  nu = sharded.zeros(shape, jnp.float32, coordinates_spec, x)
  if c.options.error_feedback:
    shape = batch + routing.matrix_shape(x.shape, axes)
    error = sharded.zeros(shape, jnp.dtype(c.options.error_feedback_dtype), unsplit + spec, x)
  else:
    error = ()
  return LowRankMoments(basis, mu, nu, error)


def _init(c: _Config, params) -> LowRankAdamState:
  if isinstance(params, _ParamsPlaceholder):
    # optax.tree_utils.tree_map_params's stand-in for the params (optax.masked passes it
    # on alike): no shapes, so no groups; the moments are where it is, and its function
    # maps every leaf of them, as it did a state kept per matrix (and GaLore's).
    zero = jnp.zeros([], jnp.int32)
    return LowRankAdamState(count=zero, moments=params, refresh_failures=zero)
  # The moments are not shaped like their matrix: built from the values, so that no Flax
  # Variable (and its parameter's metadata) holds them (lordo_jax/_tree_structure.py).
  params = state_structure.values(params)
  is_masked = lambda x: isinstance(x, optax.MaskedNode)  # noqa: E731
  leaves, treedef = jax.tree.flatten(params, is_leaf=is_masked)
  keys = list(jax.random.split(jax.random.key(c.seed), max(len(leaves), 1)))
  keyed = jax.tree.unflatten(treedef, keys[: len(leaves)])
  axes = _axes_of(c, params)
  moments = jax.tree.map(
    lambda x, a, k: x if is_masked(x) else _init_leaf(c, x, a, k),
    params,
    axes,
    keyed,
    is_leaf=is_masked,
  )
  matrices = [
    routing.to_matrix(x, a)
    for x, a in zip(_listed(moments, params), _listed(moments, axes), strict=True)
  ]
  grouped = GroupedMoments.of(
    moments,
    lambda x: isinstance(x, LowRankMoments),
    shape_groups.groups(matrices),
    [x.shape[:-2] for x in matrices],
  )
  return LowRankAdamState(
    count=jnp.zeros([], jnp.int32),
    moments=grouped,
    refresh_failures=jnp.zeros([], jnp.int32),
  )


def _matrix_keys(c: _Config, moments: GroupedMoments, count, present: list[int]) -> dict:
  """One PRNG key per matrix of ``present`` (an array of them for a leaf holding a batch
  of matrices), from the seed, the step and the matrix's leaf: alike on every worker."""
  base = jax.random.fold_in(jax.random.key(c.seed + 1), count)
  layout = moments.layout
  return {
    i: _per_matrix(jax.random.fold_in(base, layout.matrices[i]), layout.batch_shapes[i])
    for i in present
  }


class _Refreshed(NamedTuple):
  """The part of a matrix's :class:`LowRankMoments` a refresh changes."""

  basis: Any
  mu: jax.Array
  nu: jax.Array


def _transported(c: _Config, s, m: _Refreshed, basis, ok, count, first) -> _Refreshed:
  """The moments of a batch of matrices (one ``ok`` each) carried into their new bases
  (``transport``)."""
  if first is True:
    return m._replace(basis=basis)
  new_mu, new_nu = m.mu, m.nu
  per_matrix = lambda flag: jnp.reshape(flag, jnp.shape(flag) + (1, 1))  # noqa: E731
  if c.options.transport == "rotate":
    rotated = moment_transport.rotate_moments(
      s, m.mu, m.nu, basis, m.basis, count, c.options.b1, c.options.b2
    )
    unchanged = per_matrix(jnp.logical_or(first, ~ok))
    new_mu = jnp.where(unchanged, m.mu, rotated[0])
    new_nu = jnp.where(unchanged, m.nu, rotated[1])
  elif c.options.transport == "reset":
    new_mu = jnp.where(per_matrix(ok), jnp.zeros_like(m.mu), m.mu)
    new_nu = jnp.where(per_matrix(ok), jnp.zeros_like(m.nu), m.nu)
  return _Refreshed(basis, new_mu, new_nu)


def _refresh(c: _Config, state, source, *, first=False, mean=lambda xs: xs) -> LowRankAdamState:
  """:attr:`LowRankAdam.refresh`: new bases from ``source`` (its workers' ``mean``); a
  matrix whose ``source`` leaf is ``optax.MaskedNode`` keeps its basis and moments.

  Each shape group's matrices (those of them in ``source``) are refreshed, moments and
  all, in one batched computation, on the group's stacks.
  """
  source = state_structure.values(source)
  moments: GroupedMoments = state.moments
  leaves = moments.leaves_of(source)
  present = [i for i, x in enumerate(leaves) if not isinstance(x, optax.MaskedNode)]
  axes = moments.leaves_of(_axes_of(c, moments.tree_of(leaves)))
  matrices = {i: routing.to_matrix(leaves[i], axes[i]) for i in present}
  keys = _matrix_keys(c, moments, state.count, present)
  batch_shapes = moments.layout.batch_shapes
  groups = [[i for i in group if i in matrices] for group in moments.layout.groups]
  groups = [group for group in groups if group]

  def stacked(items, group: list[int]):  # Along one axis, a group of one matrix too.
    return shape_groups.stack([items[i] for i in group], [batch_shapes[i] for i in group])

  def flat(part, group: list[int]):  # A group's state as stacked() stacks it.
    return part if len(group) > 1 else stacked({group[0]: part}, group)

  entries = [flat(moments.take(group), group) for group in groups]
  strategies = [c.method.strategy(*matrices[group[0]].shape[-2:]) for group in groups]
  results = c.method.bases_of_mean(
    strategies,
    [stacked(matrices, group) for group in groups],
    [entry.basis for entry in entries],
    [stacked(keys, group) for group in groups],
    first,
    mean,
  )
  parts, failures = {}, jnp.zeros([], jnp.int32)
  for s, group, entry, (basis, ok) in zip(strategies, groups, entries, results, strict=True):
    old = _Refreshed(entry.basis, entry.mu, entry.nu)
    moved = LowRankMoments(*_transported(c, s, old, basis, ok, state.count, first), entry.error)
    if len(group) == 1:
      moved = shape_groups.unstack(moved, [batch_shapes[group[0]]])[0]
    parts[tuple(group)] = moved
    failures = failures + jnp.sum((~ok).astype(jnp.int32))
  return state._replace(
    moments=moments.put(parts), refresh_failures=state.refresh_failures + failures
  )


def _refresh_due(c: _Config, count):
  """Whether the step ``count`` refreshes: 1, T + 1, 2T + 1, ... and/or 1; None: never."""
  now = None
  if c.refresh_every is not None:
    now = (count - 1) % c.refresh_every == 0
  if c.init_projection == "gradient":
    now = count == 1 if now is None else now | (count == 1)
  return now


class _Listed(NamedTuple):
  """A step's matrices in leaf order, and the groups of them it steps at once."""

  moments: GroupedMoments  # The state, stored per shape group.
  leaves: list  # The updates' leaves.
  axes: list  # Their MatrixAxes.
  matrices: list  # Their (*batch, p, q) matrices.
  groups: list[list[int]]  # Shape groups (batched), or one matrix each (per matrix).

  def stacked(self, items, group: list[int]):
    """``items`` (one tree per matrix) of ``group`` along one leading axis, as a group's
    state is stored (:func:`._moment_groups.stacked`)."""
    shapes = [self.matrices[i].shape[:-2] for i in group]
    return moment_groups.stacked([items[i] for i in group], shapes)

  def unstacked(self, tree, group: list[int]) -> list:
    """Inverse of :meth:`stacked`: one tree per matrix of ``group``."""
    return moment_groups.unstacked(tree, [self.matrices[i].shape[:-2] for i in group])


def _grouped(c: _Config, state, updates, compute: Callable[[_Listed], Any]) -> Any:
  """``compute(listed)``, ``listed`` the matrices of ``updates`` grouped as the platform
  the program is compiled for steps them (:func:`._shape_groups.step_grouped`: traced
  once per grouping where they differ). The one place a local step's grouping is chosen:
  ``compute`` gives a tree that does not depend on it."""
  moments: GroupedMoments = state.moments
  axes = moments.leaves_of(_axes_of(c, updates))
  leaves = moments.leaves_of(updates)
  matrices = [routing.to_matrix(g, a) for g, a in zip(leaves, axes, strict=True)]
  return shape_groups.step_grouped(
    [list(group) for group in moments.layout.groups],
    lambda groups: compute(_Listed(moments, leaves, axes, matrices, groups)),
  )


class _GroupProjection(NamedTuple):
  """:class:`Projected` of one shape group, stacked."""

  coordinates: jax.Array
  errors: jax.Array | None  # None without error feedback.
  bases: Any


def _projected_by_group(c: _Config, listed: _Listed) -> list[_GroupProjection]:
  """``c = project(Q, G + E)`` and ``E = A - unproject(Q, c)``, one group at a time."""
  projected = []
  for group in listed.groups:
    s = c.method.strategy(*listed.matrices[group[0]].shape[-2:])
    kept = listed.moments.take(group)
    q = s.dense(kept.basis)
    fed = listed.stacked(listed.matrices, group).astype(jnp.float32)
    if not c.options.error_feedback:
      projected.append(_GroupProjection(s.project(q, fed), None, q))
      continue
    fed = fed + kept.error.astype(jnp.float32)
    coordinates = s.project(q, fed)
    new_errors = (fed - s.unproject(q, coordinates)).astype(kept.error.dtype)
    projected.append(_GroupProjection(coordinates, new_errors, q))
  return projected


def _stepped_by_group(c: _Config, listed: _Listed, count, projected: list[_GroupProjection]):
  """Every matrix's direction, and each group's new state, from its coordinates.

  The moments of a group are updated on its stacks, in place; the full-rank term is
  formed from each matrix's own gradient, so that the stacked gradient is dead after
  the projection (its buffer then holds the low-rank direction).
  """
  o = c.options
  directions, parts = [None] * len(listed.leaves), {}
  for group, p in zip(listed.groups, projected, strict=True):
    s = c.method.strategy(*listed.matrices[group[0]].shape[-2:])
    kept = listed.moments.take(group)
    new_mu = o.b1 * kept.mu + (1 - o.b1) * p.coordinates
    new_nu = o.b2 * kept.nu + (1 - o.b2) * p.coordinates**2
    denominator = jnp.sqrt(new_nu / (1 - o.b2**count)) + o.eps
    numerator = qh_momentum(p.coordinates, new_mu / (1 - o.b1**count), o.qh_nu)
    if o.low_rank_term == "adam":
      numerator = numerator / denominator
    low_rank_directions = listed.unstacked(s.unproject(p.bases, numerator), group)
    scales = listed.unstacked(full_rank_scale(denominator, o.full_rank_scale, s.side), group)
    errors = listed.unstacked(kept.error, group)
    for k, i in enumerate(group):
      matrix = listed.matrices[i].astype(jnp.float32)
      if o.full_rank_numerator == "error_fed":
        matrix = matrix + errors[k].astype(jnp.float32)
      low_rank_direction = low_rank_directions[k]
      direction = scaled_mix(matrix, low_rank_direction, scales[k], o.omega, o.full_rank_rescale)
      g, a = listed.leaves[i], listed.axes[i]
      directions[i] = routing.from_matrix(direction, a, tuple(g.shape)).astype(g.dtype)
    error = kept.error if p.errors is None else p.errors  # Without error feedback: ().
    parts[tuple(group)] = LowRankMoments(kept.basis, new_mu, new_nu, error)
  return directions, parts


def _stepped(c: _Config, state, listed: _Listed, projected: list[_GroupProjection]):
  """The directions (a tree like the updates) and the state after the step."""
  count = optax.safe_int32_increment(state.count)
  directions, parts = _stepped_by_group(c, listed, count, projected)
  new_state = state._replace(count=count, moments=state.moments.put(parts))
  return state.moments.tree_of(directions), new_state


def _projected(c: _Config, state, listed: _Listed) -> Projected:
  """The projection of ``listed``'s groups (:func:`_projected_by_group`), as trees."""
  n = len(listed.leaves)
  coordinates, errors, bases = [None] * n, [None] * n, [None] * n
  for group, p in zip(listed.groups, _projected_by_group(c, listed), strict=True):
    coordinates_of = listed.unstacked(p.coordinates, group)
    bases_of = listed.unstacked(p.bases, group)
    kept = listed.unstacked(listed.moments.take(group).error, group)
    errors_of = kept if p.errors is None else listed.unstacked(p.errors, group)
    for k, i in enumerate(group):
      coordinates[i], bases[i], errors[i] = coordinates_of[k], bases_of[k], errors_of[k]
  as_tree = state.moments.tree_of
  return Projected(as_tree(coordinates), as_tree(errors), as_tree(bases))


def _project(c: _Config, updates, state) -> Projected:
  """:attr:`LowRankAdam.project`: ``c = project(Q, G + E)`` and ``E = A - unproject(Q, c)``."""
  updates = state_structure.values(updates)
  return _grouped(c, state, updates, functools.partial(_projected, c, state))


def _step(c: _Config, updates, state, projected: Projected):
  """:attr:`LowRankAdam.step`: the moments and the direction from given coordinates."""
  coordinates = state.moments.leaves_of(projected.coordinates)
  errors = state.moments.leaves_of(projected.errors)
  bases = state.moments.leaves_of(projected.bases)

  def step(listed: _Listed):
    groups = [
      _GroupProjection(
        listed.stacked(coordinates, group),
        listed.stacked(errors, group) if c.options.error_feedback else None,
        listed.stacked(bases, group),
      )
      for group in listed.groups
    ]
    return _stepped(c, state, listed, groups)

  directions, state = _grouped(c, state, state_structure.values(updates), step)
  return state_structure.like(updates, directions), state


def _update(c: _Config, updates, state, params=None):
  """Refresh when due, then project and step, each shape group in one batched computation."""
  del params
  given, updates = updates, state_structure.values(updates)
  count = optax.safe_int32_increment(state.count)
  now = _refresh_due(c, count)
  if now is not None:
    state = jax.lax.cond(now, lambda: _refresh(c, state, updates, first=count == 1), lambda: state)

  def step(listed: _Listed):
    return _stepped(c, state, listed, _projected_by_group(c, listed))

  directions, state = _grouped(c, state, updates, step)
  return state_structure.like(given, directions), state


def _basis_options(options: low_rank_options.LowRankOptions) -> bases_lib.Options:
  """The step's options that :class:`~lordo_jax.local.bases.Options` has, by name
  (``None``: its default, written there)."""
  given = {name: getattr(options, name) for name in bases_lib.Options._fields}
  return bases_lib.Options(**{name: value for name, value in given.items() if value is not None})


@keywords.takes(low_rank_options.STEP_KEYWORDS)
def scale_by_low_rank_adam(
  rank: int,
  *,
  refresh_every: int | None = None,
  init_projection: str = "gradient",
  seed: int | None = None,
  matrix_axes: Any = None,
  omega: float = 1.0,
  mu: float = 1.0,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
  projection: str = "svd",
  side: str = "auto",
  transport: str = "rotate",
  error_feedback: bool = False,
  error_feedback_dtype: str = "float32",
  full_rank_scale: str = "scalar",
  full_rank_numerator: str = "gradient",
  qh_nu: float = 1.0,
  low_rank_term: str = "adam",
  subspace_iterations: int | None = None,
  two_sided: bool = False,
  oversample: int | None = None,
  power_iterations: int | None = None,
) -> LowRankAdam:
  r"""Adam with its moments in a low-rank subspace of each matrix, plus the QH mix.

  For one ``p x q`` matrix, in the left case (Q is ``p x r``; the right case is the
  left case of the transpose), MATH.md §3:

  .. math::
    A &= G + E, \qquad c = Q^\top A, \qquad E \leftarrow A - Q c \\
    u &\leftarrow \beta_1 u + (1 - \beta_1) c, \qquad
    v \leftarrow \beta_2 v + (1 - \beta_2) c^2 \\
    D &= \sqrt{v / (1 - \beta_2^t)} + \epsilon, \qquad
    L = Q \left(\frac{u / (1 - \beta_1^t)}{D}\right) \\
    \text{direction} &= (1 - \omega) \frac{G}{\mu s} + \omega L

  Three variants of the authors' code (``docs/FIDELITY.md``), each off by default:
  ``qh_nu`` :math:`= \nu < 1` is QHAdam inside the projection,
  :math:`L = Q\,((1 - \nu) c + \nu \hat u) / D`; ``low_rank_term="momentum"`` leaves
  out the division by D, :math:`L = Q \hat u` (the update the authors' code applies);
  ``full_rank_numerator="error_fed"`` puts the error-fed gradient in the full-rank
  term, :math:`(G + E_\text{before}) / (\mu s)`.

  The basis is a strategy: each matrix's strategy says how Q is computed (``svd``,
  ``subspace_iteration``, ``dct``, ``randomized_svd``; two-sided ``svd``,
  ``randomized_svd``), on which side it projects, and how
  :math:`c = \mathrm{project}(Q, A)` and :math:`L = \mathrm{unproject}(Q, X)` are
  formed; the step never asks which method it holds. It works on each leaf's
  own ``p x q`` matrix and never transposes it: the coordinates, moments and
  denominator are ``r x q`` on the left, ``p x r`` on the right and ``r x r`` two-sided
  (TSR-Adam: :math:`C = U^\top A V`, :math:`L = U X V^\top`,
  and the full-rank scale is then a scalar). Each basis matrix is formed once per step
  and used by both products. The state of the matrices of one shape and layout is stored
  in one stack per group (:class:`GroupedMoments`; ``state.moments.matrices()`` gives it
  per matrix). A refresh computes a group's bases, and carries its moments, in one
  batched computation; a leaf that is itself a stack of matrices (``matrix_axes`` with a
  ``batch`` axis, a scanned model's ``(layers, p, q)`` kernel) is projected and stepped
  batched, each matrix with its own basis and moments. Compiled for a GPU or TPU, the
  local step is batched by group too, on the stacks in place (a few kernels per shape,
  not per matrix); compiled for a CPU, where stacking the gradients costs more than it
  saves, it steps one leaf at a time, each on its slice of its group's stacks.
  The choice follows the platform the program is compiled for, not the host's
  (``jax.lax.platform_dependent``): a GPU program compiled ahead of time on a CPU
  host is batched.

  The error buffer E exists only with ``error_feedback=True``. When the basis is
  refreshed, the moments are carried into the new one (``transport``, MATH.md §4.6):

  * ``rotate`` (LDAdam): with the change of basis :math:`R = Q_\text{new}^\top
    Q_\text{old}` (the strategy's ``change_of_basis``; :math:`(R_U, R_V)` two-sided) acting
    on coordinates as the strategy's ``carry`` (:math:`R u` on the left, :math:`u R^\top`
    on the right, :math:`R_U u R_V^\top` two-sided), :math:`u \leftarrow R u`, and the
    bias-corrected second moment becomes :math:`|(R \odot R)\,\mathrm{var} + (R \hat
    m)^2|` with :math:`\mathrm{var} = \max(\hat v - \hat m^2, 0)`;
  * ``keep`` (GaLore): the moments are reused as they are;
  * ``reset``: the moments restart from zero.

  This transformation never communicates. Who refreshes the basis is a choice:
  ``refresh_every=T`` refreshes it from the gradient this transformation receives at
  steps 1, T + 1, 2T + 1, ... (GaLore; :func:`lordo_jax.low_rank_ddp`), while
  :func:`lordo_jax.synchronize` refreshes it from the averaged pseudo-gradient through
  :meth:`LowRankAdam.refresh` (LoRDO). A data-parallel caller averages what it needs
  around the step's pieces (:attr:`LowRankAdam.project`, :attr:`LowRankAdam.step`, and
  :attr:`LowRankAdam.refresh`'s ``mean``), as low-rank DDP's ``communicate="projected"``
  does.

  Every leaf this transformation sees must be
  a matrix: route the others elsewhere with ``optax.partition`` (as
  :func:`lordo_jax.lordo` does), or give ``matrix_axes``.

  Args:
    {options}
    refresh_every: if set, refresh the basis from the incoming gradient at steps
      1, T + 1, 2T + 1, ...; if ``None`` only :attr:`LowRankAdam.refresh` does.
    init_projection: the first basis: ``"gradient"`` (from the gradient of step 1),
      ``"random"`` (orthonormal, from ``seed``; no data needed) or ``"external"``
      (set by the caller's ``refresh(..., first=True)`` before step 1, as
      :func:`lordo_jax.synchronize` does).
    seed: PRNG seed of ``init_projection="random"``; the same on every worker
      (``None``: 0).
    matrix_axes: ``None`` (every leaf is a 2-D matrix), or labels as :func:`~lordo_jax.lordo`'s
      ``low_rank_labels`` gives them (:class:`lordo_jax.MatrixAxes` per leaf).

  Returns:
    A :class:`LowRankAdam`; it never communicates (low-rank DDP's
    ``communicate="projected"`` averages between its pieces).

  Examples:
    >>> import jax.numpy as jnp, optax, lordo_jax
    >>> tx = lordo_jax.scale_by_low_rank_adam(rank=2, refresh_every=10)
    >>> params = {"w": jnp.ones((8, 4))}
    >>> state = tx.init(params)
    >>> updates, state = tx.update({"w": jnp.arange(32.0).reshape(8, 4)}, state)
    >>> updates["w"].shape
    (8, 4)

  References:
    Zhao et al., GaLore, 2024 (arXiv 2403.03507); Robert et al., LDAdam, 2024
    (arXiv 2410.16103); Jovanović et al., LoRDO, 2026 (arXiv 2602.04396); Dang et
    al., TSR-Adam, 2026 (arXiv 2602.08007).
  """
  return low_rank_adam(
    "scale_by_low_rank_adam",
    keywords.build(low_rank_options.LowRankOptions, locals()),
    refresh_every=refresh_every,
    init_projection=init_projection,
    seed=seed,
    matrix_axes=matrix_axes,
  )


def low_rank_adam(
  who: str,
  options: low_rank_options.LowRankOptions,
  *,
  refresh_every: int | None,
  init_projection: str,
  seed: int | None,
  matrix_axes: Any,
) -> LowRankAdam:
  """:func:`scale_by_low_rank_adam` from its options; every option checked, in ``who``'s
  name (the method that built them)."""
  low_rank_options.check_options(who, options)
  checks.one_of(who, "init_projection", init_projection, INIT_PROJECTIONS)
  c = _Config(
    options=options,
    refresh_every=refresh_every,
    init_projection=init_projection,
    seed=0 if seed is None else seed,
    matrix_axes=matrix_axes,
    method=bases_lib.method(
      options.projection, two_sided=options.two_sided, options=_basis_options(options)
    ),
  )
  init = functools.partial(_init, c)
  return LowRankAdam(
    init=init,
    update=state_structure.conformed(init, functools.partial(_update, c), who),
    refresh=functools.partial(_refresh, c),
    refresh_due=functools.partial(_refresh_due, c),
    project=functools.partial(_project, c),
    step=functools.partial(_step, c),
  )
