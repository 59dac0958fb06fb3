r"""Low-rank Adam: moments kept in an r-dimensional subspace of each matrix.

The local step of SPEC section 3, for one ``p x q`` matrix, written for the left
case (Q is ``p x r``; the right case is the left case of the transpose):

.. math::
  A &= G + E, \qquad c = Q^\top A, \qquad E \leftarrow A - Q c \\
  u &\leftarrow \beta_1 u + (1 - \beta_1) c, \qquad
  v \leftarrow \beta_2 v + (1 - \beta_2) c^2 \\
  D &= \sqrt{v / (1 - \beta_2^t)} + \epsilon, \qquad
  L = Q \left(\frac{u / (1 - \beta_1^t)}{D}\right) \\
  \text{direction} &= (1 - \omega) \frac{G}{\mu s} + \omega L

The step works on each leaf's own ``p x q`` matrix and never transposes it. The
coordinates, moments and denominator are kept in the frame SPEC section 2 writes
them in: ``r x q`` on the left (:math:`c = Q^\top A`, :math:`L = Q X`), ``p x r`` on
the right (Q is ``q x r``, :math:`c = A Q`, :math:`L = X Q^\top`). Both products
are then plain row-major matrix products, which XLA's CPU matmul runs at full speed
(a transposed result, as an ``r x p`` frame on the right would need, ran 2x slower).
Per step that is two ``p x q x r`` products and a few elementwise passes; each basis
matrix is formed once per step (for ``dct``, gathered from a cosine table, see
:mod:`lordo_jax.projection`).

The error buffer E exists only with ``error_feedback=True``. When the basis is
refreshed, the moments are carried into the new one (``transport``, SPEC 4.6):

* ``rotate`` (LDAdam): with :math:`R = Q_\text{new}^\top Q_\text{old}`,
  :math:`u \leftarrow R u`, and the bias-corrected second moment becomes
  :math:`|(R \odot R)\,\mathrm{var} + (R \hat m)^2|` with
  :math:`\mathrm{var} = \max(\hat v - \hat m^2, 0)` (right case: R acts on the
  last axis, :math:`u R^\top`);
* ``keep`` (GaLore): the moments are reused as they are;
* ``reset``: the moments restart from zero.

``two_sided=True`` (TSR-Adam, :mod:`lordo_jax.two_sided`) projects on both sides:
the coordinates and moments are the ``r x r`` core :math:`C = U^\top A V`,
:math:`L = U X V^\top`, and the refresh is an SVD or a randomized SVD
(``projection="randomized_svd"``); the full-rank scale is then a scalar.

This transformation does not communicate, except in one opt-in mode:
``average_coordinates_over=axis_name`` (low-rank DDP's ``communicate="projected"``)
averages the coordinates c (``r x q`` or ``p x r``) over the workers every step, and the full
gradient on refresh steps only, through :func:`lordo_jax.counted_pmean` with a ledger
kept in the state. Who refreshes the basis is a choice:
``refresh_every=T`` refreshes it from the gradient this transformation receives at
steps 1, T + 1, 2T + 1, ... (GaLore; :func:`lordo_jax.low_rank_ddp`), while
:func:`lordo_jax.synchronize` refreshes it from the averaged pseudo-gradient through
:meth:`LowRankAdam.refresh` (LoRDO).
"""

import dataclasses
from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from lordo_jax import checks
from lordo_jax import collectives
from lordo_jax import projection as projection_lib
from lordo_jax import routing
from lordo_jax import two_sided as two_sided_lib
from lordo_jax.quasi_hyperbolic import quasi_hyperbolic_mix

TRANSPORTS = ("rotate", "keep", "reset")
SIDES = ("auto", "left", "right")
INIT_PROJECTIONS = ("gradient", "random", "external")


class LowRankMoments(NamedTuple):
  """Low-rank Adam state of one matrix (SPEC section 2's shapes)."""

  # Q (p x r left, q x r right) float32, r DCT frequencies, or U and V (two-sided).
  basis: projection_lib.Basis | two_sided_lib.TwoSidedBasis
  mu: jax.Array  # First moment u, float32: r x q (left), p x r (right), r x r (two-sided).
  nu: jax.Array  # Second moment v, float32, shaped like u.
  error: jax.Array  # Error-feedback buffer E, p x q (the leaf's matrix); (0,) when off.


class LowRankAdamState(NamedTuple):
  """State of :func:`scale_by_low_rank_adam`."""

  count: jax.Array  # int32 scalar: steps taken.
  moments: Any  # Like params: LowRankMoments per matrix, optax.MaskedNode elsewhere.
  refresh_failures: jax.Array  # int32 scalar: refreshes that kept the old basis.
  ledger: Any = None  # Ledger of average_coordinates_over's all-reduces; None when off.


class LowRankAdam(NamedTuple):
  """An optax transformation with one extra entry point, :attr:`refresh`.

  ``refresh(state, source, *, first=False)`` recomputes every matrix's basis from
  the matching leaf of ``source`` (a tree like params) and transports the moments.
  ``first=True`` marks a run's first basis: exact (SVD for ``subspace_iteration``)
  and no transport, since the moments are still zero.
  """

  init: Callable
  update: Callable
  refresh: Callable


@dataclasses.dataclass(frozen=True)
class _Orientation:
  """How one leaf is seen as a ``p x q`` matrix, and on which side it is projected.

  ``left``: Q is ``p x r`` and the coordinates are ``r x q``; otherwise Q is ``q x r``
  and the coordinates are ``p x r`` (SPEC section 2). ``two_sided``: the basis is
  U and V and the coordinates are the ``r x r`` core.
  """

  axes: routing.MatrixAxes
  shape: tuple[int, ...]
  left: bool
  two_sided: bool = False

  def matrix(self, x: jax.Array) -> jax.Array:
    """The leaf's own ``p x q`` matrix (no transpose for a 2-D leaf)."""
    return routing.to_matrix(x, self.axes)

  def leaf(self, matrix: jax.Array) -> jax.Array:
    """Inverse of :meth:`matrix`."""
    return routing.from_matrix(matrix, self.axes, self.shape)

  def project(self, basis: jax.Array, matrix: jax.Array) -> jax.Array:
    """Coordinates of a ``p x q`` matrix: ``Q^T A`` (left), ``A Q`` (right), ``U^T A V``."""
    if self.two_sided:
      return two_sided_lib.project(basis, matrix)
    return basis.T @ matrix if self.left else matrix @ basis

  def unproject(self, basis: jax.Array, coordinates: jax.Array) -> jax.Array:
    """Back to ``p x q``: ``Q C`` (left), ``C Q^T`` (right), ``U C V^T`` (two-sided)."""
    if self.two_sided:
      return two_sided_lib.unproject(basis, coordinates)
    return basis @ coordinates if self.left else coordinates @ basis.T

  @property
  def side(self) -> str:
    return "left" if self.left else "right"

  def basis_rows(self) -> int:
    """n, the length of the basis vectors: p (left) or q (right)."""
    p, q = routing.matrix_shape(self.shape, self.axes)
    return p if self.left else q

  def coordinates_shape(self, rank: int) -> tuple[int, int]:
    p, q = routing.matrix_shape(self.shape, self.axes)
    if self.two_sided:
      return (rank, rank)
    return (rank, q) if self.left else (p, rank)


def orientation(
  shape: tuple[int, ...], axes: routing.MatrixAxes, side: str, two_sided: bool = False
) -> _Orientation:
  """The side of SPEC section 2: ``auto`` projects on the left when p >= q."""
  p, q = routing.matrix_shape(shape, axes)
  left = side == "left" or (side == "auto" and p >= q)
  return _Orientation(axes, tuple(shape), left, two_sided)


def check_projection(
  who: str, projection: str, *, two_sided: bool, side: str, full_rank_scale: str
) -> None:
  """The projection options, checked together: one-sided methods, or two-sided ones."""
  if not two_sided:
    if projection in two_sided_lib.METHODS and projection not in projection_lib.METHODS:
      raise ValueError(
        f"{who}: projection={projection!r} is the two-sided refresh; use it with "
        f"two_sided=True, or one of {projection_lib.METHODS} for one-sided projection."
      )
    checks.one_of(who, "projection", projection, projection_lib.METHODS)
    return
  checks.one_of(who, "projection", projection, two_sided_lib.METHODS)
  if side != "auto":
    raise ValueError(
      f"{who}: side={side!r} is not accepted with two_sided=True; expected 'auto' "
      "(two-sided projection works on both sides of every matrix)."
    )
  if full_rank_scale != "scalar":
    raise ValueError(
      f"{who}: full_rank_scale={full_rank_scale!r} is not accepted with "
      "two_sided=True; expected 'scalar' (the r x r core has no row or column of "
      "the matrix to take a vector scale from)."
    )


def rotate_moments(mu, nu, new_basis, old_basis, count, b1, b2, *, left=True):
  r"""LDAdam's moment transport into a new basis (SPEC section 4, step 6).

  .. math::
    R = Q_\text{new}^\top Q_\text{old}, \quad
    \hat m = \frac{u}{1 - \beta_1^t}, \quad \hat v = \frac{v}{1 - \beta_2^t}, \quad
    u' = R u, \quad
    v' = (1 - \beta_2^t)\,\bigl|(R \odot R) \max(\hat v - \hat m^2, 0)
      + (R \hat m)^2\bigr|

  for ``r x q`` moments (left case); ``left=False`` takes ``p x r`` moments and lets
  R act on their last axis (the same formula on their transposes: :math:`u R^\top`).
  ``new_basis`` and ``old_basis`` are :data:`lordo_jax.projection.Basis` values; R is
  :func:`lordo_jax.projection.overlap` (exactly 0/1 for two DCT bases).
  """
  if not left:
    mu, nu = rotate_moments(mu.T, nu.T, new_basis, old_basis, count, b1, b2)
    return mu.T, nu.T
  rotation = projection_lib.overlap(new_basis, old_basis)
  first_correction = 1 - b1**count
  second_correction = 1 - b2**count
  mean = mu / first_correction
  variance = jnp.maximum(nu / second_correction - mean**2, 0.0)
  new_second = jnp.abs((rotation * rotation) @ variance + (rotation @ mean) ** 2)
  return rotation @ mu, new_second * second_correction


def map_matrices(fn, moments, *trees):
  """``fn(moments_leaf, *leaves)`` at every matrix; MaskedNode elsewhere."""
  is_node = lambda x: isinstance(x, (LowRankMoments, optax.MaskedNode))  # noqa: E731

  def one(m, *xs):
    return m if isinstance(m, optax.MaskedNode) else fn(m, *xs)

  return jax.tree.map(one, moments, *trees, is_leaf=is_node)


class _Pair(NamedTuple):
  first: Any
  second: Any


def _unzip(tree):
  is_pair = lambda x: isinstance(x, _Pair)  # noqa: E731
  firsts = jax.tree.map(lambda p: p.first, tree, is_leaf=is_pair)
  seconds = jax.tree.map(lambda p: p.second, tree, is_leaf=is_pair)
  return firsts, seconds


def scale_by_low_rank_adam(
  rank: int,
  *,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
  omega: float = 1.0,
  mu: float = 1.0,
  full_rank_scale: str = "scalar",
  projection: str = "svd",
  side: str = "auto",
  transport: str = "rotate",
  error_feedback: bool = False,
  error_feedback_dtype: Any = jnp.float32,
  subspace_iterations: int = 2,
  refresh_every: int | None = None,
  init_projection: str = "gradient",
  seed: int = 0,
  matrix_axes: Any = None,
  average_coordinates_over: str | None = None,
  two_sided: bool = False,
  oversample: int | None = None,
  power_iterations: int | None = None,
) -> LowRankAdam:
  r"""Adam with its moments in a low-rank subspace of each matrix, plus the QH mix.

  See the module docstring for the math. Every leaf this transformation sees must be
  a matrix: route the others elsewhere with ``optax.partition`` (as
  :func:`lordo_jax.lordo` does), or give ``matrix_axes``.

  Args:
    rank: r, the dimension of the subspace.
    b1, b2, eps: Adam's decay rates and denominator offset.
    omega: weight of the low-rank term in the quasi-hyperbolic mix; 1 is plain
      low-rank Adam (GaLore).
    mu: rescaling of the full-rank term ``G / (mu s)``.
    full_rank_scale: ``"scalar"`` or ``"vector"``: how ``s`` is taken from D.
    projection: ``"svd"``, ``"subspace_iteration"`` or ``"dct"``; with
      ``two_sided=True``, ``"svd"`` or ``"randomized_svd"``.
    side: ``"auto"``, ``"left"`` or ``"right"`` (``"auto"`` when two-sided).
    transport: ``"rotate"``, ``"keep"`` or ``"reset"``: moments at a refresh.
    error_feedback: keep the residual ``E = A - Q Q^T A`` (two-sided:
      ``A - U C V^T``) and feed it back.
    error_feedback_dtype: dtype of E (float32, or bfloat16 for half the memory).
    subspace_iterations: steps of warm-started subspace iteration per refresh.
    refresh_every: if set, refresh the basis from the incoming gradient at steps
      1, T + 1, 2T + 1, ...; if ``None`` only :attr:`LowRankAdam.refresh` does.
    init_projection: the first basis: ``"gradient"`` (from the gradient of step 1),
      ``"random"`` (orthonormal, from ``seed``; no data needed) or ``"external"``
      (set by the caller's ``refresh(..., first=True)`` before step 1, as
      :func:`lordo_jax.synchronize` does).
    seed: PRNG seed of ``init_projection="random"``; the same on every worker.
    matrix_axes: ``None`` (every leaf is a 2-D matrix), or ``low_rank_labels`` as
      :mod:`lordo_jax.routing` describes them.
    average_coordinates_over: ``None`` (default: no communication), or a worker
      axis name: every step the coordinates :math:`c = Q^\top G` are replaced by
      their mean over the workers (``r x q`` per matrix), and on refresh steps the
      gradient the basis is computed from is the workers' mean (``p x q``). Both go
      through :func:`lordo_jax.counted_pmean` and are counted in the state's
      ``ledger``. Since Q is shared and projection is linear, this equals running on
      the averaged gradient. It needs ``omega=1`` and ``error_feedback=False``
      (both use the full gradient at every step). Two-sided, the coordinates are
      the ``r x r`` cores, and a ``randomized_svd`` refresh averages the sketches
      (``p x l`` and ``l x q``, l = r + oversample) instead of the gradient.
    two_sided: project on both sides (TSR-Adam): ``r x r`` moments and messages.
    oversample: extra sketch columns of ``randomized_svd`` (``None``: 8).
    power_iterations: power iterations of ``randomized_svd`` (``None``: 1; each
      costs two more products with the matrix, and two more averages when
      distributed).

  Returns:
    A :class:`LowRankAdam`.

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
  who = "scale_by_low_rank_adam"
  check_projection(who, projection, two_sided=two_sided, side=side, full_rank_scale=full_rank_scale)
  checks.positive_int(who, "rank", rank)
  oversample = two_sided_lib.OVERSAMPLE if oversample is None else oversample
  power_iterations = (
    two_sided_lib.POWER_ITERATIONS if power_iterations is None else power_iterations
  )
  checks.positive_int(who, "oversample", oversample, minimum=0)
  checks.positive_int(who, "power_iterations", power_iterations, minimum=0)

  if average_coordinates_over is not None and (
    error_feedback or not (isinstance(omega, (int, float)) and omega == 1)
  ):
    raise ValueError(
      f"scale_by_low_rank_adam: average_coordinates_over={average_coordinates_over!r} "
      f"averages only the r x q coordinates, but omega={omega!r} and "
      f"error_feedback={error_feedback!r} need the averaged full gradient at every "
      "step. Use omega=1 and error_feedback=False, or average the full gradient "
      "before this transformation."
    )

  def axes_of(tree):
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

    is_masked = lambda x: isinstance(x, optax.MaskedNode)  # noqa: E731
    return jax.tree_util.tree_map_with_path(check, axes, is_leaf=is_masked)

  def init_leaf(x, axes, key):
    o = orientation(x.shape, axes, side, two_sided)
    p, q = routing.matrix_shape(x.shape, axes)
    if two_sided and init_projection == "random":
      basis = two_sided_lib.random_basis(key, p, q, rank)
    elif two_sided:
      basis = two_sided_lib.empty_basis(p, q, rank)
    elif init_projection == "random":
      basis = projection_lib.random_basis(key, o.basis_rows(), rank, projection)
    else:
      basis = projection_lib.empty_basis(o.basis_rows(), rank, projection)
    # Two buffers, not one twice, so that a caller may donate the state.
    shape = o.coordinates_shape(rank)
    mu_init, nu_init = jnp.zeros(shape, jnp.float32), jnp.zeros(shape, jnp.float32)
    if error_feedback:
      error = jnp.zeros(routing.matrix_shape(x.shape, axes), error_feedback_dtype)
    else:
      error = jnp.zeros((0,), jnp.float32)
    return LowRankMoments(basis, mu_init, nu_init, error)

  def init_fn(params):
    is_masked = lambda x: isinstance(x, optax.MaskedNode)  # noqa: E731
    leaves, treedef = jax.tree.flatten(params, is_leaf=is_masked)
    keys = list(jax.random.split(jax.random.key(seed), max(len(leaves), 1)))
    keyed = jax.tree.unflatten(treedef, keys[: len(leaves)])
    moments = jax.tree.map(
      lambda x, a, k: x if is_masked(x) else init_leaf(x, a, k),
      params,
      axes_of(params),
      keyed,
      is_leaf=is_masked,
    )
    return LowRankAdamState(
      count=jnp.zeros([], jnp.int32),
      moments=moments,
      refresh_failures=jnp.zeros([], jnp.int32),
      ledger=None if average_coordinates_over is None else collectives.init_ledger(),
    )

  def refresh_leaf(m, x, axes, count, first, key, computed=None):
    """A new basis for one matrix (``computed``: its ``(basis, ok)``, already made)."""
    o = orientation(x.shape, axes, side, two_sided)
    matrix = o.matrix(x)

    def exact():
      if two_sided:
        return warm()
      return projection_lib.exact_projection(matrix, m.basis, projection, rank, o.side)

    def warm():
      if computed is not None:
        return computed
      if two_sided:
        return two_sided_lib.compute_basis(
          matrix,
          m.basis,
          projection,
          rank,
          key,
          oversample=oversample,
          power_iterations=power_iterations,
        )
      return projection_lib.compute_projection(
        matrix, m.basis, projection, rank, subspace_iterations, side=o.side
      )

    if first is True:
      basis, ok = exact()
      return _Pair(m._replace(basis=basis), ok)
    if first is False or projection != "subspace_iteration":
      basis, ok = warm()
    else:
      basis, ok = jax.lax.cond(first, exact, warm)
    new_mu, new_nu = m.mu, m.nu
    if transport == "rotate":
      if two_sided:
        rotated = two_sided_lib.rotate_moments(m.mu, m.nu, basis, m.basis, count, b1, b2)
      else:
        rotated = rotate_moments(m.mu, m.nu, basis, m.basis, count, b1, b2, left=o.left)
      keep = jnp.logical_or(first, ~ok)
      new_mu = jnp.where(keep, m.mu, rotated[0])
      new_nu = jnp.where(keep, m.nu, rotated[1])
    elif transport == "reset":
      new_mu = jnp.where(ok, jnp.zeros_like(m.mu), m.mu)
      new_nu = jnp.where(ok, jnp.zeros_like(m.nu), m.nu)
    return _Pair(LowRankMoments(basis, new_mu, new_nu, m.error), ok)

  def leaf_keys(moments, count):
    """One PRNG key per matrix, from the seed and the step: alike on every worker."""
    is_node = lambda x: isinstance(x, (LowRankMoments, optax.MaskedNode))  # noqa: E731
    leaves, treedef = jax.tree.flatten(moments, is_leaf=is_node)
    base = jax.random.fold_in(jax.random.key(seed + 1), count)
    keys = [jax.random.fold_in(base, i) for i in range(len(leaves))]
    return jax.tree.unflatten(treedef, keys)

  def refresh_with_count(state, source, count, first, computed=None):
    source = map_matrices(lambda m, x: x, state.moments, source)
    if computed is None:
      computed = map_matrices(lambda m: None, state.moments)
    results = map_matrices(
      lambda m, x, a, k, c: refresh_leaf(m, x, a, count, first, k, c),
      state.moments,
      source,
      axes_of(source),
      leaf_keys(state.moments, count),
      computed,
    )
    moments, oks = _unzip(results)
    failures = sum((~ok).astype(jnp.int32) for ok in jax.tree.leaves(oks))
    return state._replace(moments=moments, refresh_failures=state.refresh_failures + failures)

  def refresh(state, source, *, first=False):
    return refresh_with_count(state, source, state.count, first)

  def project_leaf(m, g, q, axes):
    """``(c, E)``: the coordinates of ``A = G + E`` and the new error buffer."""
    o = orientation(g.shape, axes, side, two_sided)
    fed = o.matrix(g).astype(jnp.float32)
    if error_feedback:
      fed = fed + m.error.astype(jnp.float32)
    coordinates = o.project(q, fed)
    error = (fed - o.unproject(q, coordinates)).astype(m.error.dtype) if error_feedback else m.error
    return _Pair(coordinates, error)

  def step_leaf(m, g, q, axes, count, coordinates, error):
    o = orientation(g.shape, axes, side, two_sided)
    new_mu = b1 * m.mu + (1 - b1) * coordinates
    new_nu = b2 * m.nu + (1 - b2) * coordinates**2
    denominator = jnp.sqrt(new_nu / (1 - b2**count)) + eps
    low_rank_direction = o.unproject(q, (new_mu / (1 - b1**count)) / denominator)
    direction = quasi_hyperbolic_mix(
      o.matrix(g).astype(jnp.float32),
      low_rank_direction,
      denominator,
      omega,
      mu,
      full_rank_scale,
      side="left" if two_sided else o.side,  # Two-sided: a scalar scale, no side.
    )
    moments = LowRankMoments(m.basis, new_mu, new_nu, error)
    return _Pair(o.leaf(direction).astype(g.dtype), moments)

  def sketched_refresh(state, updates, first):
    """A randomized-SVD refresh from averaged sketches, never the full gradient."""
    axes = axes_of(updates)
    source = map_matrices(
      lambda m, x, a: orientation(x.shape, a, side, True).matrix(x), state.moments, updates, axes
    )
    ledger = [state.ledger]

    def mean(products):
      averaged, ledger[0] = collectives.counted_pmean(products, ledger[0], average_coordinates_over)
      return averaged

    def listed(tree):
      """The matrices' entries of ``tree``, in order."""
      entries = []
      map_matrices(lambda m, x: entries.append(x), state.moments, tree)
      return entries

    previous = [m.basis for m in listed(state.moments)]
    bases = two_sided_lib.randomized_bases(
      listed(source),
      rank,
      listed(leaf_keys(state.moments, state.count)),
      oversample=oversample,
      power_iterations=power_iterations,
      mean=mean,
    )
    results = iter(two_sided_lib.checked(bases, previous))
    computed = map_matrices(lambda m: next(results), state.moments)
    state = state._replace(ledger=ledger[0])
    return refresh_with_count(state, updates, state.count, first, computed)

  def averaged_refresh(state, updates, first):
    """A refresh from the workers' mean gradient (``average_coordinates_over``)."""
    if two_sided and projection == "randomized_svd":
      return sketched_refresh(state, updates, first)
    source = map_matrices(lambda m, x: x, state.moments, updates)
    source, ledger = collectives.counted_pmean(source, state.ledger, average_coordinates_over)
    return refresh_with_count(state._replace(ledger=ledger), source, state.count, first)

  def update_fn(updates, state, params=None):
    del params
    if average_coordinates_over is not None:
      collectives.check_axis_bound(average_coordinates_over, "scale_by_low_rank_adam")
    count = optax.safe_int32_increment(state.count)
    refresh_now = None
    if refresh_every is not None:
      refresh_now = (count - 1) % refresh_every == 0
    if init_projection == "gradient":
      refresh_now = count == 1 if refresh_now is None else refresh_now | (count == 1)
    if refresh_now is not None:
      if average_coordinates_over is None:
        refresh = lambda s, u, first: refresh_with_count(s, u, s.count, first)  # noqa: E731
      else:
        refresh = averaged_refresh
      state = jax.lax.cond(refresh_now, lambda: refresh(state, updates, count == 1), lambda: state)
    axes = axes_of(updates)
    # Each basis matrix is formed once per step and used by both products.
    bases = map_matrices(lambda m: projection_lib.basis_matrix(m.basis), state.moments)
    coordinates, errors = _unzip(map_matrices(project_leaf, state.moments, updates, bases, axes))
    if average_coordinates_over is not None:
      coordinates, ledger = collectives.counted_pmean(
        coordinates, state.ledger, average_coordinates_over
      )
      state = state._replace(ledger=ledger)
    results = map_matrices(
      lambda m, g, q, a, c, e: step_leaf(m, g, q, a, count, c, e),
      state.moments,
      updates,
      bases,
      axes,
      coordinates,
      errors,
    )
    directions, moments = _unzip(results)
    return directions, state._replace(count=count, moments=moments)

  return LowRankAdam(init_fn, update_fn, refresh)
