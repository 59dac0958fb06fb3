"""Complete optimizers built from the library's pieces: LoRDO and its baselines."""

from typing import Any

import jax.numpy as jnp
import optax

from lordo_jax import checks
from lordo_jax import low_rank as low_rank_lib
from lordo_jax import precision
from lordo_jax import quasi_hyperbolic
from lordo_jax import routing
from lordo_jax import sync

INIT_PROJECTIONS = ("gradient", "random")
ERROR_FEEDBACK_DTYPES = ("float32", "bfloat16")


def _check_adam(who: str, b1, b2, eps, weight_decay) -> None:
  checks.in_interval(who, "b1", b1, 0.0, 1.0, closed_high=False)
  checks.in_interval(who, "b2", b2, 0.0, 1.0, closed_high=False)
  checks.non_negative(who, "eps", eps)
  checks.non_negative(who, "weight_decay", weight_decay)


def local_adamw_path(
  low_rank: Any,
  *,
  learning_rate: optax.ScalarOrSchedule,
  b1: float,
  b2: float,
  eps: float,
  weight_decay: float,
  rank: int,
  low_rank_labels: Any,
) -> optax.GradientTransformation:
  """The local step: low-rank Adam on matrices, Adam elsewhere, then AdamW's tail.

  Every moment is float32, whatever the parameter dtype.

  ``update = -lr * (direction + weight_decay * W)``, decoupled as in ``optax.adamw``.
  """
  return optax.chain(
    optax.partition(
      {
        routing.LOW_RANK: low_rank,
        routing.FULL_RANK: precision.in_float32(optax.scale_by_adam(b1=b1, b2=b2, eps=eps)),
      },
      routing.partition_labels(low_rank_labels, rank),
    ),
    optax.add_decayed_weights(weight_decay),
    optax.scale_by_learning_rate(learning_rate),
  )


def lordo(
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
  init_projection: str = "gradient",
  outer_optimizer: optax.GradientTransformation | None = None,
  sync_moments_every: int = 1,
  full_rank_scale: str = "scalar",
  low_rank_labels: Any = None,
  subspace_iterations: int = 2,
  seed: int = 0,
  fault_tolerant: bool = False,
  compression: str | None = None,
  fragments: Any = None,
  two_sided: bool = False,
  oversample: int | None = None,
  power_iterations: int | None = None,
) -> optax.GradientTransformationExtraArgs:
  r"""LoRDO: low-rank Adam with infrequent synchronisation and a full-rank QH term.

  Each worker takes local steps (SPEC section 3); every ``sync_every`` steps the
  workers average their pseudo-gradient, take the outer step, average their
  ``r x q`` moments, and recompute every matrix's basis from the averaged
  pseudo-gradient, which all workers hold, so the subspace is shared for free
  (SPEC sections 4 and 5). For each low-rank matrix:

  .. math::
    \text{direction} = (1 - \omega) \frac{G}{\mu s}
      + \omega\, Q \frac{\hat u}{\sqrt{\hat v} + \epsilon}, \qquad
    \text{update} = -\eta\, (\text{direction} + \lambda W)

  Leaves that are not low-rank matrices (biases, norms, small matrices, or those
  ``low_rank_labels`` excludes) take local AdamW with the same synchronisation.

  Communication per round of K steps and per ``p x q`` matrix: ``pq`` (the
  pseudo-gradient) plus ``2rq`` (the moments) elements, against ``K pq`` for DDP.
  Read it with :func:`lordo_jax.communicated_bytes`.

  Args:
    learning_rate: a float or an optax schedule.
    rank: r, the dimension of each matrix's subspace.
    sync_every: K, local steps per round; or a function of the step giving each
      round's length, such as :func:`lordo_jax.quadratic_sync_rule`.
    axis_name: the worker axis of ``jax.shard_map`` or ``jax.pmap``; ``None`` for
      one worker.
    omega: weight of the low-rank term; 1 switches the full-rank term off.
    mu: rescaling of the full-rank term.
    b1, b2, eps: Adam's parameters.
    weight_decay: decoupled weight decay, as in ``optax.adamw``.
    projection: ``"svd"``, ``"subspace_iteration"`` or ``"dct"``; two-sided:
      ``"svd"`` or ``"randomized_svd"``.
    side: ``"auto"``, ``"left"`` or ``"right"``.
    transport: ``"rotate"``, ``"keep"`` or ``"reset"``.
    error_feedback: keep and feed back the projection residual (off by default,
      SPEC section 3 says why).
    error_feedback_dtype: ``"float32"`` or ``"bfloat16"`` (half the memory). A name,
      not a dtype object, so that ``optax.inject_hyperparams`` leaves it alone.
    init_projection: ``"gradient"`` (from the averaged first gradient, one counted
      message) or ``"random"`` (from ``seed``, no message).
    outer_optimizer: applied to the averaged pseudo-gradient; ``None`` is plain
      averaging.
    sync_moments_every: average the moments every this many syncs.
    full_rank_scale: ``"scalar"`` or ``"vector"``.
    low_rank_labels: which leaves are low-rank (see :mod:`lordo_jax.routing`);
      ``None``: every 2-D leaf with ``min(p, q) > rank``.
    subspace_iterations: iterations per refresh with ``"subspace_iteration"``.
    seed: PRNG seed of ``init_projection="random"``.
    fault_tolerant: skip non-finite local steps and average only over the workers
      present at a sync (``update(..., worker_present=False)`` marks one absent);
      see :func:`lordo_jax.synchronize`.
    compression: ``None``, ``"bfloat16"`` or ``"int8"``: send every message of the
      round compressed, the pseudo-gradient with error feedback (with ``"int8"``
      the moments go in bfloat16; :func:`lordo_jax.synchronize`).
    fragments: ``None`` (default): no streaming; F > 1 streams the round: the
      parameters sync in F fragments at staggered steps, so the largest message is
      about 1/F of the model.
    two_sided: project on both sides (TSR-Adam, :mod:`lordo_jax.two_sided`): the
      moments are ``r x r`` cores, so a sync averages ``r x r`` moments instead of
      ``r x q``; ``projection`` is then ``"svd"`` or ``"randomized_svd"``.
    oversample, power_iterations: of the ``randomized_svd`` refresh (``None``: 8
      extra sketch columns, 1 power iteration).

  Returns:
    An ``optax.GradientTransformationExtraArgs``. Its ``update`` needs params.

  Examples:
    >>> import jax, jax.numpy as jnp, optax, lordo_jax
    >>> params = {"w": jnp.ones((16, 8)), "b": jnp.zeros(8)}
    >>> tx = lordo_jax.lordo(1e-2, rank=2, sync_every=4)
    >>> state = tx.init(params)
    >>> grads = jax.tree.map(jnp.ones_like, params)
    >>> updates, state = tx.update(grads, state, params)
    >>> params = optax.apply_updates(params, updates)

  References:
    Jovanović et al., `LoRDO: Distributed Low-Rank Optimization with Infrequent
    Communication <https://arxiv.org/abs/2602.04396>`_, ICML 2026.
  """
  who = "lordo"
  checks.positive_int(who, "rank", rank)
  checks.positive_int(who, "sync_moments_every", sync_moments_every)
  checks.positive_int(who, "subspace_iterations", subspace_iterations)
  checks.in_interval(who, "omega", omega, 0.0, 1.0, closed_high=True)
  checks.positive(who, "mu", mu)
  _check_adam(who, b1, b2, eps, weight_decay)
  checks.one_of(who, "side", side, low_rank_lib.SIDES)
  checks.one_of(who, "transport", transport, low_rank_lib.TRANSPORTS)
  checks.one_of(who, "init_projection", init_projection, INIT_PROJECTIONS)
  checks.one_of(who, "full_rank_scale", full_rank_scale, quasi_hyperbolic.FULL_RANK_SCALES)
  low_rank_lib.check_projection(
    who, projection, two_sided=two_sided, side=side, full_rank_scale=full_rank_scale
  )
  if not isinstance(error_feedback_dtype, str):
    error_feedback_dtype = jnp.dtype(error_feedback_dtype).name
  checks.one_of(who, "error_feedback_dtype", error_feedback_dtype, ERROR_FEEDBACK_DTYPES)

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
    init_projection="random" if init_projection == "random" else "external",
    seed=seed,
    matrix_axes=low_rank_labels,
    two_sided=two_sided,
    oversample=oversample,
    power_iterations=power_iterations,
  )
  local = local_adamw_path(
    low_rank,
    learning_rate=learning_rate,
    b1=b1,
    b2=b2,
    eps=eps,
    weight_decay=weight_decay,
    rank=rank,
    low_rank_labels=low_rank_labels,
  )
  return sync.synchronize(
    local,
    sync_every=sync_every,
    axis_name=axis_name,
    outer_optimizer=outer_optimizer,
    first_moment_every=sync_moments_every,
    second_moment_every=sync_moments_every,
    low_rank=low_rank,
    init_projection=init_projection,
    fault_tolerant=fault_tolerant,
    compression=compression,
    fragments=fragments,
    name=who,
  )
