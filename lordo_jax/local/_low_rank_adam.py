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
from lordo_jax.local import _moment_transport as moment_transport
from lordo_jax.local import _routing as routing
from lordo_jax.local import _shape_groups as shape_groups
from lordo_jax.local import bases as bases_lib
from lordo_jax.local._quasi_hyperbolic import qh_momentum
from lordo_jax.local._quasi_hyperbolic import quasi_hyperbolic_mix
from lordo_jax.local.bases.dct import DCTBasis
from lordo_jax.local.bases.two_sided import TwoSidedBasis

INIT_PROJECTIONS = ("gradient", "random", "external")


class LowRankMoments(NamedTuple):
  """Low-rank Adam state of one matrix (MATH.md §2's shapes)."""

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
  moments: Any  # Like params: LowRankMoments per matrix, optax.MaskedNode elsewhere.
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


def _unlisted(moments, entries: list):
  """Inverse of :func:`_listed`: a tree like ``moments`` holding ``entries``."""
  entries = iter(entries)
  return map_matrices(lambda m: next(entries), moments)


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
  # The moments are not shaped like their matrix: built from the values, so that no Flax
  # Variable (and its parameter's metadata) holds them (lordo_jax/_tree_structure.py).
  params = state_structure.values(params)
  is_masked = lambda x: isinstance(x, optax.MaskedNode)  # noqa: E731
  leaves, treedef = jax.tree.flatten(params, is_leaf=is_masked)
  keys = list(jax.random.split(jax.random.key(c.seed), max(len(leaves), 1)))
  keyed = jax.tree.unflatten(treedef, keys[: len(leaves)])
  moments = jax.tree.map(
    lambda x, a, k: x if is_masked(x) else _init_leaf(c, x, a, k),
    params,
    _axes_of(c, params),
    keyed,
    is_leaf=is_masked,
  )
  return LowRankAdamState(
    count=jnp.zeros([], jnp.int32),
    moments=moments,
    refresh_failures=jnp.zeros([], jnp.int32),
  )


def _leaf_keys(c: _Config, moments, count, source):
  """One PRNG key per matrix (an array of them for a leaf holding a batch of matrices),
  from the seed and the step: alike on every worker."""
  leaves, treedef = jax.tree.flatten(moments, is_leaf=_is_node)
  base = jax.random.fold_in(jax.random.key(c.seed + 1), count)
  keys = [jax.random.fold_in(base, i) for i in range(len(leaves))]
  keyed = jax.tree.unflatten(treedef, keys)
  batched = lambda m, key, x, a: _per_matrix(key, routing.batch_shape(x.shape, a))  # noqa: E731
  return map_matrices(batched, moments, keyed, source, _axes_of(c, source))


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

  The matrices of one shape and layout (a transformer's layers) are stacked and
  refreshed, moments and all, in one batched computation per group.
  """
  source = state_structure.values(source)
  masked = lambda x: isinstance(x, optax.MaskedNode)  # noqa: E731
  moments = map_matrices(lambda m, x: optax.MaskedNode() if masked(x) else m, state.moments, source)
  source = map_matrices(lambda m, x: x, moments, source)
  axes = _listed(moments, _axes_of(c, source))
  matrices = [routing.to_matrix(x, a) for x, a in zip(_listed(moments, source), axes, strict=True)]
  entries = [_Refreshed(m.basis, m.mu, m.nu) for m in _listed(moments, moments)]
  keys = _listed(moments, _leaf_keys(c, moments, state.count, source))
  batch_shapes = [x.shape[:-2] for x in matrices]
  groups = shape_groups.groups(matrices)

  def stacked(items: list, group: list[int]):
    return shape_groups.stack([items[i] for i in group], [batch_shapes[i] for i in group])

  strategies = [c.method.strategy(*matrices[group[0]].shape[-2:]) for group in groups]
  results = c.method.bases_of_mean(
    strategies,
    [stacked(matrices, group) for group in groups],
    [stacked([m.basis for m in entries], group) for group in groups],
    [stacked(keys, group) for group in groups],
    first,
    mean,
  )
  new, failures = {}, jnp.zeros([], jnp.int32)
  for s, group, (basis, ok) in zip(strategies, groups, results, strict=True):
    moved = _transported(c, s, stacked(entries, group), basis, ok, state.count, first)
    new.update(
      zip(group, shape_groups.unstack(moved, [batch_shapes[i] for i in group]), strict=True)
    )
    failures = failures + jnp.sum((~ok).astype(jnp.int32))
  old = _listed(moments, moments)
  new = [LowRankMoments(*new[i], old[i].error) for i in range(len(old))]
  refreshed = _unlisted(moments, new)
  kept = lambda old, x: old if masked(x) else x  # noqa: E731
  return state._replace(
    moments=jax.tree.map(kept, state.moments, refreshed, is_leaf=_is_node),
    refresh_failures=state.refresh_failures + failures,
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
  """A step's matrices in leaf order, and their shape groups (:mod:`._shape_groups`)."""

  moments: list  # LowRankMoments per matrix.
  leaves: list  # The updates' leaves.
  axes: list  # Their MatrixAxes.
  matrices: list  # Their (*batch, p, q) matrices.
  groups: list[list[int]]  # Indices of the matrices stepped in one batched computation.

  def stacked(self, items: list, group: list[int]):
    """``items`` (one tree per matrix) of ``group`` along one leading axis; a group of
    one leaf is that leaf's own item."""
    if len(group) == 1:
      return items[group[0]]
    shapes = [self.matrices[i].shape[:-2] for i in group]
    return shape_groups.stack([items[i] for i in group], shapes)

  def unstacked(self, tree, group: list[int]) -> list:
    """Inverse of :meth:`stacked`: one tree per matrix of ``group``."""
    if len(group) == 1:
      return [tree]
    return shape_groups.unstack(tree, [self.matrices[i].shape[:-2] for i in group])


def _grouped(c: _Config, state, updates, compute: Callable[[_Listed], Any]) -> Any:
  """``compute(listed)``, ``listed`` the matrices of ``updates`` grouped as the platform
  the program is compiled for steps them (:func:`._shape_groups.step_grouped`: traced
  once per grouping where they differ). The one place a local step's grouping is chosen:
  ``compute`` gives a tree that does not depend on it."""
  axes = _listed(state.moments, _axes_of(c, updates))
  leaves = _listed(state.moments, updates)
  matrices = [routing.to_matrix(g, a) for g, a in zip(leaves, axes, strict=True)]
  moments = _listed(state.moments, state.moments)
  return shape_groups.step_grouped(
    matrices, lambda groups: compute(_Listed(moments, leaves, axes, matrices, groups))
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
    q = s.dense(listed.stacked([m.basis for m in listed.moments], group))
    fed = listed.stacked(listed.matrices, group).astype(jnp.float32)
    if not c.options.error_feedback:
      projected.append(_GroupProjection(s.project(q, fed), None, q))
      continue
    errors = listed.stacked([m.error for m in listed.moments], group)
    fed = fed + errors.astype(jnp.float32)
    coordinates = s.project(q, fed)
    new_errors = (fed - s.unproject(q, coordinates)).astype(errors.dtype)
    projected.append(_GroupProjection(coordinates, new_errors, q))
  return projected


def _stepped_by_group(c: _Config, listed: _Listed, count, projected: list[_GroupProjection]):
  """The moments and the direction of every matrix from its group's coordinates."""
  directions, moments = [None] * len(listed.leaves), [None] * len(listed.leaves)
  for group, p in zip(listed.groups, projected, strict=True):
    s = c.method.strategy(*listed.matrices[group[0]].shape[-2:])
    # Each matrix's moments from its own buffers and its part of the coordinates, then
    # stacked: every buffer is read once, by its own update, which XLA does in place
    # (stacked first, each buffer read again after its update is written, XLA copies
    # it: two copies per matrix).
    new_mu_of, new_nu_of = {}, {}
    for i, x in zip(group, listed.unstacked(p.coordinates, group), strict=True):
      new_mu_of[i] = c.options.b1 * listed.moments[i].mu + (1 - c.options.b1) * x
      new_nu_of[i] = c.options.b2 * listed.moments[i].nu + (1 - c.options.b2) * x**2
    new_mu, new_nu = listed.stacked(new_mu_of, group), listed.stacked(new_nu_of, group)
    denominator = jnp.sqrt(new_nu / (1 - c.options.b2**count)) + c.options.eps
    numerator = qh_momentum(p.coordinates, new_mu / (1 - c.options.b1**count), c.options.qh_nu)
    if c.options.low_rank_term == "adam":
      numerator = numerator / denominator
    low_rank_direction = s.unproject(p.bases, numerator)
    matrix = listed.stacked(listed.matrices, group).astype(jnp.float32)
    if c.options.full_rank_numerator == "error_fed":
      errors = listed.stacked([m.error for m in listed.moments], group)
      matrix = matrix + errors.astype(jnp.float32)
    direction = quasi_hyperbolic_mix(
      matrix,
      low_rank_direction,
      denominator,
      c.options.omega,
      c.options.full_rank_rescale,
      c.options.full_rank_scale,
      side=s.side,
    )
    if p.errors is None:  # No error feedback: each matrix keeps its placeholder.
      new_errors = [listed.moments[i].error for i in group]
    else:
      new_errors = listed.unstacked(p.errors, group)
    unstacked = zip(
      group,
      listed.unstacked(direction, group),
      [new_mu_of[i] for i in group],
      [new_nu_of[i] for i in group],
      new_errors,
      strict=True,
    )
    for i, d, new_mu_i, new_nu_i, error in unstacked:
      g, a = listed.leaves[i], listed.axes[i]
      directions[i] = routing.from_matrix(d, a, tuple(g.shape)).astype(g.dtype)
      moments[i] = LowRankMoments(listed.moments[i].basis, new_mu_i, new_nu_i, error)
  return directions, moments


def _stepped(c: _Config, state, listed: _Listed, projected: list[_GroupProjection]):
  """The directions (a tree like the updates) and the state after the step."""
  count = optax.safe_int32_increment(state.count)
  directions, moments = _stepped_by_group(c, listed, count, projected)
  moments = state._replace(count=count, moments=_unlisted(state.moments, moments))
  return _unlisted(state.moments, directions), moments


def _projected(c: _Config, state, listed: _Listed) -> Projected:
  """The projection of ``listed``'s groups (:func:`_projected_by_group`), as trees."""
  n = len(listed.leaves)
  coordinates, errors, bases = [None] * n, [None] * n, [None] * n
  for group, p in zip(listed.groups, _projected_by_group(c, listed), strict=True):
    coordinates_of = listed.unstacked(p.coordinates, group)
    bases_of = listed.unstacked(p.bases, group)
    errors_of = listed.unstacked(p.errors, group) if p.errors is not None else None
    for k, i in enumerate(group):
      coordinates[i], bases[i] = coordinates_of[k], bases_of[k]
      errors[i] = listed.moments[i].error if errors_of is None else errors_of[k]
  as_tree = functools.partial(_unlisted, state.moments)
  return Projected(as_tree(coordinates), as_tree(errors), as_tree(bases))


def _project(c: _Config, updates, state) -> Projected:
  """:attr:`LowRankAdam.project`: ``c = project(Q, G + E)`` and ``E = A - unproject(Q, c)``."""
  updates = state_structure.values(updates)
  return _grouped(c, state, updates, functools.partial(_projected, c, state))


def _step(c: _Config, updates, state, projected: Projected):
  """:attr:`LowRankAdam.step`: the moments and the direction from given coordinates."""
  coordinates = _listed(state.moments, projected.coordinates)
  errors = _listed(state.moments, projected.errors)
  bases = _listed(state.moments, projected.bases)

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
  and used by both products. A refresh stacks the matrices of one shape and layout and
  computes their bases, and carries their moments, in one batched computation; a leaf
  that is itself a stack of matrices (``matrix_axes`` with a ``batch`` axis, a scanned
  model's ``(layers, p, q)`` kernel) is projected and stepped batched, each matrix with
  its own basis and moments. Compiled for a GPU or TPU, the local step stacks the matrices
  of one shape and layout too (a few kernels per shape, not per matrix); compiled for a
  CPU, where stacking the gradients costs more than it saves, it steps one leaf at a time.
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
