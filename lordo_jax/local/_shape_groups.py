"""Matrices of one shape and layout, stacked: a refresh is one batched computation per group.

:func:`groups` partitions a list of matrices (each ``(*batch, p, q)``) by shape, layout
and dtype; :func:`stack` puts a group's entries (trees whose leaves lead with their
matrix's batch axes) along one leading axis, and :func:`unstack` takes them apart.
"""

import math
from typing import Any

import jax
import jax.numpy as jnp

from lordo_jax.local.bases import layout


def _key(index: int, matrix: jax.Array) -> tuple:
  """What must agree for two matrices to share a batch: their ``p x q`` shape, dtype and
  split; a matrix whose batch axes are split over a mesh axis stays alone (stacking it
  would move it across devices)."""
  spec = layout.spec_of(matrix)
  alone = index if any(axes is not None for axes in spec[:-2]) else None
  return matrix.shape[-2:], jnp.dtype(matrix.dtype).name, spec[-2:], alone


def groups(matrices: list[jax.Array]) -> list[list[int]]:
  """The indices of ``matrices`` that can be stacked together, in order of appearance."""
  found: dict[tuple, list[int]] = {}
  for i, matrix in enumerate(matrices):
    found.setdefault(_key(i, matrix), []).append(i)
  return list(found.values())


def stack(entries: list[Any], batch_shapes: list[tuple[int, ...]]) -> Any:
  """The trees ``entries`` (alike in structure; each leaf leads with its entry's batch
  shape) as one tree whose leaves lead with one axis of all their matrices."""

  def flat(tree, batch_shape):
    return jax.tree.map(
      lambda x: jnp.reshape(x, (math.prod(batch_shape), *x.shape[len(batch_shape) :])), tree
    )

  flattened = [flat(tree, shape) for tree, shape in zip(entries, batch_shapes, strict=True)]
  if len(flattened) == 1:
    return flattened[0]
  return jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=0), *flattened)


def unstack(tree: Any, batch_shapes: list[tuple[int, ...]]) -> list[Any]:
  """Inverse of :func:`stack`: one tree per entry, its leaves leading with its batch shape."""
  entries, start = [], 0
  for shape in batch_shapes:
    size = math.prod(shape)

    def part(x, start=start, size=size, shape=shape):
      return jnp.reshape(x[start : start + size], (*shape, *x.shape[1:]))

    entries.append(jax.tree.map(part, tree))
    start += size
  return entries
