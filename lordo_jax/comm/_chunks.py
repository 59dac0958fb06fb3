"""A message sent in equal chunks, one per step, each a counted, unconditional collective.

The building block of overlapped synchronisation (MATH.md §9): :func:`freeze` lays a
tree out as one ``chunks x size`` buffer, :func:`chunk_mean` averages one row of it,
and :func:`thaw` turns the averaged buffer back into the tree. Every chunk has the same
shape, so one compiled program sends any of them.
"""

import math
from typing import Any

import jax
import jax.numpy as jnp

from lordo_jax.comm import _collectives as collectives


def chunk_size(tree: Any, chunks: int) -> int:
  """Elements per chunk of ``tree`` cut into ``chunks``: its size over ``chunks``, rounded
  up (the last chunk is padded with zeros)."""
  total = sum(math.prod(x.shape) for x in jax.tree.leaves(tree))
  return max(1, -(-total // chunks))


def freeze(tree: Any, chunks: int) -> jax.Array:
  r"""``tree`` as a float32 ``chunks x size`` buffer: its leaves raveled in order and
  concatenated, zero-padded to ``chunks * size`` (:func:`chunk_size`).

  Chunk j is row j: a contiguous slice of the message, so the mean of the chunks is
  the chunks of the mean, element by element, whatever the split.
  """
  flat = [jnp.ravel(x).astype(jnp.float32) for x in jax.tree.leaves(tree)]
  size = chunk_size(tree, chunks)
  buffer = jnp.concatenate([*flat, jnp.zeros((0,), jnp.float32)])
  buffer = jnp.pad(buffer, (0, chunks * size - buffer.shape[0]))
  return buffer.reshape(chunks, size)


def thaw(buffer: jax.Array, like: Any) -> Any:
  """The inverse of :func:`freeze`: a tree shaped and typed like ``like``."""
  leaves, treedef = jax.tree.flatten(like)
  flat, start, out = buffer.reshape(-1), 0, []
  for x in leaves:
    n = math.prod(x.shape)
    out.append(flat[start : start + n].reshape(x.shape).astype(x.dtype))
    start += n
  return jax.tree.unflatten(treedef, out)


def chunk_mean(
  buffer: jax.Array,
  index: jax.Array,
  ledger: collectives.Ledger,
  axis_name: str | None,
  *,
  compression_codec: str | None = None,
  residual: jax.Array | None = None,
):
  r"""The workers' mean of chunk ``index`` of ``buffer``, in one counted collective.

  .. math::
    \bar C_j = \mathrm{pmean}_m(B_m[j])

  ``index`` may be traced (the step's position in the round): the collective is the
  same at every step, outside any conditional, and its operand is a slice of
  ``buffer``, so when ``buffer`` is carried in the state the collective depends on
  nothing the step computes and may run under its compute. With a codec the chunk is
  sent as :func:`lordo_jax.comm._collectives.counted_mean` sends a leaf, its error
  feedback in row ``index`` of ``residual`` (the scales follow the chunk's rows).

  Returns:
    ``(mean chunk, ledger, residual)``: the chunk is ``buffer``'s row shape.
  """
  row = jax.lax.dynamic_index_in_dim(buffer, index, keepdims=False)
  own = None if residual is None else jax.lax.dynamic_index_in_dim(residual, index, keepdims=False)
  mean, ledger, own = collectives.counted_mean(
    row, ledger, axis_name, compression_codec=compression_codec, residual=own
  )
  if residual is not None:
    residual = jax.lax.dynamic_update_index_in_dim(residual, own, index, 0)
  return mean, ledger, residual
