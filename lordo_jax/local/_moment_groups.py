r"""The low-rank state of every matrix, stored per shape group: :class:`GroupedMoments`.

The matrices of one shape, dtype and split (a transformer's layers: four groups of
twelve in GPT-2 small, :func:`lordo_jax.local._shape_groups.groups`) keep their
:class:`LowRankMoments`-shaped state in one stack per group: every field of group
:math:`g = (i_1, \dots, i_n)` is the matrices' fields along one leading axis,

.. math::
  Q_g = [Q_{i_1}; \dots; Q_{i_n}], \quad u_g = [u_{i_1}; \dots; u_{i_n}], \quad
  v_g, \; E_g \text{ alike},

a matrix that is itself a stack (``(*batch, p, q)``) taking ``prod(batch)`` entries of
that axis; a group of one matrix holds that matrix's state as it is. A batched step
then reads and writes each stack in place, a few kernels per group, where a state per
matrix costs kernels per matrix and copies to stack and unstack it every step.
:meth:`GroupedMoments.matrices` gives the state per matrix, a tree like the params
(slices of the stacks), and :meth:`GroupedMoments.with_matrices` puts such a tree
back.
"""

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import optax

from lordo_jax.local import _shape_groups as shape_groups


@dataclasses.dataclass(frozen=True)
class MatrixLayout:
  """Where each matrix's state is in a :class:`GroupedMoments` (static: its tree's
  structure, compared and hashed with it)."""

  treedef: Any  # The params-like tree, a leaf at every matrix and every MaskedNode.
  matrices: tuple[int, ...]  # The positions of the matrices among its leaves.
  groups: tuple[tuple[int, ...], ...]  # Per group, its matrices (indices in leaf order).
  batch_shapes: tuple[tuple[int, ...], ...]  # Per matrix, its leaf's batch axes.
  # Per group, the axes of each leaf of one matrix's state after its batch axes: a
  # stack's axis of matrices is the one before them, whatever axes lead (a state
  # stacked over workers outside the step).
  cores: tuple[tuple[int, ...], ...]

  def same_matrices(self, other: "MatrixLayout") -> bool:
    """Whether ``other`` stores the same matrices in the same groups (whatever the
    fields each holds: an error buffer or none)."""
    mine = (self.treedef, self.matrices, self.groups, self.batch_shapes)
    return mine == (other.treedef, other.matrices, other.groups, other.batch_shapes)

  def group_of(self, i: int) -> int:
    """The group of matrix ``i``."""
    for g, members in enumerate(self.groups):
      if i in members:
        return g
    raise IndexError(f"no matrix {i}")

  def stack(self, g: int, entries: list[Any], indices: list[int]) -> Any:
    """The states ``entries`` of the matrices ``indices`` of group ``g`` as it stores
    them: each leaf along one axis of matrices; one matrix's state as it is."""
    if len(entries) == 1:
      return entries[0]
    flat = [jax.tree.leaves(entry) for entry in entries]
    leaves = []
    for n, core in enumerate(self.cores[g]):
      parts = []
      for entry, i in zip(flat, indices, strict=True):
        x, batch = entry[n], self.batch_shapes[i]
        lead = x.ndim - len(batch) - core
        parts.append(jnp.reshape(x, (*x.shape[:lead], -1, *x.shape[lead + len(batch) :])))
      leaves.append(jnp.concatenate(parts, axis=parts[0].ndim - core - 1))
    return jax.tree.unflatten(jax.tree.structure(entries[0]), leaves)

  def unstack(self, g: int, tree: Any, indices: list[int], only=None) -> list[Any]:
    """Inverse of :meth:`stack`: one state per matrix of ``indices`` (of those in
    ``only`` alone, in its order, if given: the others are not sliced out)."""
    only = list(indices) if only is None else list(only)
    if len(indices) == 1:
      return [tree] * len(only)
    starts, start = {}, 0
    for i in indices:
      starts[i] = start
      start += math.prod(self.batch_shapes[i])
    leaves, treedef = jax.tree.flatten(tree)
    entries = [[] for _ in only]
    for x, core in zip(leaves, self.cores[g], strict=True):
      lead = x.ndim - core - 1
      for entry, i in zip(entries, only, strict=True):
        batch = self.batch_shapes[i]
        part = jax.lax.slice_in_dim(x, starts[i], starts[i] + math.prod(batch), axis=lead)
        entry.append(jnp.reshape(part, (*x.shape[:lead], *batch, *x.shape[lead + 1 :])))
    return [treedef.unflatten(entry) for entry in entries]


def stacked(entries: list[Any], batch_shapes: list[tuple[int, ...]]) -> Any:
  """``entries`` (one tree per matrix, alike, no axis before their batch axes) as a group
  stores them: along one leading axis (:func:`~lordo_jax.local._shape_groups.stack`), or
  the one entry as it is."""
  if len(entries) == 1:
    return entries[0]
  return shape_groups.stack(entries, batch_shapes)


def unstacked(tree: Any, batch_shapes: list[tuple[int, ...]]) -> list[Any]:
  """Inverse of :func:`stacked`: one tree per matrix."""
  if len(batch_shapes) == 1:
    return [tree]
  return shape_groups.unstack(tree, batch_shapes)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GroupedMoments:
  """The state of every low-rank matrix, one stack per shape group.

  ``groups[g]`` is a :class:`~lordo_jax.LowRankMoments` whose fields hold the
  matrices of group ``g`` along one leading axis (a group of one matrix: its own state,
  unstacked); ``layout`` says which matrices each group holds, and the params-like tree
  :meth:`matrices` gives.

  Examples:
    Two matrices of one shape share a stack; another shape is a group of its own:

    >>> import jax.numpy as jnp, lordo_jax
    >>> params = {"a": jnp.ones((8, 4)), "b": jnp.ones((8, 4)), "c": jnp.ones((4, 6))}
    >>> moments = lordo_jax.scale_by_low_rank_adam(rank=2).init(params).moments
    >>> [group.mu.shape for group in moments.groups]
    [(2, 2, 4), (4, 2)]
    >>> moments.matrices()["b"].mu.shape
    (2, 4)
  """

  groups: tuple  # LowRankMoments per group, stacked.
  layout: MatrixLayout = dataclasses.field(metadata=dict(static=True))

  @classmethod
  def of(cls, tree: Any, is_matrix, groups: list[list[int]], batch_shapes: list):
    """The state ``tree`` (like the params: a matrix's state where ``is_matrix``,
    ``optax.MaskedNode`` elsewhere) stored in ``groups`` (indices of its matrices in leaf
    order); ``batch_shapes`` per matrix."""
    is_leaf = lambda x: is_matrix(x) or isinstance(x, optax.MaskedNode)  # noqa: E731
    leaves, treedef = jax.tree.flatten(tree, is_leaf=is_leaf)
    positions = tuple(k for k, leaf in enumerate(leaves) if is_matrix(leaf))
    entries = [leaves[k] for k in positions]
    cores = tuple(
      tuple(x.ndim - len(batch_shapes[group[0]]) for x in jax.tree.leaves(entries[group[0]]))
      for group in groups
    )
    layout = MatrixLayout(
      treedef,
      positions,
      tuple(tuple(group) for group in groups),
      tuple(tuple(shape) for shape in batch_shapes),
      cores,
    )
    return cls._from_list(layout, entries)

  @classmethod
  def _from_list(cls, layout: MatrixLayout, entries: list) -> "GroupedMoments":
    groups = tuple(
      layout.stack(g, [entries[i] for i in group], list(group))
      for g, group in enumerate(layout.groups)
    )
    return cls(groups, layout)

  def leaves_of(self, tree: Any) -> list:
    """The leaves of ``tree`` (like the params) at the matrices, in leaf order."""
    leaves = self.layout.treedef.flatten_up_to(tree)
    return [leaves[k] for k in self.layout.matrices]

  def tree_of(self, entries: list) -> Any:
    """Inverse of :meth:`leaves_of`: a tree like the params holding ``entries`` at the
    matrices, ``optax.MaskedNode`` elsewhere."""
    leaves = [optax.MaskedNode()] * self.layout.treedef.num_leaves
    for k, entry in zip(self.layout.matrices, entries, strict=True):
      leaves[k] = entry
    return jax.tree.unflatten(self.layout.treedef, leaves)

  def _entries(self, g: int, only=None) -> dict[int, Any]:
    """The state of every matrix of group ``g`` (of those in ``only``, if given), by
    index: slices of its stack."""
    members = list(self.layout.groups[g])
    only = members if only is None else list(only)
    return dict(zip(only, self.layout.unstack(g, self.groups[g], members, only), strict=True))

  def listed(self) -> list:
    """Every matrix's state, in leaf order (slices of the stacks)."""
    entries = {}
    for g in range(len(self.groups)):
      entries.update(self._entries(g))
    return [entries[i] for i in range(len(self.layout.matrices))]

  def with_listed(self, entries: list) -> "GroupedMoments":
    """Inverse of :meth:`listed`: the matrices' states ``entries`` stored."""
    return self._from_list(self.layout, list(entries))

  def matrices(self) -> Any:
    """The state per matrix: a tree like the params, ``optax.MaskedNode`` at the leaves
    that are not low-rank matrices."""
    return self.tree_of(self.listed())

  def with_matrices(self, tree: Any) -> "GroupedMoments":
    """Inverse of :meth:`matrices`: the state per matrix ``tree`` stored per group."""
    return self.with_listed(self.leaves_of(tree))

  def map_groups(self, fn) -> "GroupedMoments":
    """``fn`` (elementwise in the matrices) applied to every group's stacked state."""
    return GroupedMoments(tuple(fn(group) for group in self.groups), self.layout)

  def take(self, indices: list[int]) -> Any:
    """The state of the matrices ``indices`` (of one group, in its order) stacked as a
    group stores them: a whole group's own stack, else its slices stacked."""
    g = self.layout.group_of(indices[0])
    if tuple(indices) == self.layout.groups[g]:
      return self.groups[g]
    entries = self._entries(g, indices)
    return self.layout.stack(g, [entries[i] for i in indices], list(indices))

  def put(self, parts: dict[tuple[int, ...], Any]) -> "GroupedMoments":
    """The state with ``parts`` (indices of matrices of one group -> their state as
    :meth:`take` gives it) put in; a whole group's part becomes its stack as it is, a
    group given in parts is stacked again from its matrices' slices."""
    groups = list(self.groups)
    pending: dict[int, dict[int, Any]] = {}
    for indices, part in parts.items():
      g = self.layout.group_of(indices[0])
      if indices == self.layout.groups[g]:
        groups[g] = part
        continue
      new = self.layout.unstack(g, part, list(indices))
      pending.setdefault(g, {}).update(zip(indices, new, strict=True))
    for g, new in pending.items():
      members = list(self.layout.groups[g])
      old = self._entries(g, [i for i in members if i not in new])
      groups[g] = self.layout.stack(g, [new[i] if i in new else old[i] for i in members], members)
    return GroupedMoments(tuple(groups), self.layout)
