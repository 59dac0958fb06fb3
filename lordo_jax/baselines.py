r"""The methods LoRDO is compared with, built from the same pieces as :func:`lordo`.

Each baseline of SPEC section 6 is a chain of the library's public transformations,
so every method is measured the same way (its ledger, :func:`lordo_jax.state_bytes`):

* :func:`ddp`: :func:`average_gradients`, then AdamW.
* :func:`low_rank_ddp`: :func:`average_gradients`, then low-rank Adam (GaLore) routed
  as in :func:`lordo`; with ``communicate="projected"`` the low-rank Adam averages
  only its ``r x q`` coordinates (and the gradient on refresh steps).
* :func:`local_adam`: :func:`synchronize` of AdamW, params and both moments every K.
* :func:`desloc`: :func:`synchronize` of AdamW, params every K_x, moments every K_u
  and K_v.
* :func:`diloco`: :func:`synchronize` of AdamW with an outer Nesterov SGD; moments
  stay local.
* :func:`lordo_local_projection`: :func:`synchronize` of LoRDO's local step, each
  worker's basis from its own gradient; moments stay local.
* :func:`lordo_global_projection_only`: :func:`lordo` with ``omega = 1``.

Communication per step and per ``p x q`` matrix (payload elements per worker, before
the ring all-reduce's ``2 (M - 1) / M``), SPEC section 7: DDP and low-rank DDP
(``full``) ``pq``; low-rank DDP (``projected``) ``rq + pq / T``; Local Adam ``3pq / K``;
DES-LOC ``pq (1/K_x + 1/K_u + 1/K_v)``; DiLoCo ``pq / K``; LoRDO ``(pq + 2rq) / K``.
"""

import numbers
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from lordo_jax import aliases
from lordo_jax import checks
from lordo_jax import collectives
from lordo_jax import compression as compression_lib
from lordo_jax import low_rank as low_rank_lib
from lordo_jax import precision
from lordo_jax import quasi_hyperbolic
from lordo_jax import routing
from lordo_jax import sync

COMMUNICATE = ("full", "projected")


class AverageGradientsState(NamedTuple):
  """State of :func:`average_gradients`."""

  ledger: collectives.Ledger  # What this transformation has all-reduced since init.
  residual: Any = ()  # float32 like params: compression error feedback; () without.


def average_gradients(
  axis_name: str | None, *, compression: str | None = None
) -> optax.GradientTransformation:
  r"""Replaces each worker's gradient by the mean over the workers (data parallelism).

  .. math::
    \bar G = \frac{1}{M} \sum_{m=1}^{M} G_m

  One all-reduce of the whole update tree per step, through
  :func:`lordo_jax.counted_pmean`, counted in the state's ledger. Chain it before any
  optimizer to make it data-parallel (:func:`ddp`, :func:`low_rank_ddp`).

  With ``compression`` the gradient is sent as bfloat16 or int8 with per-row scales
  (:func:`lordo_jax.collectives.counted_mean`) and error feedback: each worker sends
  :math:`G_m + e_m` and keeps what the rounding lost in :math:`e_m`, so over a run
  the sum of the means it returns plus the mean residual equals the sum of the true
  means (Seide et al. 2014; Karimireddy et al. 2019).

  Args:
    axis_name: the worker axis (``jax.shard_map`` mesh axis or ``jax.pmap`` axis
      name); ``None`` for one worker, where it is the identity and sends nothing.
    compression: ``None``, ``"bfloat16"`` or ``"int8"``.

  Returns:
    An ``optax.GradientTransformation``.

  Examples:
    >>> import jax.numpy as jnp, lordo_jax
    >>> tx = lordo_jax.average_gradients(None)
    >>> grads = {"w": jnp.ones((2, 3))}
    >>> updates, state = tx.update(grads, tx.init(grads))
    >>> lordo_jax.communicated_bytes(state)
    0

  References:
    Li et al., `PyTorch Distributed: Experiences on Accelerating Data Parallel
    Training <https://arxiv.org/abs/2006.15704>`_, VLDB 2020.
  """

  checks.one_of("average_gradients", "compression", compression, (None, *compression_lib.CODECS))

  def init_fn(params):
    residual = ()
    if compression is not None:
      residual = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), params)
    return AverageGradientsState(ledger=collectives.init_ledger(), residual=residual)

  def update_fn(updates, state, params=None):
    del params
    collectives.check_axis_bound(axis_name, "average_gradients")
    updates, ledger, residual = collectives.counted_mean(
      updates,
      state.ledger,
      axis_name,
      compression_codec=compression,
      residual=state.residual if compression is not None else None,
    )
    return updates, AverageGradientsState(
      ledger=ledger, residual=residual if compression is not None else ()
    )

  return optax.GradientTransformation(init_fn, update_fn)


def _adamw(learning_rate, b1, b2, eps, weight_decay) -> optax.GradientTransformation:
  """``optax.adamw`` from its pieces, moments in float32 as on LoRDO's full-rank path.

  For float32 params this is exactly ``optax.adamw``; for bfloat16 params the
  moments stay float32 (:func:`lordo_jax.in_float32`), so every method keeps its
  moments at the same precision.
  """
  return optax.chain(
    precision.in_float32(optax.scale_by_adam(b1=b1, b2=b2, eps=eps)),
    optax.add_decayed_weights(weight_decay),
    optax.scale_by_learning_rate(learning_rate),
  )


def _error_feedback_dtype_name(who: str, dtype: Any) -> str:
  name = dtype if isinstance(dtype, str) else jnp.dtype(dtype).name
  checks.one_of(who, "error_feedback_dtype", name, aliases.ERROR_FEEDBACK_DTYPES)
  return name


def _low_rank_step(
  who: str,
  *,
  learning_rate,
  rank,
  omega,
  mu,
  b1,
  b2,
  eps,
  weight_decay,
  projection,
  side,
  transport,
  error_feedback,
  error_feedback_dtype,
  full_rank_scale,
  low_rank_labels,
  subspace_iterations,
  seed,
  refresh_every,
  init_projection,
  average_coordinates_over=None,
  two_sided=False,
  oversample=None,
  power_iterations=None,
):
  """Checks the low-rank options, then ``(low_rank, local)`` as :func:`lordo` builds them.

  ``low_rank`` is the :class:`~lordo_jax.LowRankAdam` on the matrices; ``local`` is
  :func:`lordo_jax.aliases.local_adamw_path` around it (Adam on the other leaves,
  decoupled weight decay, learning rate).
  """
  checks.positive_int(who, "rank", rank)
  checks.positive_int(who, "subspace_iterations", subspace_iterations)
  checks.in_interval(who, "omega", omega, 0.0, 1.0, closed_high=True)
  checks.positive(who, "mu", mu)
  aliases._check_adam(who, b1, b2, eps, weight_decay)
  checks.one_of(who, "side", side, low_rank_lib.SIDES)
  checks.one_of(who, "transport", transport, low_rank_lib.TRANSPORTS)
  checks.one_of(who, "full_rank_scale", full_rank_scale, quasi_hyperbolic.FULL_RANK_SCALES)
  low_rank_lib.check_projection(
    who, projection, two_sided=two_sided, side=side, full_rank_scale=full_rank_scale
  )
  error_feedback_dtype = _error_feedback_dtype_name(who, error_feedback_dtype)
  low_rank = low_rank_lib.scale_by_low_rank_adam(
    rank,
    b1=b1,
    b2=b2,
    eps=eps,
    omega=omega,
    mu=mu,
    full_rank_scale=full_rank_scale,
    projection=projection,
    side=side,
    transport=transport,
    error_feedback=error_feedback,
    error_feedback_dtype=error_feedback_dtype,
    subspace_iterations=subspace_iterations,
    refresh_every=refresh_every,
    init_projection=init_projection,
    seed=seed,
    matrix_axes=low_rank_labels,
    average_coordinates_over=average_coordinates_over,
    two_sided=two_sided,
    oversample=oversample,
    power_iterations=power_iterations,
  )
  local = aliases.local_adamw_path(
    low_rank,
    learning_rate=learning_rate,
    b1=b1,
    b2=b2,
    eps=eps,
    weight_decay=weight_decay,
    rank=rank,
    low_rank_labels=low_rank_labels,
  )
  return low_rank, local


def ddp(
  learning_rate: optax.ScalarOrSchedule,
  *,
  axis_name: str | None = None,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
  weight_decay: float = 0.0,
  compression: str | None = None,
) -> optax.GradientTransformation:
  r"""Data-parallel AdamW (DDP): the full gradient is averaged every step.

  .. math::
    \bar G = \mathrm{pmean}_m(G_m), \qquad
    \text{update} = \mathrm{AdamW}(\bar G)

  The chain :func:`average_gradients` then AdamW (``optax.adamw``'s pieces, moments
  in float32 whatever the parameter dtype); every worker holds the
  same parameters and moments. Communication: ``pq`` elements per ``p x q`` leaf
  per step (SPEC section 7).

  Args:
    learning_rate: a float or an optax schedule.
    axis_name: the worker axis of ``jax.shard_map`` or ``jax.pmap``; ``None`` for
      one worker.
    b1, b2, eps: Adam's parameters.
    weight_decay: decoupled weight decay, as in ``optax.adamw``.
    compression: ``None``, ``"bfloat16"`` or ``"int8"``: the gradient sent
      compressed, with error feedback (:func:`average_gradients`).

  Returns:
    An ``optax.GradientTransformation``.

  Examples:
    >>> import jax.numpy as jnp, optax, lordo_jax
    >>> params = {"w": jnp.ones((4, 3))}
    >>> tx = lordo_jax.ddp(1e-2)
    >>> state = tx.init(params)
    >>> updates, state = tx.update({"w": jnp.ones((4, 3))}, state, params)
    >>> params = optax.apply_updates(params, updates)

  References:
    Li et al., `PyTorch Distributed: Experiences on Accelerating Data Parallel
    Training <https://arxiv.org/abs/2006.15704>`_, VLDB 2020; Loshchilov & Hutter,
    `Decoupled Weight Decay Regularization <https://arxiv.org/abs/1711.05101>`_,
    ICLR 2019.
  """
  aliases._check_adam("ddp", b1, b2, eps, weight_decay)
  return optax.chain(
    average_gradients(axis_name, compression=compression),
    _adamw(learning_rate, b1, b2, eps, weight_decay),
  )


def low_rank_ddp(
  learning_rate: optax.ScalarOrSchedule,
  *,
  rank: int,
  refresh_every: int = 200,
  axis_name: str | None = None,
  communicate: str = "full",
  omega: float = 1.0,
  mu: float = 1.0,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
  weight_decay: float = 0.0,
  projection: str = "svd",
  side: str = "auto",
  transport: str = "keep",
  error_feedback: bool = False,
  error_feedback_dtype: Any = "float32",
  full_rank_scale: str = "scalar",
  low_rank_labels: Any = None,
  subspace_iterations: int = 2,
  compression: str | None = None,
  two_sided: bool = False,
  oversample: int | None = None,
  power_iterations: int | None = None,
) -> optax.GradientTransformation:
  r"""Low-rank DDP (GaLore-DDP): low-rank Adam on the averaged gradient.

  Every step, on each low-rank matrix (SPEC sections 3 and 6):

  .. math::
    \bar G = \mathrm{pmean}_m(G_m), \quad c = Q^\top \bar G, \quad
    u \leftarrow \beta_1 u + (1 - \beta_1) c, \quad
    v \leftarrow \beta_2 v + (1 - \beta_2) c^2, \quad
    \text{update} = -\eta \left(Q \frac{\hat u}{\sqrt{\hat v} + \epsilon}
      + \lambda W\right)

  and Q is recomputed from :math:`\bar G` at steps 1, T + 1, 2T + 1, ... With the
  defaults (``omega = 1``, ``transport="keep"``, ``projection="svd"``) this is
  ``optax.contrib.galore`` on the mean gradient, up to the sign convention of the
  singular vectors (ours are canonical, SPEC section 5). Leaves that are not
  low-rank matrices take AdamW on the averaged gradient.

  ``communicate`` chooses what travels; both give the same iterates, since Q is
  shared and projection is linear:

  * ``"full"`` (default; DDP + GaLore, the paper's baseline): the full gradient
    every step, ``pq`` elements per matrix;
  * ``"projected"``: the coordinates ``c`` (``rq``) every step, plus the full
    gradient on refresh steps (``pq / T`` per step on average). It needs
    ``omega = 1`` and ``error_feedback=False``, which use the full gradient.

  ``two_sided=True`` is TSR-Adam (:mod:`lordo_jax.two_sided`): the moments are the
  ``r x r`` cores :math:`U^\top \bar G V`; with ``communicate="projected"`` the
  per-step message is that core (``r^2`` per matrix), and a refresh with
  ``projection="randomized_svd"`` averages sketches (``(p + q)(r + oversample)``
  elements per pass) instead of the ``p x q`` gradient.

  Args:
    learning_rate: a float or an optax schedule.
    rank: r, the dimension of each matrix's subspace.
    refresh_every: T, steps between basis refreshes (GaLore's ``update_proj_gap``).
    axis_name: the worker axis; ``None`` for one worker.
    communicate: ``"full"`` or ``"projected"``.
    omega: weight of the low-rank term of the quasi-hyperbolic mix (1: none of the
      full-rank term, plain GaLore).
    mu: rescaling of the full-rank term.
    b1, b2, eps: Adam's parameters.
    weight_decay: decoupled weight decay, as in ``optax.adamw``.
    projection: ``"svd"``, ``"subspace_iteration"`` or ``"dct"``; two-sided:
      ``"svd"`` or ``"randomized_svd"``.
    side: ``"auto"``, ``"left"`` or ``"right"``.
    transport: moments at a refresh: ``"keep"`` (GaLore), ``"rotate"`` or
      ``"reset"``.
    error_feedback: keep and feed back the projection residual.
    error_feedback_dtype: ``"float32"`` or ``"bfloat16"``.
    full_rank_scale: ``"scalar"`` or ``"vector"``.
    low_rank_labels: which leaves are low-rank (see :mod:`lordo_jax.routing`).
    subspace_iterations: iterations per refresh with ``"subspace_iteration"``.
    compression: ``None``, ``"bfloat16"`` or ``"int8"``: with ``communicate="full"``
      the gradient is sent compressed, with error feedback
      (:func:`average_gradients`).
    two_sided: project on both sides (TSR-Adam), ``r x r`` moments and messages.
    oversample, power_iterations: of the ``randomized_svd`` refresh (``None``: 8
      extra sketch columns, 1 power iteration).

  Returns:
    An ``optax.GradientTransformation``.

  Examples:
    >>> import jax.numpy as jnp, optax, lordo_jax
    >>> params = {"w": jnp.ones((16, 8)), "b": jnp.zeros(8)}
    >>> tx = lordo_jax.low_rank_ddp(1e-2, rank=2, refresh_every=10)
    >>> state = tx.init(params)
    >>> grads = {"w": jnp.arange(128.0).reshape(16, 8), "b": jnp.ones(8)}
    >>> updates, state = tx.update(grads, state, params)
    >>> params = optax.apply_updates(params, updates)

  References:
    Zhao et al., `GaLore: Memory-Efficient LLM Training by Gradient Low-Rank
    Projection <https://arxiv.org/abs/2403.03507>`_, ICML 2024; Jovanović et al.,
    `LoRDO <https://arxiv.org/abs/2602.04396>`_, ICML 2026 (the baseline); Dang et
    al., `TSR-Adam <https://arxiv.org/abs/2602.08007>`_, 2026 (two-sided).
  """
  who = "low_rank_ddp"
  checks.positive_int(who, "refresh_every", refresh_every)
  checks.one_of(who, "communicate", communicate, COMMUNICATE)
  projected = communicate == "projected"
  if projected and not (isinstance(omega, numbers.Real) and omega == 1):
    raise ValueError(
      f"{who}: omega={omega!r} is not accepted with communicate='projected'; expected "
      "1.0. The full-rank term needs the averaged full gradient at every step: use "
      "communicate='full'."
    )
  if projected and compression is not None:
    raise ValueError(
      f"{who}: compression={compression!r} is not accepted with "
      "communicate='projected'; expected None. Compress the full gradient with "
      "communicate='full', or send the r x q coordinates uncompressed."
    )
  if projected and error_feedback:
    raise ValueError(
      f"{who}: error_feedback={error_feedback!r} is not accepted with "
      "communicate='projected'; expected False. Error feedback needs the averaged "
      "full gradient at every step: use communicate='full'."
    )
  _, local = _low_rank_step(
    who,
    learning_rate=learning_rate,
    rank=rank,
    omega=omega,
    mu=mu,
    b1=b1,
    b2=b2,
    eps=eps,
    weight_decay=weight_decay,
    projection=projection,
    side=side,
    transport=transport,
    error_feedback=error_feedback,
    error_feedback_dtype=error_feedback_dtype,
    full_rank_scale=full_rank_scale,
    low_rank_labels=low_rank_labels,
    subspace_iterations=subspace_iterations,
    seed=0,
    refresh_every=refresh_every,
    init_projection="gradient",
    average_coordinates_over=axis_name if projected else None,
    two_sided=two_sided,
    oversample=oversample,
    power_iterations=power_iterations,
  )
  if not projected:
    return optax.chain(average_gradients(axis_name, compression=compression), local)

  # Only the leaves off the low-rank path are averaged in full here; the low-rank
  # transformation averages its coordinates (and, on refresh steps, the gradient).
  labels = routing.partition_labels(low_rank_labels, rank)

  def full_rank_mask(tree):
    return jax.tree.map(lambda label: label == routing.FULL_RANK, labels(tree))

  return optax.chain(optax.masked(average_gradients(axis_name), full_rank_mask), local)


def local_adam(
  learning_rate: optax.ScalarOrSchedule,
  *,
  sync_every: Any,
  axis_name: str | None = None,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
  weight_decay: float = 0.0,
  compression: str | None = None,
  fragments: Any = None,
  fault_tolerant: bool = False,
) -> optax.GradientTransformationExtraArgs:
  r"""Local Adam: local AdamW steps; params and both moments averaged every K steps.

  Each worker m takes AdamW steps on its own gradients; at every step with
  :math:`t \bmod K = 0`:

  .. math::
    \theta = \mathrm{pmean}_m(\theta_m), \qquad
    u = \mathrm{pmean}_m(u_m), \qquad v = \mathrm{pmean}_m(v_m)

  (the parameters through the pseudo-gradient :math:`\text{anchor} - \theta_m` and
  plain averaging, :func:`synchronize` with the identity outer step).
  Communication: ``3pq`` elements per ``p x q`` leaf per K steps (SPEC section 7).

  Args:
    learning_rate: a float or an optax schedule.
    sync_every: K, local steps per round, or a function of the step
      (:mod:`lordo_jax.schedules`).
    axis_name: the worker axis; ``None`` for one worker.
    b1, b2, eps: Adam's parameters.
    weight_decay: decoupled weight decay, as in ``optax.adamw``.
    compression: ``None``, ``"bfloat16"`` or ``"int8"``: the round's messages sent
      compressed, the pseudo-gradient with error feedback (with ``"int8"`` the
      moments go in bfloat16; :func:`lordo_jax.synchronize`).
    fragments: ``None`` (default): no streaming; F > 1 streams the round (F
      fragments synced at staggered steps; :func:`lordo_jax.synchronize`).
    fault_tolerant: leave failed or absent workers out of the averages
      (``update(..., worker_present=False)``; :func:`lordo_jax.synchronize`).

  Returns:
    An ``optax.GradientTransformationExtraArgs``; its ``update`` needs params.

  Examples:
    >>> import jax.numpy as jnp, optax, lordo_jax
    >>> params = {"w": jnp.ones((4, 3))}
    >>> tx = lordo_jax.local_adam(1e-2, sync_every=8)
    >>> state = tx.init(params)
    >>> updates, state = tx.update({"w": jnp.ones((4, 3))}, state, params)

  References:
    Douillard et al., `DiLoCo <https://arxiv.org/abs/2311.08105>`_, 2023 (local
    updates with an outer step); Iacob et al., `DES-LOC
    <https://arxiv.org/abs/2505.22549>`_, 2025 (Local Adam averages both moments).
  """
  who = "local_adam"
  aliases._check_adam(who, b1, b2, eps, weight_decay)
  return sync.synchronize(
    _adamw(learning_rate, b1, b2, eps, weight_decay),
    sync_every=sync_every,
    axis_name=axis_name,
    first_moment_every=1,
    second_moment_every=1,
    compression=compression,
    fragments=fragments,
    fault_tolerant=fault_tolerant,
    name=who,
  )


def _period_in_syncs(who: str, name: str, steps, sync_every: int) -> int:
  """A period in steps (a multiple of ``sync_every``) as a number of syncs."""
  checks.positive_int(who, name, steps)
  if steps % sync_every:
    raise ValueError(
      f"{who}: {name}={steps!r} is not accepted; expected a multiple of "
      f"sync_every={sync_every} (moments are averaged only at a sync)."
    )
  return steps // sync_every


def desloc(
  learning_rate: optax.ScalarOrSchedule,
  *,
  sync_every: int,
  first_moment_every: int | None = None,
  second_moment_every: int | None = None,
  axis_name: str | None = None,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
  weight_decay: float = 0.0,
  compression: str | None = None,
  fragments: Any = None,
  fault_tolerant: bool = False,
) -> optax.GradientTransformationExtraArgs:
  r"""DES-LOC: local AdamW with independent periods for params and each moment.

  Each worker takes AdamW steps on its own gradients; at the end of step t

  .. math::
    \theta &= \mathrm{pmean}_m(\theta_m) \quad \text{if } t \bmod K_x = 0, \\
    u &= \mathrm{pmean}_m(u_m) \quad \text{if } t \bmod K_u = 0, \qquad
    v = \mathrm{pmean}_m(v_m) \quad \text{if } t \bmod K_v = 0.

  :func:`synchronize` with ``first_moment_every = K_u / K_x`` and
  ``second_moment_every = K_v / K_x`` syncs. Communication per ``p x q`` leaf:
  ``pq (1 + K_x/K_u + K_x/K_v)`` elements per K_x steps (SPEC section 7).

  Args:
    learning_rate: a float or an optax schedule.
    sync_every: K_x, steps between parameter averages.
    first_moment_every: K_u, steps between first-moment averages; a multiple of
      K_x; ``None``: 3 K_x (the paper's setting).
    second_moment_every: K_v, the same for the second moment; ``None``: 6 K_x.
    axis_name: the worker axis; ``None`` for one worker.
    b1, b2, eps: Adam's parameters.
    weight_decay: decoupled weight decay, as in ``optax.adamw``.
    compression: ``None``, ``"bfloat16"`` or ``"int8"``: the round's messages sent
      compressed, the pseudo-gradient with error feedback (with ``"int8"`` the
      moments go in bfloat16; :func:`lordo_jax.synchronize`).
    fragments: ``None`` (default): no streaming; F > 1 streams the round (F
      fragments synced at staggered steps; :func:`lordo_jax.synchronize`).
    fault_tolerant: leave failed or absent workers out of the averages
      (``update(..., worker_present=False)``; :func:`lordo_jax.synchronize`).

  Returns:
    An ``optax.GradientTransformationExtraArgs``; its ``update`` needs params.

  Examples:
    >>> import jax.numpy as jnp, optax, lordo_jax
    >>> params = {"w": jnp.ones((4, 3))}
    >>> tx = lordo_jax.desloc(1e-2, sync_every=4)  # K_u = 12, K_v = 24
    >>> state = tx.init(params)
    >>> updates, state = tx.update({"w": jnp.ones((4, 3))}, state, params)

  References:
    Iacob et al., `DES-LOC: Desynced Low Communication Adaptive Optimizers for
    Training Foundation Models <https://arxiv.org/abs/2505.22549>`_, 2025.
  """
  who = "desloc"
  checks.positive_int(who, "sync_every", sync_every)
  aliases._check_adam(who, b1, b2, eps, weight_decay)
  if first_moment_every is None:
    first_moment_every = 3 * sync_every
  if second_moment_every is None:
    second_moment_every = 6 * sync_every
  return sync.synchronize(
    _adamw(learning_rate, b1, b2, eps, weight_decay),
    sync_every=sync_every,
    axis_name=axis_name,
    first_moment_every=_period_in_syncs(who, "first_moment_every", first_moment_every, sync_every),
    second_moment_every=_period_in_syncs(
      who, "second_moment_every", second_moment_every, sync_every
    ),
    compression=compression,
    fragments=fragments,
    fault_tolerant=fault_tolerant,
    name=who,
  )


def diloco(
  learning_rate: optax.ScalarOrSchedule,
  *,
  sync_every: Any,
  axis_name: str | None = None,
  outer_learning_rate: float = 0.7,
  outer_momentum: float = 0.9,
  nesterov: bool = True,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
  weight_decay: float = 0.0,
  compression: str | None = None,
  fragments: Any = None,
  fault_tolerant: bool = False,
) -> optax.GradientTransformationExtraArgs:
  r"""DiLoCo: local AdamW, an outer Nesterov SGD on the averaged pseudo-gradient.

  Each worker takes AdamW steps on its own gradients and keeps its moments to itself;
  at every step with :math:`t \bmod K = 0`:

  .. math::
    \Delta &= \mathrm{pmean}_m(\text{anchor} - \theta_m), \qquad
    b \leftarrow \mu_o b + \Delta, \\
    \theta &= \text{anchor} - \eta_o (\Delta + \mu_o b) \ \text{(Nesterov; without
      it } \eta_o b\text{)}, \qquad \text{anchor} = \theta.

  :func:`synchronize` with ``optax.sgd(outer_learning_rate, outer_momentum,
  nesterov)`` as the outer optimizer and no moment averaging. Communication: ``pq``
  elements per ``p x q`` leaf per K steps (SPEC section 7).

  Args:
    learning_rate: the inner AdamW's learning rate (float or schedule).
    sync_every: K (the paper's H), local steps per round, or a function of the
      step (:mod:`lordo_jax.schedules`).
    axis_name: the worker axis; ``None`` for one worker.
    outer_learning_rate: :math:`\eta_o`.
    outer_momentum: :math:`\mu_o`.
    nesterov: Nesterov momentum in the outer step.
    b1, b2, eps: the inner Adam's parameters.
    weight_decay: the inner AdamW's decoupled weight decay.
    compression: ``None``, ``"bfloat16"`` or ``"int8"``: the round's messages sent
      compressed, the pseudo-gradient with error feedback (with ``"int8"`` the
      moments go in bfloat16; :func:`lordo_jax.synchronize`).
    fragments: ``None`` (default): no streaming; F > 1 streams the round (F
      fragments synced at staggered steps; :func:`lordo_jax.synchronize`).
    fault_tolerant: leave failed or absent workers out of the averages
      (``update(..., worker_present=False)``; :func:`lordo_jax.synchronize`).

  Returns:
    An ``optax.GradientTransformationExtraArgs``; its ``update`` needs params.

  Examples:
    >>> import jax.numpy as jnp, optax, lordo_jax
    >>> params = {"w": jnp.ones((4, 3))}
    >>> tx = lordo_jax.diloco(1e-2, sync_every=8)
    >>> state = tx.init(params)
    >>> updates, state = tx.update({"w": jnp.ones((4, 3))}, state, params)

  References:
    Douillard et al., `DiLoCo: Distributed Low-Communication Training of Language
    Models <https://arxiv.org/abs/2311.08105>`_, 2023.
  """
  who = "diloco"
  checks.positive(who, "outer_learning_rate", outer_learning_rate)
  checks.in_interval(who, "outer_momentum", outer_momentum, 0.0, 1.0, closed_high=False)
  checks.one_of(who, "nesterov", nesterov, (True, False))
  aliases._check_adam(who, b1, b2, eps, weight_decay)
  outer = optax.sgd(outer_learning_rate, momentum=outer_momentum, nesterov=nesterov)
  return sync.synchronize(
    _adamw(learning_rate, b1, b2, eps, weight_decay),
    sync_every=sync_every,
    axis_name=axis_name,
    outer_optimizer=outer,
    first_moment_every=None,
    second_moment_every=None,
    compression=compression,
    fragments=fragments,
    fault_tolerant=fault_tolerant,
    name=who,
  )


def lordo_local_projection(
  learning_rate: optax.ScalarOrSchedule,
  *,
  rank: int,
  sync_every: Any,
  axis_name: str | None = None,
  omega: float = 0.7,
  mu: float = 1.0,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
  weight_decay: float = 0.0,
  projection: str = "svd",
  side: str = "auto",
  transport: str = "rotate",
  error_feedback: bool = False,
  error_feedback_dtype: Any = "float32",
  outer_optimizer: optax.GradientTransformation | None = None,
  full_rank_scale: str = "scalar",
  low_rank_labels: Any = None,
  subspace_iterations: int = 2,
  compression: str | None = None,
  fragments: Any = None,
  fault_tolerant: bool = False,
) -> optax.GradientTransformationExtraArgs:
  r"""LoRDO ablation: each worker projects with its own gradient; moments stay local.

  The local step of :func:`lordo` (SPEC section 3) and its pseudo-gradient average
  every K steps, but every basis comes from the worker's own current gradient
  :math:`G_m` (at step 1 and at every sync), not from the averaged pseudo-gradient:

  .. math::
    Q_m = \mathrm{ComputeProjection}(G_m), \qquad
    \theta = \mathrm{pmean}_m(\theta_m) \ \text{every K steps}.

  The bases then differ between workers, so the low-rank moments live in different
  subspaces and are not averaged (nor are the full-rank path's). Communication:
  ``pq`` elements per ``p x q`` leaf per K steps; no first-gradient message.

  Args:
    learning_rate: a float or an optax schedule.
    rank: r.
    sync_every: K, or a function of the step (:mod:`lordo_jax.schedules`).
    axis_name: the worker axis; ``None`` for one worker.
    omega, mu, b1, b2, eps, weight_decay, projection, side, transport,
      error_feedback, error_feedback_dtype, outer_optimizer, full_rank_scale,
      low_rank_labels, subspace_iterations: as in :func:`lordo`.
    compression: ``None``, ``"bfloat16"`` or ``"int8"``: the round's messages sent
      compressed, the pseudo-gradient with error feedback (with ``"int8"`` the
      moments go in bfloat16; :func:`lordo_jax.synchronize`).
    fragments: ``None`` (default): no streaming; F > 1 streams the round (F
      fragments synced at staggered steps; :func:`lordo_jax.synchronize`).
    fault_tolerant: leave failed or absent workers out of the averages
      (``update(..., worker_present=False)``; :func:`lordo_jax.synchronize`).

  Returns:
    An ``optax.GradientTransformationExtraArgs``; its ``update`` needs params.

  Examples:
    >>> import jax.numpy as jnp, optax, lordo_jax
    >>> params = {"w": jnp.ones((16, 8))}
    >>> tx = lordo_jax.lordo_local_projection(1e-2, rank=2, sync_every=4)
    >>> state = tx.init(params)
    >>> grads = {"w": jnp.arange(128.0).reshape(16, 8)}
    >>> updates, state = tx.update(grads, state, params)

  References:
    Jovanović et al., `LoRDO: Distributed Low-Rank Optimization with Infrequent
    Communication <https://arxiv.org/abs/2602.04396>`_, ICML 2026 (the local
    projection ablation).
  """
  who = "lordo_local_projection"
  low_rank, local = _low_rank_step(
    who,
    learning_rate=learning_rate,
    rank=rank,
    omega=omega,
    mu=mu,
    b1=b1,
    b2=b2,
    eps=eps,
    weight_decay=weight_decay,
    projection=projection,
    side=side,
    transport=transport,
    error_feedback=error_feedback,
    error_feedback_dtype=error_feedback_dtype,
    full_rank_scale=full_rank_scale,
    low_rank_labels=low_rank_labels,
    subspace_iterations=subspace_iterations,
    seed=0,
    refresh_every=None,
    init_projection="external",
  )
  return sync.synchronize(
    local,
    sync_every=sync_every,
    axis_name=axis_name,
    outer_optimizer=outer_optimizer,
    first_moment_every=None,
    second_moment_every=None,
    low_rank=low_rank,
    init_projection="gradient",
    projection_source="local_gradient",
    compression=compression,
    fragments=fragments,
    fault_tolerant=fault_tolerant,
    name=who,
  )


def lordo_global_projection_only(
  learning_rate: optax.ScalarOrSchedule,
  *,
  rank: int,
  sync_every: Any,
  **options: Any,
) -> optax.GradientTransformationExtraArgs:
  r"""LoRDO ablation without the full-rank term: :func:`lordo` with ``omega = 1``.

  .. math::
    \text{direction} = Q \frac{\hat u}{\sqrt{\hat v} + \epsilon}

  Every local update then lies in span(Q), so the averaged pseudo-gradient does too,
  and its top-r subspace, the next Q, is span(Q) again: the subspace never moves
  from the first one (SPEC section 1). The ablation that shows why LoRDO needs the
  quasi-hyperbolic term. Communication: as :func:`lordo`.

  Args:
    learning_rate: a float or an optax schedule.
    rank: r.
    sync_every: K.
    **options: any other keyword argument of :func:`lordo` except ``omega``.

  Returns:
    An ``optax.GradientTransformationExtraArgs``; its ``update`` needs params.

  Examples:
    >>> import jax.numpy as jnp, optax, lordo_jax
    >>> params = {"w": jnp.ones((16, 8))}
    >>> tx = lordo_jax.lordo_global_projection_only(1e-2, rank=2, sync_every=4)
    >>> state = tx.init(params)
    >>> grads = {"w": jnp.arange(128.0).reshape(16, 8)}
    >>> updates, state = tx.update(grads, state, params)

  References:
    Jovanović et al., `LoRDO: Distributed Low-Rank Optimization with Infrequent
    Communication <https://arxiv.org/abs/2602.04396>`_, ICML 2026 (the global
    projection ablation).
  """
  if "omega" in options:
    raise ValueError(
      f"lordo_global_projection_only: omega={options['omega']!r} is not accepted; "
      "this ablation fixes omega=1. Use lordo_jax.lordo(..., omega=...) instead."
    )
  return aliases.lordo(learning_rate, rank=rank, sync_every=sync_every, omega=1.0, **options)
