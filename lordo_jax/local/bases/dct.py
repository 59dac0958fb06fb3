r"""DCT: the r frequencies of the orthonormal DCT-II basis that score highest.

:func:`method` is the DCT :class:`~lordo_jax.local.bases.strategy.Method` (its
docstring has the basis, the refresh and what they cost). A :class:`DCTBasis` stores
only the r frequencies: :func:`dct_columns` forms their columns, :func:`scores` scores
every frequency in a refresh, and :func:`change_of_basis` is the change of basis.
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from lordo_jax.local.bases import one_sided
from lordo_jax.local.bases import strategy as strategy_lib


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DCTBasis:
  """The r DCT-II frequencies a matrix is projected on; the basis is never stored."""

  indices: jax.Array  #: int32[r], ascending (leading axes: a batch of matrices).
  size: int = dataclasses.field(metadata=dict(static=True))  #: n, the basis length.


@functools.lru_cache
def _cosine_table(size: int) -> np.ndarray:
  r""":math:`\cos(\pi k / (2n))` for :math:`k = 0, \dots, 4n - 1`, float32 (from float64)."""
  return np.cos(np.arange(4 * size) * (math.pi / (2 * size))).astype(np.float32)


def _product_mod(a: jax.Array, b: jax.Array, modulus: int) -> jax.Array:
  """``a * b mod modulus`` in int32 without overflow, for ``0 <= a, b < modulus < 2**29``.

  Horner's rule over chunks of ``b`` small enough that no intermediate reaches
  :math:`2^{31}`; one chunk (a plain product) whenever ``modulus**2 < 2**30``.
  """
  step = 30 - modulus.bit_length()
  shifts = list(reversed(range(0, (modulus - 1).bit_length(), step)))
  result = a * (b >> shifts[0]) % modulus
  for shift in shifts[1:]:
    chunk = (b >> shift) & ((1 << step) - 1)
    result = (result * (1 << step) + a * chunk) % modulus
  return result


def dct_columns(indices: jax.Array, size: int) -> jax.Array:
  r"""Columns ``indices`` of the orthonormal ``size x size`` DCT-II basis, float32
  (``(..., size, r)`` for a batch of index vectors).

  Entry ``(i, j)`` is :math:`\sqrt{2/n}\, c_j \cos(\pi (2i + 1) j / (2n))`. The
  angle is reduced modulo :math:`2\pi` in integer arithmetic, and its cosine read
  from a table built once per size, so every entry is the float64 value rounded once.
  """
  rows = jnp.arange(size, dtype=jnp.int32)[:, None]
  phase = _product_mod(2 * rows + 1, indices[..., None, :].astype(jnp.int32), 4 * size)
  columns = jnp.asarray(_cosine_table(size))[phase]
  scale = jnp.where(indices == 0, math.sqrt(1.0 / size), math.sqrt(2.0 / size))
  return columns * scale[..., None, :].astype(jnp.float32)


_SCORE_BLOCK = 256  # DCT frequencies scored per product in a refresh.


def scores(x: jax.Array, left: bool) -> jax.Array:
  r""":math:`\lVert B_j^\top X \rVert_2` for every frequency j (``X B_j`` on the right).

  Blocks of 256 columns of B at a time, so a refresh holds ``n x 256`` floats of the
  basis, never all ``n x n`` (38 MB at n = 3072, 10 GB at n = 50257). Leading axes of
  ``x`` are a batch of matrices, scored at once.
  """
  size = x.shape[-2] if left else x.shape[-1]

  def block(start):
    frequencies = jnp.minimum(start + jnp.arange(_SCORE_BLOCK, dtype=jnp.int32), size - 1)
    columns = dct_columns(frequencies, size)
    if left:
      return jnp.linalg.norm(columns.T @ x, axis=-1)
    return jnp.linalg.norm(x @ columns, axis=-2)

  starts = jnp.arange(-(-size // _SCORE_BLOCK), dtype=jnp.int32) * _SCORE_BLOCK
  blocks = jnp.moveaxis(jax.lax.map(block, starts), 0, -2)  # (..., blocks, 256)
  return blocks.reshape(*x.shape[:-2], -1)[..., :size]


def init(size: int, rank: int):
  """``init``: r distinct random frequencies from a key; 0..r-1 without one."""

  def init_fn(key):
    if key is None:
      return DCTBasis(jnp.arange(rank, dtype=jnp.int32), size)
    indices = jax.random.choice(key, size, (rank,), replace=False)
    return DCTBasis(jnp.sort(indices).astype(jnp.int32), size)

  return init_fn


def compute(rank: int, left: bool):
  """``compute(x, previous, key) -> (DCTBasis, ok)``: the best-scoring frequencies."""

  def compute_fn(x, previous, key):
    del key
    all_scores = scores(x.astype(jnp.float32), left)
    _, best = jax.lax.top_k(all_scores, rank)
    ok = jnp.all(jnp.isfinite(all_scores), axis=-1)
    kept = jnp.where(ok[..., None], jnp.sort(best, axis=-1).astype(jnp.int32), previous.indices)
    return DCTBasis(kept, previous.size), ok

  return compute_fn


def change_of_basis(new: DCTBasis, old: DCTBasis) -> jax.Array:
  """The 0/1 matrix of equal frequencies: exactly :math:`B_\\text{new}^\\top B_\\text{old}`."""
  return (new.indices[..., :, None] == old.indices[..., None, :]).astype(jnp.float32)


def method(options: strategy_lib.Options) -> strategy_lib.Method:
  r"""The DCT :class:`~lordo_jax.local.bases.strategy.Method`.

  The columns of the ``n x n`` DCT-II basis are
  :math:`B_{ij} = \sqrt{2/n}\, c_j \cos(\pi (i + 1/2) j / n)`, :math:`c_0 = 1/\sqrt2`,
  :math:`c_j = 1` otherwise. A refresh keeps the r columns that score highest by
  :math:`\lVert B_j^\top X \rVert_2` (left; :math:`\lVert X B_j \rVert_2` on the right),
  in ascending index order. Only the r indices are stored (:class:`DCTBasis`).

  Cost, which is what the optimizer pays on every step or every refresh:

  * a DCT basis's columns are read from a table of :math:`\cos(\pi k / 2n)`,
    :math:`k < 4n`, built once per size n (4n floats, in float64 and rounded once);
    entry ``(i, j)`` is entry :math:`(2i + 1) j \bmod 4n` of it, so a step gathers
    the ``n x r`` matrix instead of computing ``n r`` cosines (:func:`dct_columns`);
  * the scores :math:`B^\top X` are products with blocks of 256 columns of B from the
    same table, so a refresh never holds the ``n x n`` basis (:func:`scores`; an FFT
    would be :math:`O(nq \log n)`, but inside the caller's sync branch it made XLA copy
    whole matrices on every local step);
  * the change of basis :math:`Q_\text{new}^\top Q_\text{old}` of two DCT bases is the 0/1
    matrix of equal frequencies (the columns are orthonormal), with no product
    (:func:`change_of_basis`).
  """

  def make(p: int, q: int) -> strategy_lib.BasisStrategy:
    left = one_sided.is_left(p, q, options.side)
    return one_sided.strategy(
      p,
      q,
      options.rank,
      left,
      init=init(p if left else q, options.rank),
      compute=compute(options.rank, left),
      dense=lambda basis: dct_columns(basis.indices, basis.size),
      change_of_basis=change_of_basis,
      stored_split=False,  # r indices: nothing worth splitting.
    )

  return strategy_lib.MethodFunctions(make, strategy_lib.bases_of_mean)
