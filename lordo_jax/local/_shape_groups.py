"""Matrices of one shape and layout, stacked: one batched computation per group.

:func:`groups` partitions a list of matrices (each ``(*batch, p, q)``) by shape, layout
and dtype (a refresh's groups); :func:`step_groups` those of a local step, which depend
on the platform; :func:`stack` puts a group's entries (trees whose leaves lead with their
matrix's batch axes) along one leading axis, and :func:`unstack` takes them apart.
"""

import math
from typing import Any

import jax
import jax.numpy as jnp

from lordo_jax import _sharded as sharded


def _key(index: int, matrix: jax.Array) -> tuple:
  """What must agree for two matrices to share a batch: their ``p x q`` shape, dtype and
  split; a matrix whose batch axes are split over a mesh axis stays alone (stacking it
  would move it across devices)."""
  spec = sharded.spec_of(matrix)
  alone = index if any(axes is not None for axes in spec[:-2]) else None
  return matrix.shape[-2:], jnp.dtype(matrix.dtype).name, spec[-2:], alone


def groups(matrices: list[jax.Array]) -> list[list[int]]:
  """The indices of ``matrices`` that can be stacked together, in order of appearance."""
  found: dict[tuple, list[int]] = {}
  for i, matrix in enumerate(matrices):
    found.setdefault(_key(i, matrix), []).append(i)
  return list(found.values())


# Platforms whose local step keeps one group per matrix. On a CPU a kernel launch costs
# nothing and stacking the gradients costs as much as the products it batches (12 of
# GPT-2 small's 768 x 3072 gradients, 2 cores: 48 ms to stack, 37 ms to project one by
# one, 40 batched); on a GPU each matrix's 5 to 6 kernels cost a launch each.
PER_MATRIX_STEP_PLATFORMS = ("cpu",)


def step_groups(matrices: list[jax.Array]) -> list[list[int]]:
  """The groups a local step projects and steps at once: :func:`groups` on an
  accelerator, one matrix each on a platform of :data:`PER_MATRIX_STEP_PLATFORMS`."""
  if jax.default_backend() in PER_MATRIX_STEP_PLATFORMS:
    return [[i] for i in range(len(matrices))]
  return groups(matrices)


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
