r"""The refresh of the low-rank bases by :func:`lordo_jax.synchronize`.

:class:`BasisRefresh` recomputes every basis of the local optimizer's
:class:`~lordo_jax.local._low_rank_adam.LowRankAdam` from a source matrix, one of
:data:`SOURCES`: before step 1 (:meth:`BasisRefresh.before_first_step`) and at every
sync of its fragment (:meth:`BasisRefresh.at_sync`).
"""

from collections.abc import Callable
from typing import Any

import jax

from lordo_jax.round import _averaging as averaging_lib
from lordo_jax.round import _moment_trees as moment_trees

SOURCES = ("pseudo_gradient", "local_gradient")


class BasisRefresh:
  r"""What :func:`lordo_jax.synchronize` does to the low-rank bases, chosen once.

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

  Args:
    low_rank: the :class:`~lordo_jax.local.LowRankAdam` inside the local optimizer;
      ``None``: there is no basis, and nothing happens.
    init_projection: ``"gradient"``: the first basis from the first gradient, before
      step 1; ``None``: ``low_rank`` sets its own.
    source: one of :data:`SOURCES`.
    gradient_mean: ``(tree, present, ledger) -> (mean, fraction, ledger)``, the round's
      average of a gradient (:meth:`lordo_jax.round._averaging.Averaging.gradient_mean`).
  """

  def __init__(self, low_rank, init_projection: str | None, source: str, gradient_mean: Callable):
    self.low_rank = low_rank
    self.init_projection = init_projection
    self.source = source
    self.gradient_mean = gradient_mean

  def before_first_step(self, count, grads, inner_state: Any, ledger, present):
    """``(inner_state, ledger)``: at step 1 (a ``lax.cond`` on ``count``, so later
    steps send nothing) every basis from the first gradient; else unchanged."""
    if self.low_rank is None or self.init_projection != "gradient":
      return inner_state, ledger
    return jax.lax.cond(
      count == 1,
      lambda s, led: self.initial_projection(s, led, grads, present),
      lambda s, led: (s, led),
      inner_state,
      ledger,
    )

  def initial_projection(self, inner_state: Any, ledger, grads, present):
    r"""Every basis from the first gradient: the workers' mean :math:`\bar g_1` (one
    counted message), or this worker's own (``"local_gradient"``, nothing sent).

    Returns:
      ``(inner_state, ledger)``.
    """
    matrices = moment_trees.low_rank_leaves(inner_state, grads)
    if self.source == "pseudo_gradient":
      matrices, _, ledger = self.gradient_mean(matrices, present, ledger)
    state = moment_trees.low_rank_state(inner_state)
    refreshed = self.low_rank.refresh(state, matrices, first=True)
    return moment_trees.with_low_rank_state(inner_state, refreshed), ledger

  def at_sync(self, inner_state: Any, delta, grads, fragment, fraction):
    r"""The bases of the leaves in ``fragment`` recomputed from this sync's source.

    Args:
      inner_state: the local optimizer's state.
      delta: the averaged pseudo-gradient :math:`\Delta` of the leaves in ``fragment``.
      grads: this worker's gradient of the sync step.
      fragment: the fragment's leaves (``None``: all).
      fraction: the share of workers in the mean of ``delta``; at 0 nothing changes.

    Returns:
      The local optimizer's state with the new bases and transported moments.
    """
    if self.low_rank is None:
      return inner_state
    source = delta if self.source == "pseudo_gradient" else grads
    state = moment_trees.low_rank_state(inner_state)
    # The matrices outside the fragment are masked: they keep their bases and moments.
    refreshed = self.low_rank.refresh(state, moment_trees.select(source, fragment))
    refreshed = moment_trees.with_low_rank_state(inner_state, refreshed)
    return averaging_lib.unless_empty(fraction, refreshed, inner_state)
