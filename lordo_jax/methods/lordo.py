r"""LoRDO and its two ablations: low-rank Adam with infrequent synchronisation.

* :func:`lordo`: every K steps the workers average their pseudo-gradient and their
  ``r x q`` moments, and every basis is recomputed from the averaged pseudo-gradient
  (MATH.md §3 to §5); a full-rank quasi-hyperbolic term keeps the subspace
  moving.
* :func:`lordo_local_projection`: each worker's basis from its own gradient; the
  moments stay local.
* :func:`lordo_global_projection_only`: :func:`lordo` with ``omega = 1``, no
  full-rank term; the subspace never moves.

Each is :func:`lordo_jax.synchronize` of the low-rank local step; per round and
``p x q`` matrix they send ``pq + 2rq`` elements, the local ablation ``pq`` (MATH.md §7).
"""

from typing import Any

import optax

from lordo_jax import _checks as checks
from lordo_jax.methods import local_step
from lordo_jax.methods import options
from lordo_jax.round import _synchronize as sync


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
  sync_moments_every: int | None = None,
  full_rank_scale: str = "scalar",
  full_rank_numerator: str = "gradient",
  qh_nu: float = 1.0,
  low_rank_term: str = "adam",
  full_rank_nu: float = 1.0,
  low_rank_labels: Any = None,
  subspace_iterations: int | None = None,
  seed: int | None = None,
  fault_tolerant: bool = False,
  offload: bool = False,
  compression: str | None = None,
  fragments: Any = None,
  two_sided: bool = False,
  oversample: int | None = None,
  power_iterations: int | None = None,
) -> optax.GradientTransformationExtraArgs:
  r"""LoRDO: low-rank Adam with infrequent synchronisation and a full-rank QH term.

  Each worker takes local steps (MATH.md §3); every ``sync_every`` steps the
  workers average their pseudo-gradient, take the outer step, average their
  ``r x q`` moments, and recompute every matrix's basis from the averaged
  pseudo-gradient, which all workers hold, so the subspace is shared for free
  (MATH.md §4 and §5). For each low-rank matrix:

  .. math::
    \text{direction} = (1 - \omega) \frac{G}{\mu s}
      + \omega\, Q \frac{\hat u}{\sqrt{\hat v} + \epsilon}, \qquad
    \text{update} = -\eta\, (\text{direction} + \lambda W)

  Leaves that are not low-rank matrices (biases, norms, small matrices, or those
  ``low_rank_labels`` excludes) take local AdamW with the same synchronisation; a
  rank that leaves no matrix low-rank is refused at ``init``.

  It must be the last transformation that changes the update: at a sync its update
  lands every worker on the synchronised parameters, and a transformation chained
  after it (``optax.scale``, a clip) would make the workers part. Chain such
  transformations before it, and check with :func:`lordo_jax.worker_disagreement`.
  With a worker axis, do not wrap it in ``optax.apply_if_finite`` (an error): use
  ``fault_tolerant=True``.

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
    projection: ``"svd"``, ``"subspace_iteration"``, ``"dct"`` or
      ``"randomized_svd"``; two-sided: ``"svd"`` or ``"randomized_svd"``.
    side: ``"auto"``, ``"left"``, ``"right"`` or ``"galore_std"`` (moments on the
      larger dimension, as the LoRDO authors' GaLore).
    transport: ``"rotate"``, ``"keep"`` or ``"reset"``.
    error_feedback: keep and feed back the projection residual (off by default,
      MATH.md §3 says why).
    error_feedback_dtype: ``"float32"`` or ``"bfloat16"`` (half the memory). A name,
      not a dtype object, so that ``optax.inject_hyperparams`` leaves it alone.
    init_projection: ``"gradient"`` (from the averaged first gradient, one counted
      message) or ``"random"`` (from ``seed``, no message).
    outer_optimizer: applied to the averaged pseudo-gradient; ``None`` is plain
      averaging.
    sync_moments_every: average the moments every this many syncs (``None``: 1).
    full_rank_scale: ``"scalar"`` or ``"vector"``.
    full_rank_numerator: ``"gradient"`` (G) or ``"error_fed"`` (G + E, the LoRDO
      authors' full-rank term; needs ``error_feedback=True``).
    qh_nu: QHAdam inside the projection, ``L = Q ((1 - nu) c + nu u_hat) / D``;
      1 is Adam.
    low_rank_term: ``"adam"`` (``Q u_hat / D``) or ``"momentum"`` (``Q u_hat``, the
      update the LoRDO authors' code applies; for replication only).
    full_rank_nu: QHAdam on the leaves off the low-rank path,
      ``((1 - nu) g + nu m_hat) / (sqrt(v_hat) + eps)``; 1 is Adam.
    low_rank_labels: which leaves are low-rank (see :mod:`lordo_jax.local._routing`);
      ``None``: every 2-D leaf with ``min(p, q) > rank``.
    subspace_iterations: iterations per refresh with ``"subspace_iteration"``
      (``None``: 2).
    seed: PRNG seed of ``init_projection="random"`` (``None``: 0).
    fault_tolerant: skip non-finite local steps and average only over the workers
      present at a sync (``update(..., worker_present=False)`` marks one absent);
      see :func:`lordo_jax.synchronize`.
    compression: ``None``, ``"bfloat16"`` or ``"int8"``: send every message of the
      round compressed, the pseudo-gradient with error feedback (with ``"int8"``
      the moments go in bfloat16; :func:`lordo_jax.synchronize`).
    fragments: ``None`` (default): no streaming; F > 1 streams the round: the
      parameters sync in F fragments at staggered steps, so the largest message is
      about 1/F of the model.
    two_sided: project on both sides (TSR-Adam, :mod:`lordo_jax.local._two_sided_projection`): the
      moments are ``r x r`` cores, so a sync averages ``r x r`` moments instead of
      ``r x q``; ``projection`` is then ``"svd"`` or ``"randomized_svd"``.
    oversample, power_iterations: of the ``randomized_svd`` refresh (``None``: 8
      extra sketch columns, 1 power iteration).
    offload: keep the anchor and the outer optimizer's state in host memory
      (``pinned_host``) between syncs, on the device only inside the sync
      (:mod:`lordo_jax.round._offload`); results bit-identical to ``offload=False``.

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
  options.check_static(who, locals())
  step = options.low_rank_step(who, locals())
  sync_moments_every = 1 if sync_moments_every is None else sync_moments_every
  checks.positive_int(who, "sync_moments_every", sync_moments_every)
  checks.one_of(who, "init_projection", init_projection, options.INIT_PROJECTIONS)
  low_rank, local = local_step.low_rank_adamw(
    step,
    learning_rate,
    who=who,
    full_rank_nu=full_rank_nu,
    weight_decay=weight_decay,
    low_rank_labels=low_rank_labels,
    init_projection="random" if init_projection == "random" else "external",
    seed=seed,
  )
  return sync.synchronize(
    local,
    sync_every=sync_every,
    axis_name=axis_name,
    outer_optimizer=outer_optimizer,
    first_moment_every=sync_moments_every,
    second_moment_every=sync_moments_every,
    low_rank=low_rank,
    init_projection="gradient" if init_projection == "gradient" else None,
    fault_tolerant=fault_tolerant,
    offload=offload,
    compression=compression,
    fragments=fragments,
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
  subspace_iterations: int | None = None,
  compression: str | None = None,
  fragments: Any = None,
  fault_tolerant: bool = False,
  offload: bool = False,
) -> optax.GradientTransformationExtraArgs:
  r"""LoRDO ablation: each worker projects with its own gradient; moments stay local.

  The local step of :func:`lordo` (MATH.md §3) and its pseudo-gradient average
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
    sync_every: K, or a function of the step (:mod:`lordo_jax.round._periods`).
    axis_name: the worker axis; ``None`` for one worker.
    omega, mu, b1, b2, eps, weight_decay, projection, side, transport,
      error_feedback, error_feedback_dtype, outer_optimizer, full_rank_scale,
      low_rank_labels, subspace_iterations: as in :func:`lordo`.
    compression, fragments, fault_tolerant, offload: the round's compressed
      messages, streaming, fault tolerance and host offload, as in :func:`lordo_jax.lordo`.

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
  options.check_static(who, locals())
  step = options.low_rank_step(who, locals())
  low_rank, local = local_step.low_rank_adamw(
    step,
    learning_rate,
    who=who,
    weight_decay=weight_decay,
    low_rank_labels=low_rank_labels,
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
    offload=offload,
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
  from the first one (MATH.md §1). The ablation that shows why LoRDO needs the
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
  return lordo(learning_rate, rank=rank, sync_every=sync_every, omega=1.0, **options)
