r"""A message sent in compressed chunks, in float64 NumPy (MATH.md §9, "Chunks and codecs").

Shared by the references of a message in flight (``overlap_reference`` for SGD and Adam
on whole leaves, ``lordo_overlap_reference`` for LoRDO): each gives a worker's message
as its parts, 1-D arrays, and :func:`chunked_means` sends them.

A part of n values is zero-padded to ``chunks x c`` (c = max(1, ceil(n / chunks))),
cut into ``chunks`` rows, and given zero columns up to its width (the widest
fragment's c). Chunk j is row j of every part. A part's row is sent as a compressed
mean (:func:`compressed_mean`): the first part (the pseudo-gradient) with its
residual row fed in and replaced, the others (the moments) without feedback. A
residual row is read and written only by chunk j of one fragment, so sending every
chunk of a message at its landing gives the values of sending them one a step.
"""

import numpy as np

MOMENT_CODEC = "bfloat16"  # the moments' codec for both compressions (MOMENT_CODECS)


def columns(n: int, chunks: int) -> int:
  """c = max(1, ceil(n / chunks)): the columns of a part of n values."""
  return max(1, -(-n // chunks))


def chunked_means(messages, chunks, widths, codecs, residuals, first_row) -> tuple:
  """The decoded means of the workers' ``messages``, chunk by chunk, and the new residuals.

  ``messages[m][i]``: worker m's part i (1-D, the same size for every worker);
  ``widths[i]``: part i's columns; ``codecs[i]``: its codec. ``residuals[m]``: worker
  m's residual rows of part 0 (``rows x widths[0]``), row ``first_row + j`` that of
  chunk j. Returns ``(means, residuals)``: each part's mean (1-D), and new residual
  arrays (the old ones are left as they were).
  """
  residuals = [r.copy() for r in residuals]
  means = []
  for i, (width, codec) in enumerate(zip(widths, codecs, strict=True)):
    blocks = np.array([_block(msg[i], chunks, width) for msg in messages])  # worker, row, col
    mean = np.zeros((chunks, width))
    for j in range(chunks):
      if i == 0:
        own = np.array([r[first_row + j] for r in residuals])
        mean[j], fed = compressed_mean(blocks[:, j], own, codec)
        for r, e in zip(residuals, fed, strict=True):
          r[first_row + j] = e
      else:
        mean[j], _ = compressed_mean(blocks[:, j], None, codec)
    n = messages[0][i].size
    means.append(mean[:, : columns(n, chunks)].reshape(-1)[:n])
  return means, residuals


def _block(x: np.ndarray, chunks: int, width: int) -> np.ndarray:
  """``x`` (1-D, n values) zero-padded to ``chunks x c``, cut into rows, and zero
  columns up to ``width``."""
  c = columns(x.size, chunks)
  rows = np.pad(x, (0, chunks * c - x.size)).reshape(chunks, c)
  return np.pad(rows, ((0, 0), (0, width - c)))


def compressed_mean(pieces: np.ndarray, residuals, codec: str) -> tuple:
  r"""The mean of the workers' ``pieces`` (M x n) sent with ``codec``, and with
  ``residuals`` (M x n, or None: no feedback) the new residuals.

  Worker m sends y_m = x_m + e_m as M rows of w = ceil(n / M) values (zero-padded),
  Y_m; worker r averages the decoded rows r, S_r = mean_m dec(enc(Y_m[r])), and every
  worker decodes S'_r = dec(enc(S_r)): the mean is the rows S' raveled, its first n.
  The new residual is e'_m = Y_m - dec(enc(Y_m)) + M [r = m] (S_r - S'_r), so that
  nothing is lost over the sends. The codec and the mean act on float32 values.
  """
  m, n = pieces.shape
  width = max(1, -(-n // m))
  target = pieces if residuals is None else pieces + residuals
  rows = np.zeros((m, m * width), np.float32)
  rows[:, :n] = target
  rows = rows.reshape(m, m, width)  # worker, row, column
  sent = _decoded(rows, codec)
  shard = np.mean(sent.astype(np.float64), axis=0).astype(np.float32)  # row r: worker r's
  mean = _decoded(shard, codec)
  error = rows - sent.astype(np.float64)
  error = error + m * np.eye(m)[:, :, None] * (shard - mean.astype(np.float64))[None]
  new = None if residuals is None else error.reshape(m, -1)[:, :n]
  return mean.reshape(-1)[:n].astype(np.float64), new


def leaf_mean(leaves: np.ndarray, codec: str) -> np.ndarray:
  """The mean of the workers' ``leaves`` (M x leaf shape) sent with ``codec``, without
  feedback, as MATH.md §4.2 sends a leaf: a leaf with two or more axes and at least M
  rows keeps its rows (scales per row), any other is flattened into M rows; each
  worker's rows decoded, averaged, and the mean's rows decoded again."""
  m, shape = leaves.shape[0], leaves.shape[1:]
  if len(shape) >= 2 and shape[0] >= m:
    rows = leaves.reshape(m, shape[0], -1)
    rows = np.pad(rows, ((0, 0), (0, -shape[0] % m), (0, 0)))
  else:
    flat = leaves.reshape(m, -1)
    width = max(1, -(-flat.shape[1] // m))
    rows = np.pad(flat, ((0, 0), (0, m * width - flat.shape[1]))).reshape(m, m, width)
  mean = np.mean(_decoded(rows, codec).astype(np.float64), axis=0).astype(np.float32)
  decoded = _decoded(mean, codec).astype(np.float64)
  if len(shape) >= 2 and shape[0] >= m:
    return decoded[: shape[0]].reshape(shape)
  return decoded.reshape(-1)[: int(np.prod(shape))].reshape(shape)


def _decoded(rows: np.ndarray, codec: str) -> np.ndarray:
  r"""dec(enc(rows)) in float32, per row (last axis).

  int8: s = max_j |x_j| / 127, q_j = clip(round(x_j / s), -127, 127) with ties to
  even (s = 0: x / 1), decoded q_j s. bfloat16: each value rounded to the nearest
  bfloat16, ties to even, on its float32 bits (the low 16 bits dropped after adding
  0x7FFF plus the lowest kept bit).
  """
  rows = np.ascontiguousarray(rows, np.float32)
  if codec == "bfloat16":
    bits = rows.view(np.uint32)
    bits = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return bits.view(np.float32)
  if codec != "int8":
    raise ValueError(f"compression={codec!r}")
  scales = np.max(np.abs(rows), axis=-1, keepdims=True) / np.float32(127)
  safe = np.where(scales > 0, scales, np.float32(1))
  return np.clip(np.round(rows / safe), -127, 127) * scales
