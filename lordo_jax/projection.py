r"""ComputeProjection: the r-dimensional basis a low-rank matrix lives in.

Everything here is written for the *left* case of SPEC section 2: ``X`` is an
``n x q`` matrix and the basis ``Q`` is ``n x r`` with orthonormal columns, so the
coordinates are ``Q^T X`` (``r x q``). The right case is the left case of ``X^T``;
:func:`compute_projection` takes ``side="right"`` to compute it from X itself.

Three methods (SPEC section 5), all in float32 whatever the parameter dtype:

* ``svd``: the first r left singular vectors of X, ordered by singular value.
* ``subspace_iteration``: warm-started from the previous basis, n times
  :math:`Q \leftarrow \mathrm{qr}(X (X^\top Q)).Q`; cost :math:`O(nqr)`.
* ``dct``: the r columns of the orthonormal DCT-II basis
  :math:`B_{ij} = \sqrt{2/n}\, c_j \cos(\pi (i + 1/2) j / n)`, :math:`c_0 = 1/\sqrt2`,
  :math:`c_j = 1` otherwise, that score highest by :math:`\lVert B_j^\top X \rVert_2`,
  kept in ascending index order. Only the r indices are stored (:class:`DCTBasis`).

Cost, which is what the optimizer pays on every step or every refresh:

* a DCT basis's columns are read from a table of :math:`\cos(\pi k / 2n)`,
  :math:`k < 4n`, built once per size n (4n floats, in float64 and rounded once);
  entry ``(i, j)`` is entry :math:`(2i + 1) j \bmod 4n` of it, so a step gathers
  the ``n x r`` matrix instead of computing ``n r`` cosines;
* the ``dct`` scores :math:`B^\top X` are products with blocks of 256 columns of
  B from the same table, so a refresh never holds the ``n x n`` basis (an FFT would
  be :math:`O(nq \log n)`, but inside the caller's sync branch it made XLA copy
  whole matrices on every local step);
* the overlap :math:`Q_\text{new}^\top Q_\text{old}` of two DCT bases is the 0/1
  matrix of equal frequencies (the columns are orthonormal), with no product.

Signs are canonical: each column is flipped so that its largest-magnitude entry is
positive, so every worker and any reference agree on the basis, not only its span.
A refresh whose result is not finite keeps the previous basis (``ok=False``).
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

METHODS = ("svd", "subspace_iteration", "dct")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DCTBasis:
  """The r DCT-II frequencies a matrix is projected on; the basis is never stored."""

  indices: jax.Array  # int32[r], ascending.
  size: int = dataclasses.field(metadata=dict(static=True))  # n, the basis length.


Basis = jax.Array | DCTBasis


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
  r"""Columns ``indices`` of the orthonormal ``size x size`` DCT-II basis, float32.

  Entry ``(i, j)`` is :math:`\sqrt{2/n}\, c_j \cos(\pi (2i + 1) j / (2n))`. The
  angle is reduced modulo :math:`2\pi` in integer arithmetic, and its cosine read
  from a table built once per size, so every entry is the float64 value rounded once.
  """
  rows = jnp.arange(size, dtype=jnp.int32)[:, None]
  phase = _product_mod(2 * rows + 1, indices[None, :].astype(jnp.int32), 4 * size)
  columns = jnp.asarray(_cosine_table(size))[phase]
  scale = jnp.where(indices == 0, math.sqrt(1.0 / size), math.sqrt(2.0 / size))
  return columns * scale[None, :].astype(jnp.float32)


def basis_matrix(basis: Basis) -> jax.Array:
  """The ``n x r`` float32 matrix of a basis."""
  if isinstance(basis, DCTBasis):
    return dct_columns(basis.indices, basis.size)
  return basis


def overlap(new: Basis, old: Basis) -> jax.Array:
  r"""The ``r x r`` matrix :math:`R = Q_\text{new}^\top Q_\text{old}` of two bases.

  For two DCT bases it is exactly the 0/1 matrix of equal frequencies, since the
  DCT-II columns are orthonormal.
  """
  if isinstance(new, DCTBasis) and isinstance(old, DCTBasis):
    return (new.indices[:, None] == old.indices[None, :]).astype(jnp.float32)
  return basis_matrix(new).T @ basis_matrix(old)


def canonical_signs(q: jax.Array) -> jax.Array:
  """Flips each column of ``q`` so that its largest-magnitude entry is positive."""
  rows = jnp.argmax(jnp.abs(q), axis=0)
  pivots = jnp.take_along_axis(q, rows[None, :], axis=0)
  return q * jnp.where(pivots < 0, -1.0, 1.0).astype(q.dtype)


def _svd_basis(x: jax.Array, rank: int, left: bool) -> jax.Array:
  u, _, vh = jnp.linalg.svd(x, full_matrices=False)
  return canonical_signs(u[:, :rank] if left else vh[:rank].T)


def _subspace_iteration_basis(x: jax.Array, q: jax.Array, iterations: int, left: bool):
  for _ in range(iterations):
    q, _ = jnp.linalg.qr(x @ (x.T @ q) if left else x.T @ (x @ q))
  return canonical_signs(q)


_SCORE_BLOCK = 256  # DCT frequencies scored per product in a refresh.


def _dct_scores(x: jax.Array, left: bool) -> jax.Array:
  r""":math:`\lVert B_j^\top X \rVert_2` for every frequency j (``X B_j`` on the right).

  Blocks of 256 columns of B at a time, so a refresh holds ``n x 256`` floats of the
  basis, never all ``n x n`` (38 MB at n = 3072, 10 GB at n = 50257).
  """
  size = x.shape[0] if left else x.shape[1]

  def block(start):
    frequencies = jnp.minimum(start + jnp.arange(_SCORE_BLOCK, dtype=jnp.int32), size - 1)
    columns = dct_columns(frequencies, size)
    if left:
      return jnp.linalg.norm(columns.T @ x, axis=1)
    return jnp.linalg.norm(x @ columns, axis=0)

  starts = jnp.arange(-(-size // _SCORE_BLOCK), dtype=jnp.int32) * _SCORE_BLOCK
  return jax.lax.map(block, starts).reshape(-1)[:size]


def _dct_indices(x: jax.Array, rank: int, left: bool) -> tuple[jax.Array, jax.Array]:
  """The ``rank`` best-scoring DCT frequencies of ``x`` (ascending) and all scores."""
  scores = _dct_scores(x, left)
  _, best = jax.lax.top_k(scores, rank)
  return jnp.sort(best).astype(jnp.int32), scores


def compute_projection(
  x: jax.Array,
  previous: Basis,
  method: str,
  rank: int,
  iterations: int = 2,
  *,
  side: str = "left",
) -> tuple[Basis, jax.Array]:
  r"""ComputeProjection(X) of SPEC section 5.

  ``side="right"`` computes the basis of the right case, the left case of
  :math:`X^\top`, without forming the transpose: the right singular vectors of X,
  :math:`Q \leftarrow \mathrm{qr}(X^\top (X Q)).Q`, or the scores
  :math:`\lVert X B_j \rVert_2`. (Transposing X here, inside the sync branch, made
  XLA copy whole matrices on every local step of the caller.)

  Args:
    x: the ``n x q`` matrix to take the basis from (``q x n`` with ``side="right"``),
      cast to float32 here.
    previous: the current ``n x r`` basis; the warm start of ``subspace_iteration``
      and the value kept when the result is not finite.
    method: ``"svd"``, ``"subspace_iteration"`` or ``"dct"``.
    rank: r.
    iterations: subspace-iteration steps.
    side: ``"left"`` or ``"right"``.

  Returns:
    ``(basis, ok)``: the new basis (``previous`` where the result is not finite) and
    a boolean scalar, false when the refresh failed.
  """
  x = x.astype(jnp.float32)
  left = side == "left"
  if method == "dct":
    indices, scores = _dct_indices(x, rank, left)
    ok = jnp.all(jnp.isfinite(scores))
    kept = jnp.where(ok, indices, previous.indices)
    return DCTBasis(kept, previous.size), ok
  if method == "svd":
    q = _svd_basis(x, rank, left)
  elif method == "subspace_iteration":
    q = _subspace_iteration_basis(x, previous, iterations, left)
  else:
    raise ValueError(f"projection={method!r} is not one of {METHODS}.")
  ok = jnp.all(jnp.isfinite(q))
  return jnp.where(ok, q, previous), ok


def exact_projection(x: jax.Array, previous: Basis, method: str, rank: int, side: str = "left"):
  """The first basis of a run: like :func:`compute_projection`, but with no warm start.

  ``subspace_iteration`` needs a previous basis, so its first one is an exact SVD.
  """
  first_method = "svd" if method == "subspace_iteration" else method
  return compute_projection(x, previous, first_method, rank, side=side)


def random_basis(key: jax.Array, size: int, rank: int, method: str) -> Basis:
  """An orthonormal ``size x rank`` basis from ``key`` (r random frequencies for dct)."""
  if method == "dct":
    indices = jax.random.choice(key, size, (rank,), replace=False)
    return DCTBasis(jnp.sort(indices).astype(jnp.int32), size)
  q, _ = jnp.linalg.qr(jax.random.normal(key, (size, rank), jnp.float32))
  return canonical_signs(q)


def empty_basis(size: int, rank: int, method: str) -> Basis:
  """A placeholder basis (zeros; frequencies 0..r-1) to be replaced before first use."""
  if method == "dct":
    return DCTBasis(jnp.arange(rank, dtype=jnp.int32), size)
  return jnp.zeros((size, rank), jnp.float32)


def principal_angles(a: jax.Array, b: jax.Array) -> jax.Array:
  r"""Principal angles (radians, ascending) between ``span(a)`` and ``span(b)``.

  :math:`\theta_i = \arccos \sigma_i(A^\top B)` for orthonormal A, B.
  """
  cosines = jnp.linalg.svd(basis_matrix(a).T @ basis_matrix(b), compute_uv=False)
  return jnp.arccos(jnp.clip(cosines, 0.0, 1.0))
