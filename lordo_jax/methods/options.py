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

import jax.numpy as jnp

from lordo_jax import _checks as checks
from lordo_jax.local import _low_rank_adam as low_rank

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
# The methods' keyword of a LowRankOptions field, where it is not the field's name.
PUBLIC_KEYWORDS = {"full_rank_rescale": "mu"}


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


def low_rank_step(who: str, arguments: dict[str, Any]) -> low_rank.LowRankOptions:
  """A method's :class:`~lordo_jax.local.LowRankOptions`, checked, from its arguments.

  ``arguments`` are the method's (``locals()`` on entry), named as the method's
  keywords (``mu`` for ``full_rank_rescale``); an option the method does not take keeps
  its default. The options are checked by the primitive's own check
  (:func:`lordo_jax.local._low_rank_adam.check_options`), in ``who``'s name; here only
  what the method adds: ``full_rank_nu`` in [0, 1] and ``weight_decay`` >= 0.
  ``error_feedback_dtype`` becomes a name (:func:`error_feedback_dtype_name`).
  """
  keyword = lambda field: PUBLIC_KEYWORDS.get(field, field)  # noqa: E731
  fields = low_rank.LowRankOptions._fields
  step = low_rank.LowRankOptions(
    **{f: arguments[keyword(f)] for f in fields if keyword(f) in arguments}
  )
  low_rank.check_options(who, step)
  checks.in_interval(
    who, "full_rank_nu", arguments.get("full_rank_nu", 1.0), 0.0, 1.0, closed_high=True
  )
  checks.non_negative(who, "weight_decay", arguments["weight_decay"])
  return step._replace(
    error_feedback_dtype=error_feedback_dtype_name(who, step.error_feedback_dtype)
  )


def error_feedback_dtype_name(who: str, dtype: Any) -> str:
  """``"float32"`` or ``"bfloat16"``, from a name or a dtype.

  A name, not a dtype object, goes on, so that ``optax.inject_hyperparams`` leaves
  it alone.
  """
  name = dtype if isinstance(dtype, str) else jnp.dtype(dtype).name
  checks.one_of(who, "error_feedback_dtype", name, ERROR_FEEDBACK_DTYPES)
  return name
