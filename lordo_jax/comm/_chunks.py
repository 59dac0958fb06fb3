"""A message sent in equal chunks, one per step, each a counted, unconditional collective.

The building block of overlapped synchronisation (MATH.md §9): :func:`freeze` lays
trees out as one ``chunks x width`` buffer, :func:`chunk_mean` averages one row of it
(each part of the row with its own codec), and :func:`thaw` turns the averaged buffer
back into the trees. Every chunk has the same shape, so one program sends any of them.
"""

import math
from typing import Any

import jax
import jax.numpy as jnp

from lordo_jax.comm import _collectives as collectives
from lordo_jax.local.bases import layout


def chunk_size(tree: Any, chunks: int) -> int:
  """Elements per chunk of ``tree`` cut into ``chunks``: its size over ``chunks``, rounded
  up (the last chunk is padded with zeros)."""
  total = sum(math.prod(x.shape) for x in jax.tree.leaves(tree))
  return max(1, -(-total // chunks))


def widths(parts: tuple, chunks: int) -> tuple[int, ...]:
  """Each part's columns in a buffer of ``chunks`` rows (:func:`chunk_size`; 0 for a
  part with no leaves)."""
  return tuple(chunk_size(p, chunks) if jax.tree.leaves(p) else 0 for p in parts)


def _rows(tree: Any, chunks: int, width: int) -> jax.Array:
  """One tree as a float32 ``chunks x width`` block: its ``chunks x chunk_size`` rows,
  zero-padded, and zero columns up to ``width``; a leaf split over ``Explicit`` axes
  inside the worker is made whole there first (the group's fast links)."""
  flat = [jnp.ravel(layout.whole(x)).astype(jnp.float32) for x in jax.tree.leaves(tree)]
  size = chunk_size(tree, chunks)
  buffer = jnp.concatenate([*flat, jnp.zeros((0,), jnp.float32)])
  rows = jnp.pad(buffer, (0, chunks * size - buffer.shape[0])).reshape(chunks, size)
  return jnp.pad(rows, ((0, 0), (0, width - size)))


def freeze(parts: tuple, chunks: int, columns: tuple | None = None, split_like=None):
  r"""The trees ``parts`` as one float32 ``chunks x width`` buffer.

  Each part's leaves are raveled in order, concatenated and zero-padded to a multiple
  of ``chunks`` (:func:`chunk_size`), and cut into ``chunks`` rows; the parts' blocks
  sit side by side (:func:`widths`). Chunk j, row j, is the j-th contiguous slice of
  every part, so the mean of the chunks is the chunks of the mean, element by element,
  whatever the split, and a part's slice is the same elements in every round (a
  codec's residual follows them).

  ``columns`` gives each part's block a width of its own (at least its :func:`widths`;
  the extra columns are zeros): the fragments of a streamed message share one buffer
  laid out for the widest of them. ``split_like`` (default: the leaves of ``parts``)
  are the leaves whose sharding decides how the buffer's columns are split
  (:func:`_split_columns`), the same for every fragment.
  """
  columns = widths(parts, chunks) if columns is None else columns
  blocks = [_rows(p, chunks, w) for p, w in zip(parts, columns, strict=True) if w]
  buffer = jnp.concatenate([*blocks, jnp.zeros((chunks, 0), jnp.float32)], axis=1)
  return _split_columns(buffer, jax.tree.leaves(parts if split_like is None else split_like))


def _split_columns(buffer: jax.Array, leaves: list) -> jax.Array:
  """``buffer``'s columns split over the ``Explicit`` mesh axes its leaves are split over
  inside the worker (FSDP, TP), where they divide evenly: the message in flight takes
  1/F of a device's memory, as its parameters do, and each device sends its columns of
  a chunk. Whole otherwise."""
  sharded = [x for x in leaves if isinstance(x, jax.Array) and layout.is_sharded(x)]
  if not sharded:
    return buffer
  mesh = jax.typeof(sharded[0]).sharding.mesh
  used = {a for x in sharded for axes in layout.spec_of(x) if axes for a in _names(axes)}
  names = tuple(a for a in mesh.axis_names if a in used)
  if buffer.shape[1] % math.prod(mesh.shape[a] for a in names):
    return buffer
  return layout.place(buffer, (None, names), sharded[0])


def _names(axes) -> tuple:
  return axes if isinstance(axes, tuple) else (axes,)


def _thaw_one(block: jax.Array, like: Any) -> Any:
  leaves, treedef = jax.tree.flatten(like)
  flat, start, out = block.reshape(-1), 0, []
  for x in leaves:
    n = math.prod(x.shape)
    value = flat[start : start + n].reshape(x.shape).astype(x.dtype)
    out.append(layout.like(value, x) if isinstance(x, jax.Array) else value)
    start += n
  return jax.tree.unflatten(treedef, out)


def thaw(buffer: jax.Array, likes: tuple, columns: tuple | None = None) -> tuple:
  """The inverse of :func:`freeze` (with the same ``columns``): trees shaped, typed and
  split like ``likes``."""
  buffer, out, start = layout.whole(buffer), [], 0
  chunks = buffer.shape[0]
  columns = widths(likes, chunks) if columns is None else columns
  for like, used, width in zip(likes, widths(likes, chunks), columns, strict=True):
    out.append(_thaw_one(buffer[:, start : start + used], like))
    start += width
  return tuple(out)


def row(buffer: jax.Array, index: jax.Array, *, to_device: bool = False) -> jax.Array:
  """Row ``index`` (traced or not) of ``buffer``; with ``to_device`` moved into device
  memory (a buffer kept in host memory sends one row a step)."""
  out = jax.lax.dynamic_index_in_dim(buffer, index, keepdims=False)
  return jax.device_put(out, jax.memory.Space.Device) if to_device else out


def with_row(buffer: jax.Array, value: jax.Array, index: jax.Array, *, to_host: bool = False):
  """``buffer`` with row ``index`` replaced by ``value``, moved into host memory first
  with ``to_host`` (where a buffer kept there lives)."""
  if to_host:
    value = jax.device_put(value, jax.memory.Space.Host)
  return jax.lax.dynamic_update_index_in_dim(buffer, value, index, 0)


def chunk_mean(
  chunk: jax.Array,
  ledger: collectives.Ledger,
  axis_name: str | None,
  *,
  codecs: tuple = (),
  parts: tuple[int, ...] = (),
  residual: jax.Array | None = None,
):
  r"""The workers' mean of one chunk (a row of a :func:`freeze` buffer), counted.

  .. math::
    \bar C_j = \mathrm{pmean}_m(B_m[j])

  Taken from a buffer carried in the state at a traced index (:func:`row`), the chunk
  is the same shape at every step and depends on nothing the step computes, so its
  collectives, outside any conditional, may run under the step's compute. Without a
  codec the chunk is one all-reduce. With ``codecs``, one per part of the chunk
  (``parts``, its :func:`widths`), each part is sent as
  :func:`lordo_jax.comm._collectives.counted_mean` sends a leaf (the scales follow the
  part's rows), one part after the other; ``residual`` is the first part's error
  feedback.

  Returns:
    ``(mean chunk, ledger, residual)``.
  """
  if not any(codecs):
    mean, ledger = collectives.counted_pmean(chunk, ledger, axis_name)
    return mean, ledger, residual
  means, start = [], 0
  for i, (width, codec) in enumerate(zip(parts, codecs, strict=True)):
    if not width:
      continue
    piece = chunk[start : start + width]
    if means:  # One collective at a time (see counted_mean).
      piece, _ = jax.lax.optimization_barrier((piece, means[-1]))
    mean, ledger, fed = collectives.counted_mean(
      piece, ledger, axis_name, compression_codec=codec, residual=residual if i == 0 else None
    )
    residual = fed if i == 0 else residual
    means.append(mean)
    start += width
  return jnp.concatenate(means), ledger, residual
