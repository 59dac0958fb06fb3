r"""Codecs for compressed synchronisation: what a worker's message becomes on the wire.

A compressed mean (:func:`lordo_jax.comm._collectives.counted_mean`) sends each leaf as a
``R x C`` block of rows (:func:`as_rows`, undone by :func:`from_rows`), encoded by one of
the :data:`CODECS` (:func:`encode`, :func:`decode`); :data:`MOMENT_CODECS` is the codec of
the moments. Everything here is local arithmetic: no communication, no state.
"""

import math

import jax
import jax.numpy as jnp

CODECS = ("bfloat16", "int8")
INT8_MAX = 127.0
# The codec of the moments, per compression of a sync. Linear int8 rounds every entry
# under 1/254 of its row's largest to zero: a first moment of 0 where the gradient is
# small stops Adam there (u / sqrt(v) is O(1) for small and large gradients alike),
# and rounding the second moment up instead only trades that for steps shrunk by up
# to 127x. bfloat16 keeps relative precision at every magnitude.
MOMENT_CODECS = {"bfloat16": "bfloat16", "int8": "bfloat16"}


def as_rows(x: jax.Array, num_workers: int) -> tuple[jax.Array, tuple]:
  """``x`` as a float32 ``R x C`` block with R a multiple of ``num_workers``.

  A leaf with at least two axes and at least ``num_workers`` rows keeps its rows
  (``shape[0] x prod(shape[1:])``); any other leaf is flattened into
  ``num_workers`` rows. Rows are zero-padded to a multiple of ``num_workers``, so the
  block splits into one equal shard per worker.

  Returns:
    ``(rows, row_layout)``: the block, and what :func:`from_rows` needs to undo it.
  """
  shape = tuple(x.shape)
  x = x.astype(jnp.float32)
  keeps_rows = x.ndim >= 2 and shape[0] >= num_workers
  if keeps_rows:
    rows = x.reshape(shape[0], -1)
  else:
    flat = x.reshape(-1)
    width = max(1, -(-flat.size // num_workers))
    rows = jnp.pad(flat, (0, width * num_workers - flat.size)).reshape(num_workers, width)
  padding = -rows.shape[0] % num_workers
  return jnp.pad(rows, ((0, padding), (0, 0))), (shape, keeps_rows)


def from_rows(rows: jax.Array, row_layout: tuple) -> jax.Array:
  """Inverse of :func:`as_rows`: the float32 leaf a block stands for."""
  shape, keeps_rows = row_layout
  if keeps_rows:
    return rows[: shape[0]].reshape(shape)
  return rows.reshape(-1)[: math.prod(shape)].reshape(shape)


def encode(rows: jax.Array, codec: str):
  r"""``rows`` (float32, ``... x C``) as ``(values, scales)``; scales are per row.

  The codecs (:data:`CODECS`):

  * ``"bfloat16"``: each value rounded to bfloat16 (2 bytes, relative error
    :math:`2^{-9}`); ``scales`` is ``None``;
  * ``"int8"``: each row scaled by its own float32 scale
    :math:`s_i = \max_j |x_{ij}| / 127` and rounded,
    :math:`q_{ij} = \mathrm{round}(x_{ij} / s_i) \in [-127, 127]` (1 byte per value
    plus 4 bytes per row); decoded (:func:`decode`) as :math:`q_{ij} s_i`.

  int8 keeps absolute precision (a step of :math:`\max_j |x_{ij}| / 127` per row): right
  for a pseudo-gradient, whose rounding error feedback carries into the next round, but
  not for Adam's moments, which are divided by each other and have no error feedback.
  A synchronisation compressed to int8 therefore sends its moments in bfloat16
  (:data:`MOMENT_CODECS`).
  """
  if codec == "bfloat16":
    return rows.astype(jnp.bfloat16), None
  if codec != "int8":
    raise ValueError(f"compression={codec!r} is not one of {CODECS}.")
  scales = jnp.max(jnp.abs(rows), axis=-1) / INT8_MAX
  safe = jnp.where(scales > 0, scales, 1.0)[..., None]
  values = jnp.clip(jnp.round(rows / safe), -INT8_MAX, INT8_MAX)
  return values.astype(jnp.int8), scales


def decode(values: jax.Array, scales: jax.Array | None):
  """The float32 rows a ``(values, scales)`` pair stands for."""
  if scales is None:
    return values.astype(jnp.float32)
  return values.astype(jnp.float32) * scales[..., None]
