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
from lordo_jax.methods import local_step
from lordo_jax.methods import options as options_lib
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
  """``options`` with the refresh LoRDO runs: ``projection`` (its default when absent),
  except that the default means the SVD with ``two_sided=True`` (two-sided bases have no
  subspace iteration)."""
  projection = options.get("projection", DEFAULT_PROJECTION)
  if projection == DEFAULT_PROJECTION and options.get("two_sided"):
    projection = "svd"
  return dict(options, projection=projection)


@keywords.takes(
  options_lib.basics("sync_every", "axis_name", "outer_optimizer"),
  options_lib.LOW_RANK,
  options_lib.ROUND,
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
  mu: float = 1.0,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
  projection: str = "subspace_iteration",
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
  weight_decay: float = 0.0,
  full_rank_nu: float = 1.0,
  low_rank_labels: Callable | None = None,
  compression: str | None = None,
  fragments: int | Callable | None = None,
  fault_tolerant: bool = False,
  overlap: str | int | None = None,
  merge: str | None = None,
  delay_correction: str | None = None,
  merge_alpha: float = 0.0,
  offload: bool = False,
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

  The bases are refreshed by ``projection``, by default warm-started subspace iteration;
  with ``two_sided=True`` that default means the two-sided SVD, as two-sided bases have
  no subspace iteration (the one default that is not what it says).

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
  return _lordo("lordo", locals())


def _lordo(who: str, arguments: dict[str, Any]) -> optax.GradientTransformationExtraArgs:
  """:func:`lordo` from its keywords, each checked once, in ``who``'s name."""
  keywords_given = with_projection(keywords.given(arguments, options_lib.LOW_RANK))
  step_options, local_options = options_lib.low_rank_step(who, keywords_given)
  sync_moments_every = arguments["sync_moments_every"]
  sync_moments_every = 1 if sync_moments_every is None else sync_moments_every
  checks.positive_int(who, "sync_moments_every", sync_moments_every)
  init_projection = arguments["init_projection"]
  checks.one_of(who, "init_projection", init_projection, tuple(FIRST_BASIS))
  local_first_basis, round_first_basis = FIRST_BASIS[init_projection]
  low_rank, local_optimizer = local_step.low_rank_adamw(
    step_options,
    local_options,
    arguments["learning_rate"],
    who=who,
    init_projection=local_first_basis,
    seed=arguments["seed"],
  )
  return sync_lib.synchronized(
    local_optimizer,
    sync_every=arguments["sync_every"],
    axis_name=arguments["axis_name"],
    outer_optimizer=arguments["outer_optimizer"],
    first_moment_every=sync_moments_every,
    second_moment_every=sync_moments_every,
    low_rank=low_rank,
    init_projection=round_first_basis,
    projection_source="pseudo_gradient",
    moment_decays=(step_options.b1, step_options.b2),
    name=who,
    options=options_lib.round_options(who, arguments),
  )


@keywords.takes(
  options_lib.basics("sync_every", "axis_name", "outer_optimizer"),
  options_lib.LOW_RANK,
  options_lib.ROUND,
)
def lordo_local_projection(
  learning_rate: optax.ScalarOrSchedule,
  *,
  rank: int,
  sync_every: int | Callable,
  axis_name: str | None = None,
  outer_optimizer: optax.GradientTransformation | None = None,
  omega: float = 0.7,
  mu: float = 1.0,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
  projection: str = "subspace_iteration",
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
  weight_decay: float = 0.0,
  full_rank_nu: float = 1.0,
  low_rank_labels: Callable | None = None,
  compression: str | None = None,
  fragments: int | Callable | None = None,
  fault_tolerant: bool = False,
  overlap: str | int | None = None,
  merge: str | None = None,
  delay_correction: str | None = None,
  merge_alpha: float = 0.0,
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
  subspaces and are not averaged (nor are the full-rank path's). It is
  :func:`lordo_jax.synchronize` of the same low-rank local step. Communication:
  ``pq`` elements per ``p x q`` leaf per K steps (MATH.md §7); no first-gradient
  message. With ``two_sided=True``, ``projection``'s default means the
  two-sided SVD, as in :func:`lordo`.

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
  return sync_lib.synchronized(
    local_optimizer,
    sync_every=sync_every,
    axis_name=axis_name,
    outer_optimizer=outer_optimizer,
    first_moment_every=None,
    second_moment_every=None,
    low_rank=low_rank,
    init_projection="gradient",
    projection_source="local_gradient",
    moment_decays=None,
    name=who,
    options=options_lib.round_options(who, arguments),
  )


@keywords.takes(
  options_lib.basics("sync_every", "axis_name", "outer_optimizer"),
  keywords.without(options_lib.LOW_RANK, "omega"),
  options_lib.ROUND,
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
  mu: float = 1.0,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
  projection: str = "subspace_iteration",
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
  weight_decay: float = 0.0,
  full_rank_nu: float = 1.0,
  low_rank_labels: Callable | None = None,
  compression: str | None = None,
  fragments: int | Callable | None = None,
  fault_tolerant: bool = False,
  overlap: str | int | None = None,
  merge: str | None = None,
  delay_correction: str | None = None,
  merge_alpha: float = 0.0,
  offload: bool = False,
) -> optax.GradientTransformationExtraArgs:
  r"""LoRDO ablation without the full-rank term: :func:`lordo` with ``omega = 1``.

  .. math::
    \text{direction} = Q \frac{\hat u}{\sqrt{\hat v} + \epsilon}

  Every local update then lies in span(Q), so the averaged pseudo-gradient does too,
  and its top-r subspace, the next Q, is span(Q) again: the subspace never moves
  from the first one (MATH.md §1). The ablation that shows why LoRDO needs the
  quasi-hyperbolic term. Communication, and ``projection`` with ``two_sided=True``: as
  :func:`lordo`.

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
  return _lordo("lordo_global_projection_only", dict(locals(), omega=1.0))
