r"""Which optimizer moments a sync of :func:`lordo_jax.synchronize` averages.

The moment fields are grouped by period (:func:`moment_groups`), and
:func:`average_due_moments` averages the groups due at a sync (:func:`due`), each in one
message (:func:`average_moments`).
"""

import functools
from collections.abc import Callable
from typing import Any

import jax

from lordo_jax.round import _averaging as averaging_lib
from lordo_jax.round import _moment_trees as moment_trees


def moment_groups(first_moment_every: int | None, second_moment_every: int | None) -> list:
  """``[(period, fields), ...]``: the moment fields averaged together, by period.

  Examples:
    >>> from lordo_jax.round import _moment_averaging as moment_averaging
    >>> moment_averaging.moment_groups(1, 1)
    [(1, ('mu', 'nu'))]
    >>> moment_averaging.moment_groups(2, None)
    [(2, ('mu',))]
  """
  periods = {"mu": first_moment_every, "nu": second_moment_every}
  groups: dict[int, list[str]] = {}
  for field, period in periods.items():
    if period is not None:
      groups.setdefault(period, []).append(field)
  return [(period, tuple(fields)) for period, fields in groups.items()]


def due(sync_index, groups: list) -> list:
  r"""``[(predicate, fields), ...]``: whether each group is averaged at sync ``s``.

  The predicate is :math:`s \bmod P = 0` for the group's period P; ``sync_index``
  may be traced.
  """
  return [(sync_index % period == 0, fields) for period, fields in groups]


def average_moments(inner_state, ledger, fields, present, fragment, moment_mean: Callable):
  """``inner_state`` with its ``fields`` moments of the leaves in ``fragment`` averaged.

  Args:
    inner_state: the local optimizer's state.
    ledger: the wrapper's ledger.
    fields: the moment fields to average, ``("mu",)``, ``("nu",)`` or both.
    present: whether this worker's moments enter the mean.
    fragment: the leaves to average (``None``: all).
    moment_mean: ``(tree, present, ledger) -> (mean, fraction, ledger)``, one message
      (:meth:`lordo_jax.round._averaging.Averaging.moment_mean`).

  Returns:
    ``(inner_state, ledger)``; where nobody was present the moments are kept.
  """
  moments = {f: moment_trees.moment_tree(inner_state, f, fragment) for f in fields}
  averaged, fraction, ledger = moment_mean(moments, present, ledger)
  for f in fields:
    kept = averaging_lib.unless_empty(fraction, averaged[f], moments[f])
    inner_state = moment_trees.with_moments(inner_state, f, kept)
  return inner_state, ledger


def average_due_moments(
  inner_state: Any, ledger, sync_index, groups: list, present, fragment, moment_mean: Callable
):
  r"""The moments due at sync ``sync_index`` (:func:`due`) averaged, each group in a
  ``lax.cond`` of its own, so nothing is sent at the syncs where it is not due (a group
  due at every sync, period 1, with no conditional).

  The first moments (``mu``) are averaged at every ``first_moment_every``-th sync, the
  second (``nu``) at every ``second_moment_every``-th (``None``: never). At the s-th
  sync (1-based, counted per fragment) the fields due are

  .. math::
    \{\texttt{mu} : s \bmod P_1 = 0\} \cup \{\texttt{nu} : s \bmod P_2 = 0\},

  and fields with the same period go in one message. A moment (low-rank ``r x q`` or
  full-rank) is replaced by its mean over the workers, and kept where nobody was present.
  """
  for (period, _), (predicate, fields) in zip(groups, due(sync_index, groups), strict=True):
    average = functools.partial(
      average_moments, fields=fields, present=present, fragment=fragment, moment_mean=moment_mean
    )
    if period == 1:  # Due at every sync: no conditional (on a GPU it copied the state).
      inner_state, ledger = average(inner_state, ledger)
      continue
    inner_state, ledger = jax.lax.cond(
      predicate, average, lambda s, led: (s, led), inner_state, ledger
    )
  return inner_state, ledger
