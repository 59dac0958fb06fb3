"""The keyword groups the methods share, each written once with its Args text.

:func:`basics` (every method), :data:`ADAM`, :data:`LOW_RANK` (lordo, its ablations,
low-rank DDP: the low-rank step's :class:`~lordo_jax.local.LowRankOptions` and
:class:`LocalOptions`) and :data:`ROUND` (the methods built on
:func:`lordo_jax.synchronize`). A bad value
fails when the method is built, naming the method, the option, its value and what
is accepted (:mod:`lordo_jax._checks`).
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import optax

from lordo_jax import _checks as checks
from lordo_jax import _keywords as keywords
from lordo_jax.local import _low_rank_options as low_rank_options
from lordo_jax.round import _round_options as round_options_lib
from lordo_jax.round import _synchronize as sync_lib


@dataclasses.dataclass(frozen=True)
class Schedule:
  """The learning rate every method takes first."""

  learning_rate: optax.ScalarOrSchedule = keywords.option("a float or an optax schedule.")


@dataclasses.dataclass(frozen=True)
class LocalOptions:
  """The local step's options around the low-rank step (:mod:`.local_step`)."""

  weight_decay: float = keywords.option("decoupled weight decay, as in ``optax.adamw``.", 0.0)
  full_rank_nu: float = keywords.option(
    "QHAdam on the leaves off the low-rank path, ``((1 - nu) g + nu m_hat) / (sqrt(v_hat) "
    "+ eps)``; 1 is Adam.",
    1.0,
  )
  low_rank_labels: Callable | None = keywords.option(
    "which leaves are low-rank: a function of the params giving a tree of labels "
    "(:class:`lordo_jax.MatrixAxes`, ``True``/``False``); ``None``: every 2-D leaf with "
    "``min(p, q) > rank``.",
    None,
  )


def basics(*names: str) -> tuple[keywords.Keyword, ...]:
  """The learning rate and the round's ``names`` (``sync_every``, ``axis_name``,
  ``outer_optimizer``), which a method declares in its own signature."""
  return keywords.of(Schedule) + keywords.of(round_options_lib.RoundBasics, *names)


ADAM = keywords.of(low_rank_options.LowRankOptions, "b1", "b2", "eps") + keywords.of(
  LocalOptions, "weight_decay"
)
LOW_RANK = keywords.of(low_rank_options.LowRankOptions) + keywords.of(LocalOptions)
ROUND = keywords.of(round_options_lib.RoundOptions)


def check_adam(who: str, options: dict[str, Any]) -> None:
  r"""Adam's options: :math:`\beta_1, \beta_2 \in [0, 1)`, :math:`\epsilon, \lambda \ge 0`."""
  checks.in_interval(who, "b1", options["b1"], 0.0, 1.0, closed_high=False)
  checks.in_interval(who, "b2", options["b2"], 0.0, 1.0, closed_high=False)
  checks.non_negative(who, "eps", options["eps"])
  checks.non_negative(who, "weight_decay", options["weight_decay"])


def low_rank_step(
  who: str, options: dict[str, Any]
) -> tuple[low_rank_options.LowRankOptions, LocalOptions]:
  """A method's low-rank step and the local options around it, from its keywords.

  The step's own options are checked once, where the step is built
  (:func:`lordo_jax.local._low_rank_options.check_options`, in ``who``'s name); here only
  what the method adds: ``full_rank_nu`` in [0, 1] and ``weight_decay`` >= 0.
  """
  step_options = keywords.build(low_rank_options.LowRankOptions, options)
  local_options = keywords.build(LocalOptions, options)
  checks.in_interval(who, "full_rank_nu", local_options.full_rank_nu, 0.0, 1.0, closed_high=True)
  checks.non_negative(who, "weight_decay", local_options.weight_decay)
  return step_options, local_options


def round_options(who: str, options: dict[str, Any]) -> round_options_lib.RoundOptions:
  """A method's round options, from its keywords, each checked once in ``who``'s name
  (:func:`lordo_jax.round._synchronize.check_round`, ``sync_every`` among them)."""
  r = keywords.build(round_options_lib.RoundOptions, options)
  sync_lib.check_round(who, options["sync_every"], r)
  return r
