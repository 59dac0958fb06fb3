r"""ComputeProjection: the r-dimensional basis a low-rank matrix lives in.

Everything here is written for the *left* case of SPEC section 2: ``X`` is an
``n x q`` matrix and the basis ``Q`` is ``n x r`` with orthonormal columns, so the
coordinates are ``Q^T X`` (``r x q``). The right case is the left case of ``X^T``;
:mod:`lordo_jax.low_rank` orients each matrix before calling in here.

Three methods (SPEC section 5), all in float32 whatever the parameter dtype:

* ``svd``: the first r left singular vectors of X, ordered by singular value.
* ``subspace_iteration``: warm-started from the previous basis, n times
  :math:`Q \leftarrow \mathrm{qr}(X (X^\top Q)).Q`; cost :math:`O(nqr)`.
* ``dct``: the r columns of the orthonormal DCT-II basis
  :math:`B_{ij} = \sqrt{2/n}\, c_j \cos(\pi (i + 1/2) j / n)`, :math:`c_0 = 1/\sqrt2`,
  :math:`c_j = 1` otherwise, that score highest by :math:`\lVert B_j^\top X \rVert_2`,
  kept in ascending index order. Only the r indices are stored (:class:`DCTBasis`).

Signs are canonical: each column is flipped so that its largest-magnitude entry is
positive, so every worker and any reference agree on the basis, not only its span.
A refresh whose result is not finite keeps the previous basis (``ok=False``).
"""

import dataclasses
import math

import jax
import jax.numpy as jnp

METHODS = ("svd", "subspace_iteration", "dct")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DCTBasis:
  """The r DCT-II frequencies a matrix is projected on; the basis is never stored."""

  indices: jax.Array  # int32[r], ascending.
  size: int = dataclasses.field(metadata=dict(static=True))  # n, the basis length.


Basis = jax.Array | DCTBasis


def dct_columns(indices: jax.Array, size: int) -> jax.Array:
  r"""Columns ``indices`` of the orthonormal ``size x size`` DCT-II basis, float32.

  The angle :math:`\pi (2i + 1) j / (2n)` is reduced modulo :math:`2\pi` in integer
  arithmetic first, so the cosine stays accurate for large n.
  """
  rows = jnp.arange(size, dtype=jnp.int32)[:, None]
  phase = ((2 * rows + 1) * indices[None, :].astype(jnp.int32)) % (4 * size)
  columns = jnp.cos(phase.astype(jnp.float32) * (math.pi / (2 * size)))
  scale = jnp.where(indices == 0, math.sqrt(1.0 / size), math.sqrt(2.0 / size))
  return columns * scale[None, :].astype(jnp.float32)


def basis_matrix(basis: Basis) -> jax.Array:
  """The ``n x r`` float32 matrix of a basis."""
  if isinstance(basis, DCTBasis):
    return dct_columns(basis.indices, basis.size)
  return basis


def canonical_signs(q: jax.Array) -> jax.Array:
  """Flips each column of ``q`` so that its largest-magnitude entry is positive."""
  rows = jnp.argmax(jnp.abs(q), axis=0)
  pivots = jnp.take_along_axis(q, rows[None, :], axis=0)
  return q * jnp.where(pivots < 0, -1.0, 1.0).astype(q.dtype)


def _svd_basis(x: jax.Array, rank: int) -> jax.Array:
  u, _, _ = jnp.linalg.svd(x, full_matrices=False)
  return canonical_signs(u[:, :rank])


def _subspace_iteration_basis(x: jax.Array, q: jax.Array, iterations: int) -> jax.Array:
  for _ in range(iterations):
    q, _ = jnp.linalg.qr(x @ (x.T @ q))
  return canonical_signs(q)


def _dct_indices(x: jax.Array, rank: int) -> tuple[jax.Array, jax.Array]:
  """The ``rank`` best-scoring DCT frequencies of ``x`` (ascending) and all scores."""
  size = x.shape[0]
  basis = dct_columns(jnp.arange(size, dtype=jnp.int32), size)
  scores = jnp.linalg.norm(basis.T @ x, axis=1)
  _, best = jax.lax.top_k(scores, rank)
  return jnp.sort(best).astype(jnp.int32), scores


def compute_projection(
  x: jax.Array,
  previous: Basis,
  method: str,
  rank: int,
  iterations: int = 2,
) -> tuple[Basis, jax.Array]:
  """ComputeProjection(X) of SPEC section 5, left case.

  Args:
    x: the ``n x q`` matrix to take the basis from (cast to float32 here).
    previous: the current basis; the warm start of ``subspace_iteration`` and the
      value kept when the result is not finite.
    method: ``"svd"``, ``"subspace_iteration"`` or ``"dct"``.
    rank: r.
    iterations: subspace-iteration steps.

  Returns:
    ``(basis, ok)``: the new basis (``previous`` where the result is not finite) and
    a boolean scalar, false when the refresh failed.
  """
  x = x.astype(jnp.float32)
  if method == "dct":
    indices, scores = _dct_indices(x, rank)
    ok = jnp.all(jnp.isfinite(scores))
    kept = jnp.where(ok, indices, previous.indices)
    return DCTBasis(kept, previous.size), ok
  if method == "svd":
    q = _svd_basis(x, rank)
  elif method == "subspace_iteration":
    q = _subspace_iteration_basis(x, previous, iterations)
  else:
    raise ValueError(f"projection={method!r} is not one of {METHODS}.")
  ok = jnp.all(jnp.isfinite(q))
  return jnp.where(ok, q, previous), ok


def exact_projection(x: jax.Array, previous: Basis, method: str, rank: int):
  """The first basis of a run: like :func:`compute_projection`, but with no warm start.

  ``subspace_iteration`` needs a previous basis, so its first one is an exact SVD.
  """
  first_method = "svd" if method == "subspace_iteration" else method
  return compute_projection(x, previous, first_method, rank)


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
