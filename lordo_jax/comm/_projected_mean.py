r"""Low-rank Adam made data-parallel by averaging its coordinates, not the gradient.

:func:`projected_mean` is low-rank DDP's ``communicate="projected"``
(:func:`lordo_jax.low_rank_ddp`); its docstring has the steps and what travels.
"""

from typing import Any
from typing import NamedTuple

import jax
import optax

from lordo_jax import _tree_structure as state_structure
from lordo_jax.comm import _collectives as collectives
from lordo_jax.local import _low_rank_adam as low_rank_lib


class ProjectedMeanState(NamedTuple):
  """State of :func:`projected_mean`."""

  inner: low_rank_lib.LowRankAdamState  # The low-rank step's own state.
  ledger: collectives.Ledger  # What this transformation has all-reduced since init.


def _refreshed(low_rank: low_rank_lib.LowRankAdam, state, ledger, updates, first, axis_name):
  """``(state, ledger)`` after a refresh from the workers' mean gradient."""
  counted = [ledger]

  def mean(arrays: list) -> list:
    averaged, counted[0] = collectives.counted_pmean(arrays, counted[0], axis_name)
    return averaged

  refreshed = low_rank.refresh(state, updates, first=first, mean=mean)
  return refreshed, counted[0]


def projected_mean(
  low_rank: low_rank_lib.LowRankAdam, axis_name: str | None
) -> optax.GradientTransformation:
  r"""``low_rank`` on the workers' mean gradient, sending its coordinates only.

  The workers share every basis Q, and the projection is linear, so the mean of the
  workers' coordinates is the coordinates of the mean gradient:

  .. math::
    \mathrm{mean}_m\, \mathrm{project}(Q, G_m) = \mathrm{project}(Q, \bar G),
    \qquad \bar G = \mathrm{mean}_m G_m .

  Each step :func:`projected_mean` takes the low-rank step of
  :mod:`lordo_jax.local._low_rank_adam` apart and averages between its pieces:

  1. on a refresh step (``refresh_due``), the bases of the workers' mean gradient:
     the ``p x q`` gradient averaged, or, for ``randomized_svd``, only its sketches
     (``(p + q)(r + \text{oversample})`` elements per pass, one- or two-sided);
  2. ``project``: :math:`c_m = \mathrm{project}(Q, G_m)` (``r x q``, ``p x r``, or
     ``r x r`` two-sided);
  3. :math:`\bar c = \mathrm{mean}_m c_m`, the only message of an ordinary step;
  4. ``step``: the moments and the direction from :math:`\bar c`.

  The iterates are those of the low-rank step on :math:`\bar G`, when the direction
  needs nothing but the coordinates: the full-rank term (``omega < 1``) and error
  feedback read the whole gradient, so they are not accepted here. Every mean is
  counted in the state's ledger (:func:`lordo_jax.comm._collectives.counted_pmean`).

  Args:
    low_rank: a :func:`lordo_jax.scale_by_low_rank_adam` with ``omega=1`` and no
      error feedback; its ``refresh_every`` says when the bases are refreshed.
    axis_name: the worker axis; ``None`` for one worker (then nothing is sent and
      this is ``low_rank`` itself).

  Returns:
    An ``optax.GradientTransformation`` whose state is a :class:`ProjectedMeanState`.
  """

  def init_fn(params: Any) -> ProjectedMeanState:
    return ProjectedMeanState(inner=low_rank.init(params), ledger=collectives.init_ledger())

  def update_fn(updates, state: ProjectedMeanState, params=None):
    del params
    collectives.check_axis_bound(axis_name, "low_rank_ddp(communicate='projected')")
    inner, ledger = state.inner, state.ledger
    count = optax.safe_int32_increment(inner.count)
    due = low_rank.refresh_due(count)
    if due is not None:
      inner, ledger = jax.lax.cond(
        due,
        lambda: _refreshed(low_rank, inner, ledger, updates, count == 1, axis_name),
        lambda: (inner, ledger),
      )
    projected = low_rank.project(updates, inner)
    coordinates, ledger = collectives.counted_pmean(projected.coordinates, ledger, axis_name)
    directions, inner = low_rank.step(updates, inner, projected._replace(coordinates=coordinates))
    return directions, ProjectedMeanState(inner=inner, ledger=ledger)

  who = "low_rank_ddp(communicate='projected')"
  return optax.GradientTransformation(init_fn, state_structure.conformed(init_fn, update_fn, who))
