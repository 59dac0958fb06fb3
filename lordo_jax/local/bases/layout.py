r"""Matrices sharded over a mesh's ``Explicit`` axes: whole where an op needs it, and
state laid out like them.

:func:`whole` gathers an operand that a LAPACK-backed op refuses sharded (its docstring
says when), :func:`product` multiplies sharded matrices, summing a split inner
dimension inside the worker group, and :func:`orthonormal` is a QR that needs no gather
of a row-split ``n x r`` factor (shifted Cholesky-QR). :func:`spec_of` reads the axes
each dimension is split over from the type, and :func:`zeros` makes a state buffer
split the same way, so that ``tx.init`` of a sharded parameter gives state sharded like it.
"""

import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec


def is_sharded(x: jax.Array) -> bool:
  """Whether ``x``'s type says it is split over some mesh axis (``Explicit`` axes)."""
  sharding = jax.typeof(x).sharding
  return any(axes is not None for axes in getattr(sharding, "spec", ()))


def whole(x: jax.Array) -> jax.Array:
  """``x`` gathered over the ``Explicit`` axes it is sharded on; else ``x`` itself.

  Under ``jax.shard_map(..., axis_names={worker axis})`` on a mesh whose other axes
  (FSDP, tensor parallelism) have ``Explicit`` type, an array's sharding is part of its
  type, and LAPACK-backed ops (``svd``, ``qr``) refuse a sharded operand. This gathers
  such an operand over those axes inside the worker group (the fast links; no message
  between workers, nothing in the ledger). With ``Auto`` axes, or none, it changes
  nothing: the compiler places the data.
  """
  if not is_sharded(x):
    return x
  return jax.sharding.reshard(x, PartitionSpec())


def split_rows(rows: int, matrix: jax.Array) -> tuple | None:
  """The spec of an ``rows x r`` factor stored split over a mesh axis ``matrix`` is
  split on (its first split axis that divides ``rows``), so that a basis shrinks with
  FSDP as its matrix does; ``None`` where the matrix is whole."""
  if not is_sharded(matrix):
    return None
  mesh_shape = jax.typeof(matrix).sharding.mesh.shape
  for axes in spec_of(matrix):
    if axes is None:
      continue
    names = axes if isinstance(axes, tuple) else (axes,)
    if rows % math.prod(mesh_shape[name] for name in names) == 0:
      return (axes, None)
  return None


def place(x: jax.Array, spec: tuple | None, matrix: jax.Array) -> jax.Array:
  """``x`` split as ``spec`` says over the mesh of ``matrix`` (``None``: as it is)."""
  if spec is None or spec_of(x) == spec:
    return x
  mesh = jax.typeof(matrix).sharding.mesh
  return jax.sharding.reshard(x, jax.sharding.NamedSharding(mesh, PartitionSpec(*spec)))


def spec_of(x: jax.Array) -> tuple:
  """The mesh axes each dimension of ``x`` is split over (``None``: whole), from its type."""
  spec = tuple(getattr(jax.typeof(x).sharding, "spec", ()))
  return spec + (None,) * (x.ndim - len(spec))


def zeros(shape: tuple[int, ...], dtype, spec: tuple, like: jax.Array) -> jax.Array:
  """Zeros of ``shape``, each dimension split over the mesh axes ``spec`` names, on the
  mesh ``like`` (an array split over it) lives on."""
  if all(axes is None for axes in spec):
    return jnp.zeros(shape, dtype)
  mesh = jax.typeof(like).sharding.mesh
  return jnp.zeros(
    shape, dtype, out_sharding=jax.sharding.NamedSharding(mesh, PartitionSpec(*spec))
  )


def product(a: jax.Array, b: jax.Array) -> jax.Array:
  """``a @ b``; where both split their inner dimension over the same mesh axis, the
  partial products are summed inside the worker group (an all-reduce of the result,
  never a gather of an operand)."""
  rows, inner, cols = spec_of(a)[0], spec_of(a)[1], spec_of(b)[1]
  if inner is None or inner != spec_of(b)[0]:
    return a @ b
  return jnp.matmul(a, b, out_sharding=PartitionSpec(rows, None if cols == rows else cols))


def orthonormal(y: jax.Array) -> jax.Array:
  r"""An orthonormal basis of the columns of the ``n x r`` matrix ``y``: its QR's Q.

  An unsplit ``y`` takes LAPACK's Householder QR. A ``y`` split by rows takes shifted
  Cholesky-QR instead (Fukaya et al., 2020), made of products and ``r x r``
  factorizations only: two passes on the Gram shifted by
  :math:`s = 11 (n r + r (r + 1))\, u\, \lVert Y \rVert_F^2` (u the unit roundoff),
  each of which is defined whatever the conditioning and multiplies the condition
  number by about :math:`(s / \lVert Y \rVert_F^2)^{1/2}`, then two plain passes that restore
  orthogonality (a plain Cholesky-QR breaks down beyond condition number
  :math:`u^{-1/2}`, some :math:`4 \cdot 10^3` in float32; this one holds to
  :math:`10^6`, ``tests/local/test_basis_layout.py``):

  .. math::
    R_{k+1} = \mathrm{chol}(Q_k^\top Q_k + s_k I)^\top,\ Q_{k+1} = Q_k R_{k+1}^{-1},
    \qquad Q_0 = Y,\ s_0, s_1 > 0,\ s_2 = s_3 = 0.

  Each pass multiplies by the inverse of an upper-triangular matrix with a positive
  diagonal, so Q is the thin QR's Q of ``y`` (positive diagonal of R), up to rounding;
  after :func:`~lordo_jax.local.bases.strategy.canonical_signs`, the same basis.

  References:
    Fukaya, Kannan, Nakatsukasa, Yamamoto and Yanagisawa, Shifted Cholesky QR for
    computing the QR factorization of ill-conditioned matrices, SIAM J. Sci. Comput.
    42(1), 2020 (arXiv 1809.11085).
  """
  if not is_sharded(y):
    return jnp.linalg.qr(y)[0]
  n, r = y.shape
  unit_roundoff = jnp.finfo(y.dtype).eps / 2
  for shifted in (True, True, False, False):
    gram = product(y.T, y)
    if shifted:
      shift = 11 * (n * r + r * (r + 1)) * unit_roundoff * jnp.trace(gram)
      gram = gram + shift * jnp.eye(r, dtype=gram.dtype)
    upper = jnp.linalg.cholesky(gram).T
    y = jax.scipy.linalg.solve_triangular(upper.T, y.T, lower=True).T
  return y


def row_indices(x: jax.Array) -> jax.Array:
  """``i`` at every ``(i, j)`` of the matrix ``x``, int32, split like ``x``."""
  sharding = jax.typeof(x).sharding if is_sharded(x) else None
  return jax.lax.broadcasted_iota(jnp.int32, x.shape, 0, out_sharding=sharding)


def like(x: jax.Array, reference: jax.Array) -> jax.Array:
  """``x`` split over the mesh axes ``reference`` is split over (a no-op where they agree)."""
  if spec_of(x) == spec_of(reference) or not (is_sharded(x) or is_sharded(reference)):
    return x
  return jax.sharding.reshard(x, PartitionSpec(*spec_of(reference)))
