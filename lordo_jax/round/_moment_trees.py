"""The moments and bases inside a local optimizer's state, reached leaf by leaf.

:func:`lordo_jax.synchronize` averages the Adam moments of the optimizer it wraps
(:func:`moment_tree`, :func:`with_moments`) and refreshes its low-rank bases
(:func:`low_rank_state`, :func:`with_low_rank_state`), for all parameters or (streaming)
for one fragment of them (:func:`select`, :func:`merge`).
"""

from typing import Any

import jax
import optax

from lordo_jax.local import _low_rank_adam as low_rank_lib


def _is_entry(x) -> bool:
  return isinstance(x, (optax.MaskedNode, low_rank_lib.LowRankMoments))


def _is_moment_node(x) -> bool:
  return isinstance(x, (low_rank_lib.LowRankAdamState, optax.ScaleByAdamState))


def select(tree: Any, fragment: Any) -> Any:
  """``tree`` (shaped like the params) with the leaves outside ``fragment`` masked.

  A subset of the parameters is a ``fragment`` tree of Python bools shaped like the
  params (``None``: all of them); the leaves outside it become ``MaskedNode()``.
  """
  if fragment is None:
    return tree
  # By the fragment's leaves: a leaf's entry in ``tree`` is taken whole (a matrix's
  # moments, or a parameter still in its Flax Variable).
  return jax.tree.map(lambda k, x: x if k else optax.MaskedNode(), fragment, tree)


def merge(full: Any, part: Any) -> Any:
  """``full`` with the leaves ``part`` holds (not ``MaskedNode``) put in."""
  return jax.tree.map(
    lambda f, p: f if isinstance(p, optax.MaskedNode) else p, full, part, is_leaf=_is_entry
  )


def moment_tree(inner_state: Any, field: str, fragment: Any = None) -> Any:
  """The ``field`` ("mu" or "nu") moments of every Adam-like node, None elsewhere.

  The Adam-like nodes :func:`lordo_jax.synchronize` finds in the state of the optimizer
  it wraps are ``optax.ScaleByAdamState`` (moments shaped like the params) and
  :class:`~lordo_jax.LowRankAdamState` (a :class:`~lordo_jax.LowRankMoments` per
  shape group, read per matrix: ``GroupedMoments.matrices``); both give trees shaped
  like the params, with ``optax.MaskedNode()`` where ``optax.partition`` routed a leaf
  elsewhere. Only the leaves in ``fragment`` are taken (:func:`select`).
  """

  def pick(node):
    if isinstance(node, optax.ScaleByAdamState):
      return select(getattr(node, field), fragment)
    if isinstance(node, low_rank_lib.LowRankAdamState):
      moments = select(node.moments.matrices(), fragment)
      return low_rank_lib.map_matrices(lambda m: getattr(m, field), moments)
    return None

  return jax.tree.map(pick, inner_state, is_leaf=_is_moment_node)


def with_moments(inner_state: Any, field: str, moments: Any) -> Any:
  """``inner_state`` with the ``field`` moments that ``moments`` holds put in."""

  def put(node, new):
    if isinstance(node, optax.ScaleByAdamState):
      return node._replace(**{field: merge(getattr(node, field), new)})
    if isinstance(node, low_rank_lib.LowRankAdamState):

      def one(m, x):
        return m if isinstance(x, optax.MaskedNode) else m._replace(**{field: x})

      matrices = low_rank_lib.map_matrices(one, node.moments.matrices(), new)
      return node._replace(moments=node.moments.with_matrices(matrices))
    return node

  return jax.tree.map(put, inner_state, moments, is_leaf=_is_moment_node)


def _is_low_rank(x) -> bool:
  return isinstance(x, low_rank_lib.LowRankAdamState)


def low_rank_state(inner_state: Any) -> low_rank_lib.LowRankAdamState | None:
  """The one low-rank Adam state inside ``inner_state`` (``None``: there is none)."""
  nodes = [n for n in jax.tree.leaves(inner_state, is_leaf=_is_low_rank) if _is_low_rank(n)]
  if not nodes:
    return None
  if len(nodes) > 1:
    raise ValueError(
      "synchronize found more than one scale_by_low_rank_adam state in the local "
      "optimizer; use one low-rank transformation (route leaves with "
      "optax.partition)."
    )
  return nodes[0]


def with_low_rank_state(inner_state: Any, new: low_rank_lib.LowRankAdamState) -> Any:
  """``inner_state`` with its low-rank Adam state replaced by ``new``."""
  return jax.tree.map(lambda n: new if _is_low_rank(n) else n, inner_state, is_leaf=_is_low_rank)


def low_rank_leaves(inner_state, tree):
  """``tree`` with every leaf that is not a low-rank matrix replaced by MaskedNode."""
  node = low_rank_state(inner_state)
  if node is None:
    return None
  return node.moments.tree_of(node.moments.leaves_of(tree))
