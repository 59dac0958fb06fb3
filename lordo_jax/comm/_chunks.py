"""A message sent in equal chunks, one per step, each a counted, unconditional collective.

The building block of overlapped synchronisation (MATH.md §9): :func:`freeze` lays
each part of a message (a tree) out as a ``chunks x width`` buffer in the part's own
dtype (:func:`dtype_of`), :func:`chunk_mean` averages one row of every buffer (each
part with its own codec), and :func:`thaw` turns the averaged buffers back into the
trees. Every chunk has the same shapes, so one program sends any of them.
"""

import math
from typing import Any

import jax
import jax.numpy as jnp

from lordo_jax import _sharded as sharded
from lordo_jax.comm import _collectives as collectives


def chunk_size(tree: Any, chunks: int) -> int:
  """Elements per chunk of ``tree`` cut into ``chunks``: its size over ``chunks``, rounded
  up (the last chunk is padded with zeros)."""
  total = sum(math.prod(x.shape) for x in jax.tree.leaves(tree))
  return max(1, -(-total // chunks))


def widths(parts: tuple, chunks: int) -> tuple[int, ...]:
  """Each part's columns in a buffer of ``chunks`` rows (:func:`chunk_size`; 0 for a
  part with no leaves)."""
  return tuple(chunk_size(p, chunks) if jax.tree.leaves(p) else 0 for p in parts)


def dtype_of(tree: Any) -> jnp.dtype:
  """The dtype a part travels in: its leaves' (the widest of them where they differ,
  ``jnp.result_type``), as a mean of the tree itself sends them; float32 for a part
  with no floating leaf."""
  dtypes = [x.dtype for x in jax.tree.leaves(tree)]
  dtype = jnp.result_type(*dtypes) if dtypes else jnp.dtype(jnp.float32)
  return dtype if jnp.issubdtype(dtype, jnp.floating) else jnp.dtype(jnp.float32)


def _rows(tree: Any, chunks: int, width: int, dtype) -> jax.Array:
  """One tree as a ``chunks x width`` block of ``dtype``: its ``chunks x chunk_size``
  rows, zero-padded, and zero columns up to ``width``; a leaf split over ``Explicit``
  axes inside the worker is made whole there first (the group's fast links)."""
  flat = [jnp.ravel(sharded.whole(x)).astype(dtype) for x in jax.tree.leaves(tree)]
  size = chunk_size(tree, chunks)
  buffer = jnp.concatenate([*flat, jnp.zeros((0,), dtype)])
  rows = jnp.pad(buffer, (0, chunks * size - buffer.shape[0])).reshape(chunks, size)
  return jnp.pad(rows, ((0, 0), (0, width - size)))


def freeze(
  parts: tuple, chunks: int, columns: tuple | None = None, split_like=None, dtypes=None
) -> tuple:
  r"""The trees ``parts`` as ``chunks x width`` buffers, one per part in its dtype.

  Each part's leaves are raveled in order, concatenated and zero-padded to a multiple
  of ``chunks`` (:func:`chunk_size`), and cut into ``chunks`` rows of its buffer
  (``None`` for a part of no columns). Chunk j, row j of every buffer, is the j-th
  contiguous slice of every part, so the mean of the chunks is the chunks of the mean,
  element by element, whatever the split, and a part's slice is the same elements in
  every round (a codec's residual follows them).

  A part's buffer is in ``dtypes``' entry for it (``None`` or no ``dtypes``: the part's
  :func:`dtype_of`, that of its leaves in ``split_like``): a bfloat16 model's
  pseudo-gradient is held, and sent, in bfloat16 as section 4's round sends it, its
  float32 moments in float32.

  ``columns`` gives each part's buffer a width of its own (at least its
  :func:`widths`; the extra columns are zeros): the fragments of a streamed message
  share buffers laid out for the widest of them. ``split_like`` (default: ``parts``)
  are the trees whose leaves' sharding decides how the buffers' columns are split
  (:func:`_split_columns`), the same for every fragment.
  """
  columns = widths(parts, chunks) if columns is None else columns
  split_like = parts if split_like is None else split_like
  given = (None,) * len(parts) if dtypes is None else dtypes
  dtypes = [dtype_of(like) if d is None else d for d, like in zip(given, split_like, strict=True)]
  leaves = jax.tree.leaves(split_like)
  return tuple(
    _split_columns(_rows(p, chunks, w, d), leaves) if w else None
    for p, w, d in zip(parts, columns, dtypes, strict=True)
  )


def _split_columns(buffer: jax.Array, leaves: list) -> jax.Array:
  """``buffer``'s columns split over the ``Explicit`` mesh axes its leaves are split over
  inside the worker (FSDP, TP), where they divide evenly: the message in flight takes
  1/F of a device's memory, as its parameters do, and each device sends its columns of
  a chunk. Whole otherwise."""
  split_leaves = [x for x in leaves if isinstance(x, jax.Array) and sharded.is_sharded(x)]
  if not split_leaves:
    return buffer
  mesh = jax.typeof(split_leaves[0]).sharding.mesh
  used = {a for x in split_leaves for axes in sharded.spec_of(x) if axes for a in _names(axes)}
  names = tuple(a for a in mesh.axis_names if a in used)
  if buffer.shape[1] % math.prod(mesh.shape[a] for a in names):
    return buffer
  return sharded.place(buffer, (None, names), split_leaves[0])


def _names(axes) -> tuple:
  return axes if isinstance(axes, tuple) else (axes,)


def _thaw_one(block: jax.Array | None, like: Any) -> Any:
  leaves, treedef = jax.tree.flatten(like)
  start, out = 0, []
  if leaves:  # Row-major: the part's elements, then the padding of its rows.
    block = block[:, : chunk_size(like, block.shape[0])].reshape(-1)
  for x in leaves:
    n = math.prod(x.shape)
    value = block[start : start + n].reshape(x.shape).astype(x.dtype)
    out.append(sharded.like(value, x) if isinstance(x, jax.Array) else value)
    start += n
  return jax.tree.unflatten(treedef, out)


def thaw(buffers: tuple, likes: tuple) -> tuple:
  """The inverse of :func:`freeze`: trees shaped, typed and split like ``likes``, one
  per buffer (a part's leaves are its buffer's first columns, whatever its width)."""
  return tuple(
    _thaw_one(None if b is None else sharded.whole(b), like)
    for b, like in zip(buffers, likes, strict=True)
  )


def row(buffers: Any, index: jax.Array, *, to_device: bool = False) -> Any:
  """Row ``index`` (traced or not) of every buffer of ``buffers`` (an array, or a tuple
  of :func:`freeze`'s); with ``to_device`` moved into device memory (buffers kept in
  host memory send one row a step)."""
  out = jax.tree.map(lambda b: jax.lax.dynamic_index_in_dim(b, index, keepdims=False), buffers)
  return jax.device_put(out, jax.memory.Space.Device) if to_device else out


def with_row(buffers: Any, values: Any, index: jax.Array, *, to_host: bool = False) -> Any:
  """``buffers`` with row ``index`` of each replaced by ``values`` (the same structure),
  moved into host memory first with ``to_host`` (where buffers kept there live)."""
  if to_host:
    values = jax.device_put(values, jax.memory.Space.Host)
  return jax.tree.map(
    lambda b, v: jax.lax.dynamic_update_index_in_dim(b, v, index, 0), buffers, values
  )


def chunk_mean(
  chunk: tuple,
  ledger: collectives.Ledger,
  axis_name: str | None,
  *,
  codecs: tuple = (),
  residual: jax.Array | None = None,
):
  r"""The workers' mean of one chunk (a row of each :func:`freeze` buffer), counted.

  .. math::
    \bar C_j = \mathrm{pmean}_m(B_m[j])

  Taken from buffers carried in the state at a traced index (:func:`row`), the chunk
  is the same shapes at every step and depends on nothing the step computes, so its
  collectives, outside any conditional, may run under the step's compute. Without a
  codec the chunk is one counted all-reduce of its parts, each in its buffer's dtype
  (as :func:`lordo_jax.comm._collectives.counted_pmean` sends a tree: a bfloat16 part
  travels, and is averaged, in bfloat16). With ``codecs``, one per part of the chunk,
  each part is sent as :func:`lordo_jax.comm._collectives.counted_mean` sends a leaf
  (the scales follow the part's rows), one part after the other; ``residual`` is the
  first part's error feedback.

  Returns:
    ``(mean chunk, ledger, residual)``: the mean a tuple like ``chunk``.
  """
  if not any(codecs):
    mean, ledger = collectives.counted_pmean(tuple(chunk), ledger, axis_name)
    return mean, ledger, residual
  means, sent = [], None
  for i, (piece, codec) in enumerate(zip(chunk, codecs, strict=True)):
    if piece is None:
      means.append(None)
      continue
    if sent is not None:  # One collective at a time (see counted_mean).
      piece, _ = jax.lax.optimization_barrier((piece, sent))
    sent, ledger, fed = collectives.counted_mean(
      piece, ledger, axis_name, compression_codec=codec, residual=residual if i == 0 else None
    )
    residual = fed if i == 0 else residual
    means.append(sent)
  return tuple(means), ledger, residual
