r"""The refresh of the low-rank bases by :func:`lordo_jax.synchronize`.

Every basis :math:`Q` of the local optimizer's
:class:`~lordo_jax.local._low_rank_adam.LowRankAdam` is recomputed from a source matrix
:math:`S` (``low_rank.refresh``, which also transports the moments into the new
subspace), at two moments:

* before step 1 (``init_projection="gradient"``), from the first gradient
  :math:`S = g_1`;
* at every sync of its fragment, from the round's :math:`S = \Delta`.

The source is one of :data:`SOURCES`:

* ``"pseudo_gradient"``: the mean over the workers, :math:`\bar g_1` (one counted
  full-size message) and the averaged :math:`\Delta` (already sent for the outer
  step). Every worker computes the same basis, so the subspace is shared for free;
* ``"local_gradient"``: each worker's own gradient of that step, :math:`g_{m,t}`, no
  message; the bases then differ between workers.

Where nobody was present at a sync, the bases and moments are kept.
"""

from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import jax

from lordo_jax.local import _low_rank_adam as low_rank_lib
from lordo_jax.round import _averaging as averaging
from lordo_jax.round import _moment_trees as moment_trees


class ProjectionSource(NamedTuple):
  """Where a refresh takes its source matrix from."""

  before_first_step: Callable  # (grads, present, ledger, mean) -> (source, ledger): before step 1.
  at_sync: Callable  # (delta, grads, fragment) -> source: at a sync of the leaves in fragment.


def _averaged_first_gradient(grads, present, ledger, mean):
  r""":math:`\bar g_1`: the first gradient averaged over the workers (one message)."""
  source, _, ledger = mean(grads, present, ledger)
  return source, ledger


def _own_first_gradient(grads, present, ledger, mean):
  """:math:`g_{m,1}`: this worker's first gradient, nothing sent."""
  del present, mean
  return grads, ledger


SOURCES = {
  "pseudo_gradient": ProjectionSource(
    before_first_step=_averaged_first_gradient,
    at_sync=lambda delta, grads, fragment: delta,
  ),
  "local_gradient": ProjectionSource(
    before_first_step=_own_first_gradient,
    at_sync=lambda delta, grads, fragment: moment_trees.select(grads, fragment),
  ),
}


def initial_projection(
  inner_state: Any,
  ledger,
  grads,
  present,
  *,
  low_rank: low_rank_lib.LowRankAdam,
  source: ProjectionSource,
  mean: Callable,
):
  """Every basis computed from the first gradient, before step 1's local step.

  Args:
    inner_state: the local optimizer's state.
    ledger: the wrapper's ledger.
    grads: the gradient of step 1.
    present: whether this worker's gradient enters the mean.
    low_rank: the :class:`~lordo_jax.local._low_rank_adam.LowRankAdam` inside the optimizer.
    source: the :class:`ProjectionSource`.
    mean: ``(tree, present, ledger) -> (mean, fraction, ledger)``
      (:class:`lordo_jax.round._averaging.Averaging`'s ``mean``).

  Returns:
    ``(inner_state, ledger)``.
  """
  matrices = moment_trees.low_rank_leaves(inner_state, grads)
  matrices, ledger = source.before_first_step(matrices, present, ledger, mean)
  return moment_trees.refresh_projections(inner_state, low_rank, matrices, first=True), ledger


def refresh_at_sync(
  inner_state: Any,
  delta,
  grads,
  fragment,
  fraction,
  *,
  low_rank: low_rank_lib.LowRankAdam,
  source: ProjectionSource,
):
  r"""The bases of the leaves in ``fragment`` recomputed from this sync's source.

  Args:
    inner_state: the local optimizer's state.
    delta: the averaged pseudo-gradient :math:`\Delta` of the leaves in ``fragment``.
    grads: this worker's gradient of the sync step.
    fragment: the fragment's leaves (``None``: all).
    fraction: the share of workers in the mean of ``delta``; at 0 nothing changes.
    low_rank: the :class:`~lordo_jax.local._low_rank_adam.LowRankAdam` inside the optimizer.
    source: the :class:`ProjectionSource`.

  Returns:
    The local optimizer's state with the new bases and transported moments.
  """
  matrices = moment_trees.low_rank_leaves(inner_state, source.at_sync(delta, grads, fragment))
  refreshed = moment_trees.refresh_projections(inner_state, low_rank, matrices, fragment=fragment)
  return averaging.unless_empty(fraction, refreshed, inner_state)


class BasisRefresh(NamedTuple):
  """What ``synchronize`` does to the bases: before step 1, and at each sync."""

  before_first_step: Callable  # (count, grads, inner_state, ledger, present) -> (state, ledger).
  at_sync: Callable  # (inner_state, delta, grads, fragment, fraction) -> inner_state.


def _unchanged_before_first_step(count, grads, inner_state, ledger, present):
  """No initial projection: the state as it is."""
  del count, grads, present
  return inner_state, ledger


def _unchanged_at_sync(inner_state, delta, grads, fragment, fraction):
  """No low-rank basis: the state as it is."""
  del delta, grads, fragment, fraction
  return inner_state


def choose(
  low_rank: low_rank_lib.LowRankAdam | None,
  init_projection: str | None,
  projection_source: str,
  mean: Callable,
) -> BasisRefresh:
  """The refreshes of ``synchronize``'s options.

  Without ``low_rank`` nothing is refreshed; with it the bases are refreshed at
  every sync, and before step 1 (in a ``lax.cond`` on the step count, so later steps
  send nothing) when ``init_projection == "gradient"``.
  """
  if low_rank is None:
    return BasisRefresh(_unchanged_before_first_step, _unchanged_at_sync)
  source = SOURCES[projection_source]

  def before_first_step(count, grads, inner_state, ledger, present):
    return jax.lax.cond(
      count == 1,
      lambda s, led: initial_projection(
        s, led, grads, present, low_rank=low_rank, source=source, mean=mean
      ),
      lambda s, led: (s, led),
      inner_state,
      ledger,
    )

  def at_sync(inner_state, delta, grads, fragment, fraction):
    return refresh_at_sync(
      inner_state, delta, grads, fragment, fraction, low_rank=low_rank, source=source
    )

  if init_projection != "gradient":
    return BasisRefresh(_unchanged_before_first_step, at_sync)
  return BasisRefresh(before_first_step, at_sync)
