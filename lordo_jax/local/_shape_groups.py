"""Matrices of one shape and layout, stacked: one batched computation per group.

:func:`groups` partitions a list of matrices (each ``(*batch, p, q)``) by shape, layout
and dtype (the groups a low-rank state is stored in); :func:`step_grouped` computes a
local step with the grouping of the platform the program is compiled for; :func:`stack`
puts a group's entries (trees whose leaves lead with their matrix's batch axes) along one
leading axis, and :func:`unstack` takes them apart.
"""

import math
from collections.abc import Callable
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
# next to nothing and stacking the gradients (a copy of each) costs about as much as the
# products it batches, so batching buys nothing there; on a GPU each of a matrix's few
# kernels costs a launch. The timings are in BENCHMARKS.md, "Speed on a GPU: the refresh
# and the step".
PER_MATRIX_STEP_PLATFORMS = ("cpu",)

# The grouping every local step takes whatever it is compiled for, while set: "per_matrix"
# or "batched" (a benchmark or a test comparing the two on one platform); None, the
# default: the compile target's (:func:`step_grouped`). Read when a step is traced.
FORCED_STEP_GROUPING: str | None = None


def step_grouped(batched: list[list[int]], step: Callable[[list[list[int]]], Any]) -> Any:
  """``step(groups)``, the local step of the matrices that ``batched`` groups (their
  shape groups, :func:`groups`) computed with ``groups`` the indices stepped at once: one
  matrix each on a platform of :data:`PER_MATRIX_STEP_PLATFORMS`, ``batched`` on any
  other.

  The platform is the one the program is lowered for, not the host's: a GPU program
  compiled on a CPU host (deviceless ahead-of-time compilation) is batched. The step is
  traced once per grouping and :func:`jax.lax.platform_dependent` keeps the target's at
  lowering, so each grouping must give the same tree. Where the two groupings are one
  (no two matrices share a group), or :data:`FORCED_STEP_GROUPING` names one, the step is
  traced once, with no choice in the program.
  """
  per_matrix = [[i] for group in batched for i in group]
  per_matrix.sort()
  if FORCED_STEP_GROUPING is not None:
    return step({"per_matrix": per_matrix, "batched": batched}[FORCED_STEP_GROUPING])
  if batched == per_matrix:
    return step(batched)

  def one_each():  # One function for every platform named: one branch, traced once.
    return step(per_matrix)

  per_platform = dict.fromkeys(PER_MATRIX_STEP_PLATFORMS, one_each)
  return jax.lax.platform_dependent(default=lambda: step(batched), **per_platform)


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
