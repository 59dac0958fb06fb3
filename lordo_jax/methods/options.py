"""The options the methods share, each checked once: Adam's and the low-rank step's.

Every method takes Adam's ``b1, b2, eps, weight_decay``; :func:`lordo_jax.lordo`,
its local-projection ablation and :func:`lordo_jax.low_rank_ddp` also take the
low-rank step's options (``rank``, ``omega``, ``mu``, ``projection``, ``side``,
``transport``, ``error_feedback_dtype``, ``full_rank_scale``,
``subspace_iterations``, and the variants of ``docs/FIDELITY.md``:
``full_rank_numerator``, ``qh_nu``, ``low_rank_term``, ``full_rank_nu``). A bad
value fails when the method is built, with a message that names the method, the
argument, its value and what is accepted (:mod:`lordo_jax._checks`).
"""

from typing import Any
from typing import NamedTuple

import jax.numpy as jnp

from lordo_jax import _checks as checks
from lordo_jax.local import _low_rank_adam as low_rank
from lordo_jax.local import _quasi_hyperbolic as quasi_hyperbolic

INIT_PROJECTIONS = ("gradient", "random")
# The integer options that fix the program's shapes or its rounds: Python values only,
# never injected by optax.inject_hyperparams (their defaults are None for that reason).
STATIC_OPTIONS = (
  "rank",
  "sync_every",
  "refresh_every",
  "sync_moments_every",
  "first_moment_every",
  "second_moment_every",
  "subspace_iterations",
  "oversample",
  "power_iterations",
  "fragments",
  "seed",
)
ERROR_FEEDBACK_DTYPES = ("float32", "bfloat16")


def check_static(who: str, arguments: dict[str, Any]) -> None:
  """The :data:`STATIC_OPTIONS` among ``arguments`` (``locals()`` on entry) are not
  arrays; one error names every one that is (:func:`lordo_jax._checks.static_args`)."""
  checks.static_args(who, **{k: v for k, v in arguments.items() if k in STATIC_OPTIONS})


def check_adam(who: str, b1, b2, eps, weight_decay) -> None:
  r"""Adam's options: :math:`\beta_1, \beta_2 \in [0, 1)`, :math:`\epsilon, \lambda \ge 0`."""
  checks.in_interval(who, "b1", b1, 0.0, 1.0, closed_high=False)
  checks.in_interval(who, "b2", b2, 0.0, 1.0, closed_high=False)
  checks.non_negative(who, "eps", eps)
  checks.non_negative(who, "weight_decay", weight_decay)


class LowRankStep(NamedTuple):
  """The options of the low-rank Adam step, named as in :func:`lordo_jax.lordo`.

  Each goes to :func:`lordo_jax.scale_by_low_rank_adam` under its own name, but
  ``full_rank_nu``, which goes to the other leaves' Adam
  (:func:`lordo_jax.methods.local_step.local_adamw_path`).
  """

  rank: int  # r, the dimension of each matrix's subspace.
  b1: float  # Adam's first-moment decay.
  b2: float  # Adam's second-moment decay.
  eps: float  # Adam's denominator offset.
  omega: float  # Weight of the low-rank term of the quasi-hyperbolic mix.
  mu: float  # Rescaling of the full-rank term.
  full_rank_scale: str  # "scalar" or "vector".
  projection: str  # "svd", "subspace_iteration", "dct", "randomized_svd"; two-sided "svd" too.
  side: str  # "auto", "left", "right" or "galore_std".
  transport: str  # The moments at a refresh: "rotate", "keep" or "reset".
  error_feedback: bool  # Keep and feed back the projection residual.
  error_feedback_dtype: Any  # "float32" or "bfloat16" (a name once checked).
  subspace_iterations: int | None  # Iterations per refresh with "subspace_iteration".
  two_sided: bool = False  # Project on both sides (TSR-Adam).
  oversample: int | None = None  # Extra sketch columns of "randomized_svd".
  power_iterations: int | None = None  # Power iterations of "randomized_svd".
  full_rank_numerator: str = "gradient"  # The full-rank term's G, or "error_fed" G + E.
  qh_nu: float = 1.0  # QHAdam's nu inside the projection; 1 is Adam.
  low_rank_term: str = "adam"  # L = Q u_hat / D, or "momentum": Q u_hat.
  full_rank_nu: float = 1.0  # QHAdam's nu on the full-rank path; 1 is Adam.


def low_rank_step(who: str, arguments: dict[str, Any]) -> LowRankStep:
  r"""A method's low-rank options, checked, from its arguments (``locals()`` on entry).

  ``rank`` and ``subspace_iterations`` are ints :math:`\ge 1`,
  :math:`\omega, \nu \in [0, 1]` (``qh_nu``, ``full_rank_nu``), :math:`\mu > 0`,
  Adam's options (``weight_decay`` among them) as in :func:`check_adam`; ``side``,
  ``transport``, ``full_rank_scale``, ``low_rank_term`` and ``full_rank_numerator``
  are among their kinds, and ``"error_fed"`` needs ``error_feedback``
  (:func:`lordo_jax.local._low_rank_adam.check_step`); ``projection`` is one of the one-sided
  or (with ``two_sided``) the two-sided methods
  (:func:`lordo_jax.local._low_rank_adam.check_projection`); ``error_feedback_dtype`` becomes a
  name (:func:`error_feedback_dtype_name`). ``who`` names the method in the
  messages; an option the method does not take keeps its default here.
  """
  step = LowRankStep(**{name: arguments[name] for name in LowRankStep._fields if name in arguments})
  checks.positive_int(who, "rank", step.rank)
  checks.positive_int(who, "subspace_iterations", step.subspace_iterations, optional=True)
  checks.in_interval(who, "omega", step.omega, 0.0, 1.0, closed_high=True)
  checks.positive(who, "mu", step.mu)
  checks.in_interval(who, "full_rank_nu", step.full_rank_nu, 0.0, 1.0, closed_high=True)
  check_adam(who, step.b1, step.b2, step.eps, arguments["weight_decay"])
  low_rank.check_step(
    who,
    side=step.side,
    qh_nu=step.qh_nu,
    low_rank_term=step.low_rank_term,
    full_rank_numerator=step.full_rank_numerator,
    error_feedback=step.error_feedback,
  )
  checks.one_of(who, "transport", step.transport, low_rank.TRANSPORTS)
  checks.one_of(who, "full_rank_scale", step.full_rank_scale, quasi_hyperbolic.FULL_RANK_SCALES)
  low_rank.check_projection(
    who,
    step.projection,
    two_sided=step.two_sided,
    side=step.side,
    full_rank_scale=step.full_rank_scale,
  )
  dtype_name = error_feedback_dtype_name(who, step.error_feedback_dtype)
  return step._replace(error_feedback_dtype=dtype_name)


def error_feedback_dtype_name(who: str, dtype: Any) -> str:
  """``"float32"`` or ``"bfloat16"``, from a name or a dtype.

  A name, not a dtype object, goes on, so that ``optax.inject_hyperparams`` leaves
  it alone.
  """
  name = dtype if isinstance(dtype, str) else jnp.dtype(dtype).name
  checks.one_of(who, "error_feedback_dtype", name, ERROR_FEEDBACK_DTYPES)
  return name
