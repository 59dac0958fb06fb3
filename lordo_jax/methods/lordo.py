"""LoRDO and its two ablations: low-rank Adam with infrequent synchronisation.

:func:`lordo` (MATH.md §3 to §5), :func:`lordo_local_projection` (each worker's
basis from its own gradient) and :func:`lordo_global_projection_only` (no full-rank
term), each :func:`lordo_jax.synchronize` of the low-rank local step.
"""

from collections.abc import Callable
from typing import Any

import optax

from lordo_jax import _checks as checks
from lordo_jax import _keywords as keywords
from lordo_jax.local import _low_rank_options as low_rank_options
from lordo_jax.methods import local_step
from lordo_jax.methods import options as options_lib
from lordo_jax.round import _round_options as round_options_lib
from lordo_jax.round import _synchronize as sync_lib

# Where LoRDO's first basis comes from, as its two pieces name it: (the local step's,
# the round's). "gradient": the round sets it from the averaged first gradient, so the
# local step takes it from outside ("external"); "random": the local step draws it from
# its seed, and the round sends nothing first (None).
FIRST_BASIS = {"gradient": ("external", "gradient"), "random": ("random", None)}
# LoRDO's basis refresh: warm-started subspace iteration, batched over each shape's
# matrices, trains as the SVD does at a fraction of its cost (docs/FIDELITY.md).
DEFAULT_PROJECTION = "subspace_iteration"


def with_projection(options: dict[str, Any]) -> dict[str, Any]:
  """``options`` with LoRDO's refresh for ``projection=None``: subspace iteration, or
  the SVD with ``two_sided=True`` (two-sided bases have no subspace iteration)."""
  if options.get("projection") is not None:
    return options
  return dict(options, projection="svd" if options.get("two_sided") else DEFAULT_PROJECTION)


@keywords.takes(
  options_lib.basics("sync_every", "axis_name", "outer_optimizer"),
  options_lib.LOW_RANK,
  options_lib.ROUND,
  overrides=("omega", "projection"),
)
def lordo(
  learning_rate: optax.ScalarOrSchedule,
  *,
  rank: int,
  sync_every: int | Callable,
  axis_name: str | None = None,
  init_projection: str = "gradient",
  outer_optimizer: optax.GradientTransformation | None = None,
  sync_moments_every: int | None = None,
  seed: int | None = None,
  omega: float = 0.7,
  mu: float = low_rank_options.LowRankOptions.full_rank_rescale,
  b1: float = low_rank_options.LowRankOptions.b1,
  b2: float = low_rank_options.LowRankOptions.b2,
  eps: float = low_rank_options.LowRankOptions.eps,
  projection: str | None = None,
  side: str = low_rank_options.LowRankOptions.side,
  transport: str = low_rank_options.LowRankOptions.transport,
  error_feedback: bool = low_rank_options.LowRankOptions.error_feedback,
  error_feedback_dtype: str = low_rank_options.LowRankOptions.error_feedback_dtype,
  full_rank_scale: str = low_rank_options.LowRankOptions.full_rank_scale,
  full_rank_numerator: str = low_rank_options.LowRankOptions.full_rank_numerator,
  qh_nu: float = low_rank_options.LowRankOptions.qh_nu,
  low_rank_term: str = low_rank_options.LowRankOptions.low_rank_term,
  subspace_iterations: int | None = low_rank_options.LowRankOptions.subspace_iterations,
  two_sided: bool = low_rank_options.LowRankOptions.two_sided,
  oversample: int | None = low_rank_options.LowRankOptions.oversample,
  power_iterations: int | None = low_rank_options.LowRankOptions.power_iterations,
  weight_decay: float = options_lib.LocalOptions.weight_decay,
  full_rank_nu: float = options_lib.LocalOptions.full_rank_nu,
  low_rank_labels: Callable | None = options_lib.LocalOptions.low_rank_labels,
  compression: str | None = round_options_lib.RoundOptions.compression,
  fragments: int | Callable | None = round_options_lib.RoundOptions.fragments,
  fault_tolerant: bool = round_options_lib.RoundOptions.fault_tolerant,
  overlap: str | int | None = round_options_lib.RoundOptions.overlap,
  merge: str | None = round_options_lib.RoundOptions.merge,
  merge_alpha: float = round_options_lib.RoundOptions.merge_alpha,
  offload: bool = round_options_lib.RoundOptions.offload,
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

  The full-rank quasi-hyperbolic term keeps the subspace moving (without it, see
  :func:`lordo_global_projection_only`). This is :func:`lordo_jax.synchronize` of the
  low-rank local step (low-rank AdamW with the quasi-hyperbolic full-rank term, MATH.md §3).

  Leaves that are not low-rank matrices (biases, norms, small matrices, or those
  ``low_rank_labels`` excludes) take local AdamW with the same synchronisation.
  Parameters with no 2-D leaf train as :func:`lordo_jax.local_adam` would, with a
  warning; 2-D leaves that all have ``min(p, q) <= rank`` are refused at ``init``.

  It must be the last transformation that changes the update: at a sync its update
  lands every worker on the synchronised parameters, and a transformation chained
  after it (``optax.scale``, a clip) would make the workers part. Chain such
  transformations before it, and check with :func:`lordo_jax.worker_disagreement`.
  With a worker axis, do not wrap it in ``optax.apply_if_finite`` (an error): use
  ``fault_tolerant=True``.

  Communication per round of K steps and per ``p x q`` matrix: ``pq`` (the
  pseudo-gradient) plus ``2rq`` (the moments) elements, against ``K pq`` for DDP:
  ``(pq + 2rq) / K`` per step (MATH.md §7). Read it with
  :func:`lordo_jax.communicated_bytes`.

  Args:
    {options}
    init_projection: ``"gradient"`` (from the averaged first gradient, one counted
      message) or ``"random"`` (from ``seed``, no message).
    sync_moments_every: average the moments every this many syncs (``None``: 1).
    seed: PRNG seed of ``init_projection="random"`` (``None``: 0).

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
  arguments = dict(locals())
  keywords_given = with_projection(keywords.given(arguments, options_lib.LOW_RANK))
  step_options, local_options = options_lib.low_rank_step(who, keywords_given)
  sync_moments_every = 1 if sync_moments_every is None else sync_moments_every
  checks.positive_int(who, "sync_moments_every", sync_moments_every)
  checks.one_of(who, "init_projection", init_projection, tuple(FIRST_BASIS))
  local_first_basis, round_first_basis = FIRST_BASIS[init_projection]
  low_rank, local_optimizer = local_step.low_rank_adamw(
    step_options,
    local_options,
    learning_rate,
    who=who,
    init_projection=local_first_basis,
    seed=seed,
  )
  return sync_lib.synchronize(
    local_optimizer,
    sync_every=sync_every,
    axis_name=axis_name,
    outer_optimizer=outer_optimizer,
    first_moment_every=sync_moments_every,
    second_moment_every=sync_moments_every,
    low_rank=low_rank,
    init_projection=round_first_basis,
    moment_decays=(step_options.b1, step_options.b2),
    name=who,
    **keywords.given(arguments, options_lib.ROUND),
  )


@keywords.takes(
  options_lib.basics("sync_every", "axis_name", "outer_optimizer"),
  options_lib.LOW_RANK,
  options_lib.ROUND,
  overrides=("omega", "projection"),
)
def lordo_local_projection(
  learning_rate: optax.ScalarOrSchedule,
  *,
  rank: int,
  sync_every: int | Callable,
  axis_name: str | None = None,
  outer_optimizer: optax.GradientTransformation | None = None,
  omega: float = 0.7,
  mu: float = low_rank_options.LowRankOptions.full_rank_rescale,
  b1: float = low_rank_options.LowRankOptions.b1,
  b2: float = low_rank_options.LowRankOptions.b2,
  eps: float = low_rank_options.LowRankOptions.eps,
  projection: str | None = None,
  side: str = low_rank_options.LowRankOptions.side,
  transport: str = low_rank_options.LowRankOptions.transport,
  error_feedback: bool = low_rank_options.LowRankOptions.error_feedback,
  error_feedback_dtype: str = low_rank_options.LowRankOptions.error_feedback_dtype,
  full_rank_scale: str = low_rank_options.LowRankOptions.full_rank_scale,
  full_rank_numerator: str = low_rank_options.LowRankOptions.full_rank_numerator,
  qh_nu: float = low_rank_options.LowRankOptions.qh_nu,
  low_rank_term: str = low_rank_options.LowRankOptions.low_rank_term,
  subspace_iterations: int | None = low_rank_options.LowRankOptions.subspace_iterations,
  two_sided: bool = low_rank_options.LowRankOptions.two_sided,
  oversample: int | None = low_rank_options.LowRankOptions.oversample,
  power_iterations: int | None = low_rank_options.LowRankOptions.power_iterations,
  weight_decay: float = options_lib.LocalOptions.weight_decay,
  full_rank_nu: float = options_lib.LocalOptions.full_rank_nu,
  low_rank_labels: Callable | None = options_lib.LocalOptions.low_rank_labels,
  compression: str | None = round_options_lib.RoundOptions.compression,
  fragments: int | Callable | None = round_options_lib.RoundOptions.fragments,
  fault_tolerant: bool = round_options_lib.RoundOptions.fault_tolerant,
  overlap: str | int | None = round_options_lib.RoundOptions.overlap,
  merge: str | None = round_options_lib.RoundOptions.merge,
  merge_alpha: float = round_options_lib.RoundOptions.merge_alpha,
  offload: bool = round_options_lib.RoundOptions.offload,
) -> optax.GradientTransformationExtraArgs:
  r"""LoRDO ablation: each worker projects with its own gradient; moments stay local.

  The local step of :func:`lordo` (MATH.md §3) and its pseudo-gradient average
  every K steps, but every basis comes from the worker's own current gradient
  :math:`G_m` (at step 1 and at every sync), not from the averaged pseudo-gradient:

  .. math::
    Q_m = \mathrm{ComputeProjection}(G_m), \qquad
    \theta = \mathrm{pmean}_m(\theta_m) \ \text{every K steps}.

  The bases then differ between workers, so the low-rank moments live in different
  subspaces and are not averaged (nor are the full-rank path's). It is
  :func:`lordo_jax.synchronize` of the same low-rank local step. Communication:
  ``pq`` elements per ``p x q`` leaf per K steps (MATH.md §7); no first-gradient
  message.

  Args:
    {options}

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
  arguments = dict(locals())
  keywords_given = with_projection(keywords.given(arguments, options_lib.LOW_RANK))
  step_options, local_options = options_lib.low_rank_step(who, keywords_given)
  low_rank, local_optimizer = local_step.low_rank_adamw(
    step_options, local_options, learning_rate, who=who, init_projection="external"
  )
  return sync_lib.synchronize(
    local_optimizer,
    sync_every=sync_every,
    axis_name=axis_name,
    outer_optimizer=outer_optimizer,
    first_moment_every=None,
    second_moment_every=None,
    low_rank=low_rank,
    init_projection="gradient",
    projection_source="local_gradient",
    name=who,
    **keywords.given(arguments, options_lib.ROUND),
  )


@keywords.takes(
  options_lib.basics("sync_every", "axis_name", "outer_optimizer"),
  keywords.without(options_lib.LOW_RANK, "omega"),
  options_lib.ROUND,
  overrides=("projection",),
)
def lordo_global_projection_only(
  learning_rate: optax.ScalarOrSchedule,
  *,
  rank: int,
  sync_every: int | Callable,
  axis_name: str | None = None,
  init_projection: str = "gradient",
  outer_optimizer: optax.GradientTransformation | None = None,
  sync_moments_every: int | None = None,
  seed: int | None = None,
  mu: float = low_rank_options.LowRankOptions.full_rank_rescale,
  b1: float = low_rank_options.LowRankOptions.b1,
  b2: float = low_rank_options.LowRankOptions.b2,
  eps: float = low_rank_options.LowRankOptions.eps,
  projection: str | None = None,
  side: str = low_rank_options.LowRankOptions.side,
  transport: str = low_rank_options.LowRankOptions.transport,
  error_feedback: bool = low_rank_options.LowRankOptions.error_feedback,
  error_feedback_dtype: str = low_rank_options.LowRankOptions.error_feedback_dtype,
  full_rank_scale: str = low_rank_options.LowRankOptions.full_rank_scale,
  full_rank_numerator: str = low_rank_options.LowRankOptions.full_rank_numerator,
  qh_nu: float = low_rank_options.LowRankOptions.qh_nu,
  low_rank_term: str = low_rank_options.LowRankOptions.low_rank_term,
  subspace_iterations: int | None = low_rank_options.LowRankOptions.subspace_iterations,
  two_sided: bool = low_rank_options.LowRankOptions.two_sided,
  oversample: int | None = low_rank_options.LowRankOptions.oversample,
  power_iterations: int | None = low_rank_options.LowRankOptions.power_iterations,
  weight_decay: float = options_lib.LocalOptions.weight_decay,
  full_rank_nu: float = options_lib.LocalOptions.full_rank_nu,
  low_rank_labels: Callable | None = options_lib.LocalOptions.low_rank_labels,
  compression: str | None = round_options_lib.RoundOptions.compression,
  fragments: int | Callable | None = round_options_lib.RoundOptions.fragments,
  fault_tolerant: bool = round_options_lib.RoundOptions.fault_tolerant,
  overlap: str | int | None = round_options_lib.RoundOptions.overlap,
  merge: str | None = round_options_lib.RoundOptions.merge,
  merge_alpha: float = round_options_lib.RoundOptions.merge_alpha,
  offload: bool = round_options_lib.RoundOptions.offload,
) -> optax.GradientTransformationExtraArgs:
  r"""LoRDO ablation without the full-rank term: :func:`lordo` with ``omega = 1``.

  .. math::
    \text{direction} = Q \frac{\hat u}{\sqrt{\hat v} + \epsilon}

  Every local update then lies in span(Q), so the averaged pseudo-gradient does too,
  and its top-r subspace, the next Q, is span(Q) again: the subspace never moves
  from the first one (MATH.md §1). The ablation that shows why LoRDO needs the
  quasi-hyperbolic term. Communication: as :func:`lordo`.

  Args:
    {options}
    init_projection: as :func:`lordo`'s.
    sync_moments_every: as :func:`lordo`'s.
    seed: as :func:`lordo`'s.

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
  return lordo(**locals(), omega=1.0)
