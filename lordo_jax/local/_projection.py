r"""ComputeProjection: the r-dimensional basis a low-rank matrix lives in.

The function-level face of the one-sided bases of :mod:`lordo_jax.local.bases` (one
file per method): :func:`compute_projection` (whose docstring has the mathematics),
:func:`principal_angles` to watch a subspace move, and :class:`DCTBasis`.
"""

import jax
import jax.numpy as jnp

from lordo_jax.local import bases as bases_lib
from lordo_jax.local.bases import dct
from lordo_jax.local.bases.dct import DCTBasis
from lordo_jax.local.bases.dct import dct_columns
from lordo_jax.local.bases.strategy import canonical_signs

# The deterministic one-sided methods: a randomized refresh needs a key, which this
# function-level API does not take (``randomized_svd`` is a strategy's only).
METHODS = ("svd", "subspace_iteration", "dct")

Basis = jax.Array | DCTBasis

__all__ = [
  "METHODS",
  "Basis",
  "DCTBasis",
  "basis_matrix",
  "canonical_signs",
  "change_of_basis",
  "compute_projection",
  "dct_columns",
  "exact_projection",
  "principal_angles",
  "random_basis",
]


def _strategy(shape, method: str, rank: int, iterations: int = 2, side: str = "left"):
  """The one-sided strategy of ``method`` for a matrix of ``shape``, on ``side``."""
  if method not in METHODS:
    raise ValueError(f"projection={method!r} is not one of {METHODS}.")
  options = bases_lib.Options(rank, side, iterations)
  return bases_lib.method(method, two_sided=False, options=options).strategy(*shape)


def compute_projection(
  x: jax.Array,
  previous: Basis,
  method: str,
  rank: int,
  iterations: int = 2,
  *,
  side: str = "left",
) -> tuple[Basis, jax.Array]:
  r"""ComputeProjection(X) of MATH.md §5.

  Written for the *left* case of
  MATH.md §2: ``X`` is an ``n x q`` matrix and the basis ``Q`` is ``n x r`` with
  orthonormal columns, so the coordinates are ``Q^T X`` (``r x q``). The right case is
  the left case of ``X^T``; :func:`compute_projection` takes ``side="right"`` to
  compute it from X itself.

  Three methods (MATH.md §5), all in float32 whatever the parameter dtype:

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

  Examples:
    >>> import jax.numpy as jnp, lordo_jax
    >>> q, ok = lordo_jax.compute_projection(jnp.eye(6, 3), jnp.zeros((6, 2)), "svd", 2)
    >>> q.shape, bool(ok)
    ((6, 2), True)
  """
  return _strategy(x.shape, method, rank, iterations, side).compute(x, previous, None)


def exact_projection(x: jax.Array, previous: Basis, method: str, rank: int, side: str = "left"):
  """The first basis of a run: like :func:`compute_projection`, but with no warm start.

  ``subspace_iteration`` needs a previous basis, so its first one is an exact SVD.
  """
  s = _strategy(x.shape, method, rank, side=side)
  return (s.exact or s.compute)(x, previous, None)


def random_basis(key: jax.Array, size: int, rank: int, method: str) -> Basis:
  """An orthonormal ``size x rank`` basis from ``key`` (r random frequencies for dct)."""
  return _strategy((size, size), method, rank).init(key)


def basis_matrix(basis: Basis) -> jax.Array:
  """The ``n x r`` float32 matrix of a basis."""
  if isinstance(basis, DCTBasis):
    return dct_columns(basis.indices, basis.size)
  return basis


def change_of_basis(new: Basis, old: Basis) -> jax.Array:
  r"""The ``r x r`` matrix :math:`R = Q_\text{new}^\top Q_\text{old}` of two bases.

  For two DCT bases it is exactly the 0/1 matrix of equal frequencies, since the
  DCT-II columns are orthonormal.
  """
  if isinstance(new, DCTBasis) and isinstance(old, DCTBasis):
    return dct.change_of_basis(new, old)
  return basis_matrix(new).T @ basis_matrix(old)


def principal_angles(a: jax.Array, b: jax.Array) -> jax.Array:
  r"""Principal angles (radians, ascending) between ``span(a)`` and ``span(b)``.

  :math:`\theta_i = \arccos \sigma_i(A^\top B)` for orthonormal A, B.

  Args:
    a: an orthonormal basis, ``n x r`` (as :func:`lordo_jax.projections` gives it).
    b: another, ``n x r'``.

  Returns:
    ``min(r, r')`` angles in radians, ascending: all 0 for the same subspace.

  Examples:
    >>> import jax.numpy as jnp, lordo_jax
    >>> e = jnp.eye(3)
    >>> [round(float(x), 4) for x in lordo_jax.principal_angles(e[:, :2], e[:, 1:])]
    [0.0, 1.5708]
  """
  cosines = jnp.linalg.svd(basis_matrix(a).T @ basis_matrix(b), compute_uv=False)
  return jnp.arccos(jnp.clip(cosines, 0.0, 1.0))
