r"""Low-rank Adam: :func:`scale_by_low_rank_adam`, moments in an r-dimensional subspace.

The local step of MATH.md §3 for every matrix leaf, with error feedback, the moments'
transport into a refreshed basis (MATH.md §4.6) and the quasi-hyperbolic full-rank
term; the bases are strategies of :mod:`lordo_jax.local.bases`. It never
communicates: :func:`lordo_jax.synchronize` refreshes its bases from the averaged
pseudo-gradient through :attr:`LowRankAdam.refresh`, and low-rank DDP averages
between its pieces (:mod:`lordo_jax.comm._projected_mean`).

:func:`low_rank_adam` builds the transformation from closures over its options, as
optax's own are built; the step of one shape group, batched, is :func:`_local_step`.
"""

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


_ENTRY_POINTS = ("refresh", "refresh_due", "project", "step")


class LowRankAdam(optax.GradientTransformationExtraArgs):
  """An ``optax.GradientTransformationExtraArgs`` with entry points into its step.

  ``init`` and ``update`` are optax's (the two fields of the NamedTuple); the four entry
  points are attributes of the instance, given to the constructor by keyword after
  ``init`` and ``update``.

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

  The entry points travel with the transformation: it flattens as a pytree of its six
  functions (``jax.tree.map`` maps all six), and ``copy.copy``, ``copy.deepcopy``,
  ``_replace`` (of any of the six) and pickling keep them; like any optax transformation
  built from closures, it pickles only with a pickler of closures (cloudpickle).
  Equality, hashing, the repr and unpacking (``init, update = tx``) are the
  NamedTuple's, over ``init`` and ``update``; optax's wrappers
  (``optax.with_extra_args_support``, ``optax.chain``, ``optax.partition``) take it as
  the ``GradientTransformationExtraArgs`` it is.
  """

  refresh: Callable[..., "LowRankAdamState"]
  """``(state, source, *, first, mean) -> state``: new bases from ``source``."""
  refresh_due: Callable[[jax.Array], jax.Array | None]
  """``count -> bool array``, whether step ``count`` refreshes; or ``None``: never."""
  project: Callable[[Any, "LowRankAdamState"], "Projected"]
  """``(updates, state) -> Projected``: the step's coordinates, error buffers and bases."""
  step: Callable[[Any, "LowRankAdamState", "Projected"], tuple[Any, "LowRankAdamState"]]
  """``(updates, state, projected) -> (updates, state)``: the step on given coordinates."""

  def __new__(cls, init, update, *, refresh, refresh_due, project, step):
    self = super().__new__(cls, init, update)
    self.refresh, self.refresh_due, self.project, self.step = refresh, refresh_due, project, step
    return self

  def __getnewargs_ex__(self):  # copy and pickle: the entry points by keyword.
    return (self.init, self.update), {name: getattr(self, name) for name in _ENTRY_POINTS}

  def _replace(self, **changes) -> "LowRankAdam":
    """A copy with the functions ``changes`` names (fields or entry points) replaced."""
    functions = {name: getattr(self, name) for name in self._fields + _ENTRY_POINTS}
    unknown = set(changes) - set(functions)
    if unknown:
      raise ValueError(f"LowRankAdam has no function {sorted(unknown)}; it has {list(functions)}")
    return type(self)(**{**functions, **changes})


def _flatten_with_keys(tx: LowRankAdam):
  names = tx._fields + _ENTRY_POINTS
  return [(jax.tree_util.GetAttrKey(name), getattr(tx, name)) for name in names], None


def _unflatten(_, functions) -> LowRankAdam:
  init, update, *entry_points = functions
  return LowRankAdam(init, update, **dict(zip(_ENTRY_POINTS, entry_points, strict=True)))


jax.tree_util.register_pytree_with_keys(
  LowRankAdam,
  _flatten_with_keys,
  _unflatten,
  lambda tx: ([getattr(tx, name) for name in tx._fields + _ENTRY_POINTS], None),
)


def _is_masked(x) -> bool:
  return isinstance(x, optax.MaskedNode)


def _is_node(x) -> bool:
  return isinstance(x, (LowRankMoments, optax.MaskedNode))


def map_matrices(fn, moments, *trees):
  """``fn(moments_leaf, *leaves)`` at every matrix; MaskedNode elsewhere."""

  def one(m, *xs):
    return m if isinstance(m, optax.MaskedNode) else fn(m, *xs)

  return jax.tree.map(one, moments, *trees, is_leaf=_is_node)


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
    A :class:`LowRankAdam`: an ``optax.GradientTransformationExtraArgs`` whose
    ``init`` and ``update`` are optax's, with the entry points ``refresh``,
    ``refresh_due``, ``project`` and ``step`` as attributes. It never communicates
    (low-rank DDP's ``communicate="projected"`` averages between its pieces).

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
  name (the method that built them). Its functions are closures over the options."""
  low_rank_options.check_options(who, options)
  checks.one_of(who, "init_projection", init_projection, INIT_PROJECTIONS)
  o = options
  seed = 0 if seed is None else seed
  method = bases_lib.method(o.projection, two_sided=o.two_sided, options=_basis_options(o))

  def axes_of(tree):
    """The :class:`~lordo_jax.local._routing.MatrixAxes` of every leaf of ``tree``."""
    return _axes_of(tree, matrix_axes, o.rank)

  def strategy(matrix: jax.Array) -> bases_lib.BasisStrategy:
    """The basis strategy of a ``(*batch, p, q)`` matrix."""
    return method.strategy(*matrix.shape[-2:])

  def init_fn(params):
    if isinstance(params, _ParamsPlaceholder):
      # optax.tree_utils.tree_map_params's stand-in for the params (optax.masked passes
      # it on alike): no shapes, so no groups; the moments are where it is, and its
      # function maps every leaf of them, as it did a state kept per matrix (and GaLore's).
      zero = jnp.zeros([], jnp.int32)
      return LowRankAdamState(count=zero, moments=params, refresh_failures=zero)
    # The moments are not shaped like their matrix: built from the values, so that no
    # Flax Variable (and its parameter's metadata) holds them (lordo_jax/_tree_structure.py).
    params = state_structure.values(params)
    leaves, treedef = jax.tree.flatten(params, is_leaf=_is_masked)
    keys = list(jax.random.split(jax.random.key(seed), max(len(leaves), 1)))
    keyed = jax.tree.unflatten(treedef, keys[: len(leaves)])
    axes = axes_of(params)

    def init_matrix(x, a, key):
      if _is_masked(x):
        return x
      s = method.strategy(*routing.matrix_shape(x.shape, a))
      return _init_moments(o, s, x, a, key if init_projection == "random" else None)

    moments = jax.tree.map(init_matrix, params, axes, keyed, is_leaf=_is_masked)
    is_matrix = lambda x: isinstance(x, LowRankMoments)  # noqa: E731
    matrices = [
      routing.to_matrix(x, a)
      for x, a in zip(_listed(moments, params), _listed(moments, axes), strict=True)
    ]
    return LowRankAdamState(
      count=jnp.zeros([], jnp.int32),
      moments=GroupedMoments.of(
        moments, is_matrix, shape_groups.groups(matrices), [x.shape[:-2] for x in matrices]
      ),
      refresh_failures=jnp.zeros([], jnp.int32),
    )

  def refresh_due(count):
    """Whether the step ``count`` refreshes: 1, T + 1, 2T + 1, ... and/or 1; None: never."""
    now = None
    if refresh_every is not None:
      now = (count - 1) % refresh_every == 0
    if init_projection == "gradient":
      now = count == 1 if now is None else now | (count == 1)
    return now

  def refresh(state, source, *, first=False, mean=lambda xs: xs) -> LowRankAdamState:
    """New bases from ``source`` (its workers' ``mean``); a matrix whose ``source`` leaf
    is ``optax.MaskedNode`` keeps its basis and moments.

    Each shape group's matrices (those of them in ``source``) are refreshed, moments and
    all, in one batched computation, on the group's stacks.
    """
    source = state_structure.values(source)
    moments: GroupedMoments = state.moments
    leaves = moments.leaves_of(source)
    present = [i for i, x in enumerate(leaves) if not _is_masked(x)]
    axes = moments.leaves_of(axes_of(moments.tree_of(leaves)))
    matrices = {i: routing.to_matrix(leaves[i], axes[i]) for i in present}
    keys = _matrix_keys(seed, moments, state.count, present)
    batch_shapes = moments.layout.batch_shapes
    groups = [[i for i in group if i in matrices] for group in moments.layout.groups]
    groups = [group for group in groups if group]

    def stacked(items, group: list[int]):  # Along one axis, a group of one matrix too.
      return shape_groups.stack([items[i] for i in group], [batch_shapes[i] for i in group])

    def flat(part, group: list[int]):  # A group's state as stacked() stacks it.
      return part if len(group) > 1 else stacked({group[0]: part}, group)

    entries = [flat(moments.take(group), group) for group in groups]
    strategies = [strategy(matrices[group[0]]) for group in groups]
    results = method.bases_of_mean(
      strategies,
      [stacked(matrices, group) for group in groups],
      [entry.basis for entry in entries],
      [stacked(keys, group) for group in groups],
      first,
      mean,
    )
    parts, failures = {}, jnp.zeros([], jnp.int32)
    for s, group, entry, (basis, ok) in zip(strategies, groups, entries, results, strict=True):
      moved = _transported(o, s, entry, basis, ok, state.count, first)
      if len(group) == 1:
        moved = shape_groups.unstack(moved, [batch_shapes[group[0]]])[0]
      parts[tuple(group)] = moved
      failures = failures + jnp.sum((~ok).astype(jnp.int32))
    return state._replace(
      moments=moments.put(parts), refresh_failures=state.refresh_failures + failures
    )

  def project(updates, state) -> Projected:
    """``c = project(Q, G + E)`` and ``E = A - unproject(Q, c)`` (:func:`_projection`)."""
    updates = state_structure.values(updates)
    leaves, axes = state.moments.leaves_of(updates), state.moments.leaves_of(axes_of(updates))

    def project_group(group, gradients):
      kept, shapes = state.moments.take(group), [g.shape[:-2] for g in gradients]
      c, error, q = _projection(o, strategy(gradients[0]), kept, gradients)
      per_matrix = [moment_groups.unstacked(x, shapes) for x in (c, error, q)]
      return list(zip(*per_matrix, strict=True)), None

    projected, _ = _grouped(state.moments, leaves, axes, project_group)
    c, errors, q = ([entry[k] for entry in projected] for k in range(3))
    as_tree = state.moments.tree_of
    return Projected(as_tree(c), as_tree(errors), as_tree(q))

  def stepped(updates, state, count, projected: Projected | None):
    """The directions (a tree like ``updates``) and the state after step ``count``, from
    the coordinates ``projected`` gives, or projected here (``None``)."""
    given, updates = updates, state_structure.values(updates)
    leaves, axes = state.moments.leaves_of(updates), state.moments.leaves_of(axes_of(updates))
    # (c, E, Q): lists of the matrices' entries, or None.
    given_leaves = None if projected is None else [state.moments.leaves_of(x) for x in projected]

    def step_group(group, gradients):
      kept, shapes = state.moments.take(group), [g.shape[:-2] for g in gradients]
      projection = None
      if given_leaves is not None:  # (c, E, Q) stacked as the group's state is.
        c, errors, q = ([x[i] for i in group] for x in given_leaves)
        error = moment_groups.stacked(errors, shapes) if o.error_feedback else kept.error
        projection = (moment_groups.stacked(c, shapes), error, moment_groups.stacked(q, shapes))
      s = strategy(gradients[0])
      directions, part = _local_step(o, s, kept, gradients, count, projection)
      return [
        routing.from_matrix(d, axes[i], tuple(leaves[i].shape)).astype(leaves[i].dtype)
        for d, i in zip(directions, group, strict=True)
      ], part

    directions, moments = _grouped(state.moments, leaves, axes, step_group)
    new_state = state._replace(count=count, moments=moments)
    return state_structure.like(given, state.moments.tree_of(directions)), new_state

  def step(updates, state, projected: Projected):
    """The moments and the direction from given coordinates (:func:`_local_step`)."""
    return stepped(updates, state, optax.safe_int32_increment(state.count), projected)

  def update_fn(updates, state, params=None, **extra_args):
    """Refresh when due, then project and step, each shape group in one batched
    computation where the compile target batches (:func:`_grouped`)."""
    del params, extra_args
    count = optax.safe_int32_increment(state.count)
    now = refresh_due(count)
    if now is not None:
      source = state_structure.values(updates)
      state = jax.lax.cond(now, lambda: refresh(state, source, first=count == 1), lambda: state)
    return stepped(updates, state, count, None)

  return LowRankAdam(
    init_fn,
    state_structure.conformed(init_fn, update_fn, who),
    refresh=refresh,
    refresh_due=refresh_due,
    project=project,
    step=step,
  )


def _local_step(o: low_rank_options.LowRankOptions, s, kept, gradients: list, count, given=None):
  r"""MATH.md §3 for the matrices of one shape group, batched: each one's direction and
  the group's new :class:`LowRankMoments`.

  ``kept`` is the group's state stacked as it stores it (:meth:`GroupedMoments.take`),
  ``gradients`` each matrix's ``(*batch, p, q)`` gradient, ``s`` their basis strategy
  and ``count`` the step t. ``given``: the projection ``(c, E, Q)`` stacked alike (the
  coordinates low-rank DDP averaged), or ``None`` to project here. The moments are
  updated on the group's stacks; the full-rank term is formed from each matrix's own
  gradient, so that the stacked gradient is dead after the projection (its buffer then
  holds the low-rank direction).
  """
  # c = Q^T (G + E), E <- A - Q c (error feedback only).
  c, error, q = _projection(o, s, kept, gradients) if given is None else given
  new_mu = o.b1 * kept.mu + (1 - o.b1) * c
  new_nu = o.b2 * kept.nu + (1 - o.b2) * c**2
  denominator = jnp.sqrt(new_nu / (1 - o.b2**count)) + o.eps  # D
  numerator = qh_momentum(c, new_mu / (1 - o.b1**count), o.qh_nu)  # u_hat (QH: with c)
  if o.low_rank_term == "adam":
    numerator = numerator / denominator
  shapes = [g.shape[:-2] for g in gradients]
  low_rank = moment_groups.unstacked(s.unproject(q, numerator), shapes)  # L
  scales = moment_groups.unstacked(full_rank_scale(denominator, o.full_rank_scale, s.side), shapes)
  errors = moment_groups.unstacked(kept.error, shapes)  # E before this step.
  directions = []
  for gradient, direction, scale, e in zip(gradients, low_rank, scales, errors, strict=True):
    full_rank = gradient.astype(jnp.float32)  # F = G / (mu s), or (G + E) / (mu s).
    if o.full_rank_numerator == "error_fed":
      full_rank = full_rank + e.astype(jnp.float32)
    directions.append(scaled_mix(full_rank, direction, scale, o.omega, o.full_rank_rescale))
  return directions, LowRankMoments(kept.basis, new_mu, new_nu, error)


def _projection(o: low_rank_options.LowRankOptions, s, kept, gradients: list):
  """``(c, E, Q)`` of one shape group, stacked: ``c = project(Q, A)`` with ``A = G + E``,
  the new residual ``E = A - unproject(Q, c)`` (the kept ``E`` without error feedback),
  and ``Q`` the basis formed once for both products."""
  q = s.dense(kept.basis)
  fed = moment_groups.stacked(gradients, [g.shape[:-2] for g in gradients]).astype(jnp.float32)
  if not o.error_feedback:
    return s.project(q, fed), kept.error, q
  fed = fed + kept.error.astype(jnp.float32)
  coordinates = s.project(q, fed)
  return coordinates, (fed - s.unproject(q, coordinates)).astype(kept.error.dtype), q


def _grouped(moments: GroupedMoments, leaves: list, axes: list, step_group) -> tuple[list, Any]:
  """``step_group(group, gradients)`` for every group of matrices the compile target steps
  at once (:func:`._shape_groups.step_grouped`: the shape groups on a GPU or TPU, one
  matrix each on a CPU), ``gradients`` the group's ``(*batch, p, q)`` matrices of
  ``leaves``. ``step_group`` gives one output per matrix of the group and its new state
  (as :meth:`GroupedMoments.take` gives it), or ``None``; returns the outputs in leaf
  order and ``moments`` with the new states, alike whatever the grouping."""
  matrices = [routing.to_matrix(x, a) for x, a in zip(leaves, axes, strict=True)]

  def step(groups: list[list[int]]):
    outputs, parts = [None] * len(matrices), {}
    for group in groups:
      per_matrix, part = step_group(group, [matrices[i] for i in group])
      for i, output in zip(group, per_matrix, strict=True):
        outputs[i] = output
      if part is not None:
        parts[tuple(group)] = part
    return outputs, moments.put(parts)

  return shape_groups.step_grouped([list(group) for group in moments.layout.groups], step)


def _transported(o, s, m: LowRankMoments, basis, ok, count, first) -> LowRankMoments:
  """The state ``m`` of a batch of matrices (one ``ok`` each) with their new bases, the
  moments carried into them (``transport``, MATH.md §4.6)."""
  if first is True:
    return m._replace(basis=basis)
  new_mu, new_nu = m.mu, m.nu
  per_matrix = lambda flag: jnp.reshape(flag, jnp.shape(flag) + (1, 1))  # noqa: E731
  if o.transport == "rotate":
    rotated = moment_transport.rotate_moments(s, m.mu, m.nu, basis, m.basis, count, o.b1, o.b2)
    unchanged = per_matrix(jnp.logical_or(first, ~ok))
    new_mu = jnp.where(unchanged, m.mu, rotated[0])
    new_nu = jnp.where(unchanged, m.nu, rotated[1])
  elif o.transport == "reset":
    new_mu = jnp.where(per_matrix(ok), jnp.zeros_like(m.mu), m.mu)
    new_nu = jnp.where(per_matrix(ok), jnp.zeros_like(m.nu), m.nu)
  return m._replace(basis=basis, mu=new_mu, nu=new_nu)


def _axes_of(tree, matrix_axes, rank: int):
  """The :class:`~lordo_jax.local._routing.MatrixAxes` of every leaf; an error for a non-matrix."""
  axes = routing.route(tree, matrix_axes, rank)

  def check(path, a):
    if a == routing.FULL_RANK:
      raise ValueError(
        f"scale_by_low_rank_adam got the leaf {jax.tree_util.keystr(path)}, "
        f"which is not a matrix with min(p, q) > rank={rank}. Send such leaves "
        "to another transformation with optax.partition (lordo_jax.lordo does), "
        "or label them with matrix_axes."
      )
    return a

  return jax.tree_util.tree_map_with_path(check, axes, is_leaf=_is_masked)


def _listed(moments, tree) -> list:
  """The matrices' entries of ``tree``, in order."""
  entries = []
  map_matrices(lambda m, x: entries.append(x), moments, tree)
  return entries


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


def _init_moments(o, s: bases_lib.BasisStrategy, x, axes, key) -> LowRankMoments:
  """The state of the leaf ``x`` before step 1: its basis (random from ``key``, or a
  placeholder for ``None``), zero moments and error buffer."""
  batch = routing.batch_shape(x.shape, axes)
  # Sharded like the matrix (Explicit mesh axes); two buffers, so a caller may donate.
  spec = _matrix_spec(x, axes)
  basis = _init_basis(s, key, batch)
  basis_spec = s.basis_spec(x) if x.ndim == 2 and spec != (None, None) else None
  basis = jax.tree.map(lambda b: sharded.place(b, basis_spec, x), basis)
  unsplit = (None,) * len(batch)
  shape, coordinates_spec = batch + s.coordinates_shape, unsplit + s.coordinates_spec(spec)
  mu = sharded.zeros(shape, jnp.float32, coordinates_spec, x)
  nu = sharded.zeros(shape, jnp.float32, coordinates_spec, x)
  if o.error_feedback:
    shape = batch + routing.matrix_shape(x.shape, axes)
    error = sharded.zeros(shape, jnp.dtype(o.error_feedback_dtype), unsplit + spec, x)
  else:
    error = ()
  return LowRankMoments(basis, mu, nu, error)


def _matrix_keys(seed: int, moments: GroupedMoments, count, present: list[int]) -> dict:
  """One PRNG key per matrix of ``present`` (an array of them for a leaf holding a batch
  of matrices), from the seed, the step and the matrix's leaf: alike on every worker."""
  base = jax.random.fold_in(jax.random.key(seed + 1), count)
  layout = moments.layout
  return {
    i: _per_matrix(jax.random.fold_in(base, layout.matrices[i]), layout.batch_shapes[i])
    for i in present
  }


def _basis_options(options: low_rank_options.LowRankOptions) -> bases_lib.Options:
  """The step's options that :class:`~lordo_jax.local.bases.Options` has, by name
  (``None``: its default, written there)."""
  given = {name: getattr(options, name) for name in bases_lib.Options._fields}
  return bases_lib.Options(**{name: value for name, value in given.items() if value is not None})
