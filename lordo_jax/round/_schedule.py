r"""When a round ends: which parameters :func:`lordo_jax.synchronize` syncs at a step.

:func:`fragment_masks` splits the parameters into fragments (one without streaming),
:func:`sync_predicates` says which fragments sync at a step (:func:`synced_now`: per
leaf), and :func:`next_sync` moves the round's end on when ``sync_every`` is a function.
"""

from typing import Any

import jax
import jax.numpy as jnp

from lordo_jax import _tree_structure as tree_structure
from lordo_jax.round import _periods as periods


def fragment_masks(params: Any, fragments) -> list:
  """One ``fragment`` tree of Python bools per fragment; ``[None]`` without streaming.

  Args:
    params: the parameters (their tree and leaf sizes decide the split).
    fragments: an int F (1: no streaming) or a function of the params returning a
      tree of fragment indices (:func:`lordo_jax.round._periods.fragment_labels`).

  Returns:
    A list of F trees shaped like ``params``, leaf ``True`` in the tree of its
    fragment; exactly one tree holds ``True`` at each leaf.
  """
  if not callable(fragments) and fragments == 1:
    return [None]
  labels = periods.fragment_labels(params, fragments)
  treedef = jax.tree.structure(tree_structure.values(params))  # Flax's Variables read.
  return [treedef.unflatten([lab == f for lab in labels]) for f in range(max(labels) + 1)]


def sync_predicates(sync_every: periods.SyncPeriod, fragments: int, count, next_sync) -> list:
  r"""Whether each fragment syncs at step ``count``: a bool scalar per fragment.

  A sync is decided per fragment of the parameters (one fragment, all of them, without
  streaming). At the optax step count :math:`t` (1-based: the step being taken)
  fragment :math:`f` syncs when

  * ``sync_every`` is an int K: :math:`t \bmod K = o_f`, with the staggered offsets
    :math:`o_f = \lfloor (f + 1) K / F \rfloor \bmod K` of
    :func:`lordo_jax.round._periods.fragment_offsets` (F = 1: :math:`t \bmod K = 0`);
  * ``sync_every`` is a function of the step (``fragments`` is then 1): :math:`t = n`,
    the step that ends the current round, kept in the state as ``next_sync`` and moved
    on by :func:`next_sync` to :math:`t + H(t)` when the round ends.

  The last predicate is the round's end. The predicates are traced scalars, so a
  changing period never recompiles the step.

  Args:
    sync_every: K, or the period function.
    fragments: F, the number of fragments (at most K).
    count: :math:`t`, the step being taken (int32 scalar, 1 on the first step).
    next_sync: :math:`n`, the step that ends the current round.

  Returns:
    F bool scalars, fragment order.
  """
  if callable(sync_every):
    return [count == next_sync]
  return [
    count % sync_every == offset for offset in periods.fragment_offsets(sync_every, fragments)
  ]


def synced_now(params: Any, masks: list, predicates: list) -> Any:
  """A bool scalar per leaf of ``params``: the predicate of the leaf's fragment."""
  if masks[0] is None:
    return jax.tree.map(lambda _: predicates[0], params)
  return jax.tree.map(lambda *keeps: predicates[keeps.index(True)], *masks)


def next_sync(sync_every: periods.SyncPeriod, count, current, ends_round):
  r"""The step that ends the round after step ``count``.

  .. math::
    n' = \begin{cases} t + H(t) & \text{the round ends at } t \\ n & \text{otherwise}
    \end{cases}

  with :math:`H(t)` the length of the round whose first update follows step t
  (:func:`lordo_jax.round._periods.round_length`).
  """
  return jnp.where(ends_round, count + periods.round_length(sync_every, count), current)
