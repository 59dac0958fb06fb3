r"""The options of the low-rank Adam step (MATH.md §3), each written and checked once.

:class:`LowRankOptions` holds each option's type, default and Args text (the public
factories declare each with the same default, or with their own where the field records
it, :mod:`lordo_jax._keywords`); :func:`check_options` checks them all, in the name of
the method that was given them.
"""

import dataclasses
from typing import Any

import jax.numpy as jnp

from lordo_jax import _checks as checks
from lordo_jax import _keywords as keywords
from lordo_jax.local import bases as bases_lib
from lordo_jax.local._quasi_hyperbolic import FULL_RANK_SCALES

TRANSPORTS = ("rotate", "keep", "reset")
SIDES = ("auto", "left", "right", "galore_std")
FULL_RANK_NUMERATORS = ("gradient", "error_fed")
LOW_RANK_TERMS = ("adam", "momentum")
ERROR_FEEDBACK_DTYPES = ("float32", "bfloat16")


def check_projection(
  who: str, projection: str, *, two_sided: bool, side: str, full_rank_scale: str
) -> None:
  """The projection options, checked together: one-sided methods, or two-sided ones."""
  if not two_sided:
    checks.one_of(who, "projection", projection, tuple(bases_lib.ONE_SIDED))
    return
  checks.one_of(who, "projection", projection, tuple(bases_lib.TWO_SIDED))
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


def check_step(
  who: str,
  *,
  side: str,
  qh_nu,
  low_rank_term: str,
  full_rank_numerator: str,
  error_feedback: bool,
) -> None:
  """The step's options: ``side``, ``qh_nu`` in [0, 1], the terms' kinds; an error-fed
  full-rank numerator needs error feedback."""
  checks.one_of(who, "side", side, SIDES)
  checks.in_interval(who, "qh_nu", qh_nu, 0.0, 1.0, closed_high=True)
  checks.one_of(who, "low_rank_term", low_rank_term, LOW_RANK_TERMS)
  checks.one_of(who, "full_rank_numerator", full_rank_numerator, FULL_RANK_NUMERATORS)
  if full_rank_numerator == "error_fed" and not error_feedback:
    raise ValueError(
      f"{who}: full_rank_numerator='error_fed' is not accepted with "
      f"error_feedback={error_feedback!r}; its numerator G + E needs the error buffer E. "
      "Set error_feedback=True, or use full_rank_numerator='gradient'."
    )


def check_options(who: str, o: "LowRankOptions") -> None:
  r"""Every option of the low-rank step, checked once; ``who`` names the caller.

  ``rank`` an int :math:`\ge 1`; :math:`\omega, \nu_{qh} \in [0, 1]`, :math:`\mu > 0`,
  :math:`\beta_1, \beta_2 \in [0, 1)`, :math:`\epsilon \ge 0`; every string option
  among its kinds (:func:`check_step`, :func:`check_projection`); the randomized
  sketch's sizes :math:`\ge 0`. Arrays (from ``optax.inject_hyperparams``) are
  checked when known.
  """
  checks.positive_int(who, "rank", o.rank)
  checks.positive_int(who, "subspace_iterations", o.subspace_iterations, optional=True)
  checks.in_interval(who, "omega", o.omega, 0.0, 1.0, closed_high=True)
  checks.positive(who, "mu", o.full_rank_rescale)
  checks.in_interval(who, "b1", o.b1, 0.0, 1.0, closed_high=False)
  checks.in_interval(who, "b2", o.b2, 0.0, 1.0, closed_high=False)
  checks.non_negative(who, "eps", o.eps)
  check_step(
    who,
    side=o.side,
    qh_nu=o.qh_nu,
    low_rank_term=o.low_rank_term,
    full_rank_numerator=o.full_rank_numerator,
    error_feedback=o.error_feedback,
  )
  checks.one_of(who, "transport", o.transport, TRANSPORTS)
  checks.one_of(who, "full_rank_scale", o.full_rank_scale, FULL_RANK_SCALES)
  check_projection(
    who, o.projection, two_sided=o.two_sided, side=o.side, full_rank_scale=o.full_rank_scale
  )
  checks.positive_int(who, "oversample", o.oversample, optional=True, minimum=0)
  checks.positive_int(who, "power_iterations", o.power_iterations, optional=True, minimum=0)
  checks.one_of(
    who, "error_feedback_dtype", dtype_name(o.error_feedback_dtype), ERROR_FEEDBACK_DTYPES
  )


def dtype_name(dtype: Any) -> str:
  """A dtype's name (``"float32"``), from a name or a dtype object."""
  return dtype if isinstance(dtype, str) else jnp.dtype(dtype).name


@dataclasses.dataclass(frozen=True)
class LowRankOptions:
  """The options of the low-rank Adam step (MATH.md §3), written and checked once.

  :func:`scale_by_low_rank_adam`, :func:`lordo_jax.lordo`, its ablations and
  :func:`lordo_jax.low_rank_ddp` take these as keywords (their signatures and Args
  text come from here, :mod:`lordo_jax._keywords`); :func:`check_options` checks them.
  """

  rank: int = keywords.option("r, the dimension of each matrix's subspace.", static=True)
  omega: float = keywords.option(
    "weight of the low-rank term of the quasi-hyperbolic mix; 1 is plain low-rank Adam "
    "(GaLore), with no full-rank term.",
    1.0,
    defaults={"lordo": 0.7, "lordo_local_projection": 0.7},
  )
  full_rank_rescale: float = keywords.option(
    "rescaling of the full-rank term ``G / (mu s)``.", 1.0, keyword="mu"
  )
  b1: float = keywords.option("Adam's first-moment decay.", 0.9)
  b2: float = keywords.option("Adam's second-moment decay.", 0.999)
  eps: float = keywords.option("Adam's denominator offset.", 1e-8)
  projection: str = keywords.option(
    "how each basis is refreshed (MATH.md §5), batched over the matrices of one shape: "
    '``"subspace_iteration"`` (LoRDO\'s: matrix products and ``r x r`` Cholesky '
    "factorizations, warm-started from the last basis, the factorizations of every shape "
    "in one solver call, its first basis an SVD; on any hardware, and the one for GPUs "
    "and TPUs, whose solver libraries decompose large matrices one at a time), "
    "``\"svd\"`` (low-rank DDP's, GaLore's: exact, but a full decomposition of every "
    'matrix at every refresh), ``"randomized_svd"`` (sketches: workers average sketches '
    'instead of matrices) or ``"dct"`` (a fixed basis, nothing decomposed, but trains '
    'worse); with ``two_sided=True``, ``"svd"`` (what LoRDO\'s default means there: '
    'two-sided bases have no subspace iteration) or ``"randomized_svd"``. What each '
    "costs on a GPU: `the accelerators guide "
    "<../guides/accelerators.html#the-refresh-which-projection-where>`__.",
    "svd",
    defaults={
      "lordo": "subspace_iteration",
      "lordo_local_projection": "subspace_iteration",
      "lordo_global_projection_only": "subspace_iteration",
    },
  )
  side: str = keywords.option(
    '``"auto"`` (moments on the smaller dimension: left when p >= q), ``"left"``, '
    '``"right"``, or ``"galore_std"`` (moments on the larger dimension, as GaLore\'s '
    'standard projection); ``"auto"`` when two-sided.',
    "auto",
  )
  transport: str = keywords.option(
    'the moments at a refresh: ``"rotate"`` (LDAdam, MATH.md §4.6), ``"keep"`` '
    '(GaLore) or ``"reset"``.',
    "rotate",
    defaults={"low_rank_ddp": "keep"},
  )
  error_feedback: bool = keywords.option(
    "keep the projection residual ``E = A - Q Q^T A`` (two-sided: ``A - U C V^T``) and "
    "feed it back (off by default, MATH.md §3 says why).",
    False,
  )
  error_feedback_dtype: str = keywords.option(
    '``"float32"`` or ``"bfloat16"`` (half the memory): the dtype of E. A name, not a '
    "dtype object, so that ``optax.inject_hyperparams`` leaves it alone.",
    "float32",
  )
  full_rank_scale: str = keywords.option(
    '``"scalar"`` or ``"vector"``: how the full-rank term\'s ``s`` is taken from D.',
    "scalar",
  )
  full_rank_numerator: str = keywords.option(
    '``"gradient"`` (G) or ``"error_fed"`` (G + E, E the error buffer before the step: '
    "the LoRDO authors' full-rank term; needs ``error_feedback=True``).",
    "gradient",
  )
  qh_nu: float = keywords.option(
    "QHAdam inside the projection, ``L = Q ((1 - nu) c + nu u_hat) / D``; 1 is Adam.",
    1.0,
  )
  low_rank_term: str = keywords.option(
    '``"adam"`` (``Q u_hat / D``) or ``"momentum"`` (``Q u_hat``, the update the LoRDO '
    "authors' code applies; for replication only, ``docs/FIDELITY.md``).",
    "adam",
  )
  subspace_iterations: int | None = keywords.option(
    'steps of warm-started subspace iteration per refresh with ``"subspace_iteration"`` '
    "(``None``: 2).",
    None,
    static=True,
  )
  two_sided: bool = keywords.option(
    "project on both sides (TSR-Adam, MATH.md §5): the "
    "moments and their messages are ``r x r`` cores.",
    False,
  )
  oversample: int | None = keywords.option(
    'extra sketch columns of ``"randomized_svd"`` (``None``: 8).', None, static=True
  )
  power_iterations: int | None = keywords.option(
    'power iterations of ``"randomized_svd"`` (``None``: 1; each costs two more '
    "products with the matrix, and two more averages when distributed).",
    None,
    static=True,
  )


STEP_KEYWORDS = keywords.of(LowRankOptions)
