r"""Matrices sharded over a mesh's ``Explicit`` axes: whole where an op needs it, and
state laid out like them.

:func:`whole` gathers an operand that a LAPACK-backed op refuses sharded,
:func:`product` multiplies (batches of) sharded matrices, summing a split inner dimension
inside the worker group, and :func:`orthonormal` is a batched QR of products and ``r x r``
Cholesky factorizations, which never gathers a row-split factor. :func:`spec_of` reads
the axes each dimension is split over, and :func:`zeros` makes state split the same way.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
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


# Before 0.12, jaxlib's CPU LAPACK kernels spread a batch of matrices over the thread
# pool they run on and wait for it: two batched calls at once (XLA runs independent ones
# concurrently, and a program of several devices runs one per device) can leave no
# thread to do the work, and the program hangs.
_CPU_BATCHES_HANG = jax.__version_info__ < (0, 12)


def _batched(solver):
  """``solver`` (a function of matrices with the same leading batch axes) as one
  batched call; on the CPU of jaxlib before 0.12, one matrix at a time in a loop
  (``lax.map``), whose unbatched LAPACK calls never wait on the thread pool."""

  def call(*xs):
    if xs[0].ndim == 2 or not _CPU_BATCHES_HANG:
      return solver(*xs)

    def looped(*xs):
      batch = xs[0].shape[:-2]
      flat = [x.reshape(-1, *x.shape[len(batch) :]) for x in xs]
      out = jax.lax.map(lambda args: solver(*args), flat)
      return jax.tree.map(lambda y: y.reshape(*batch, *y.shape[1:]), out)

    return jax.lax.platform_dependent(*xs, cpu=looped, default=solver)

  return call


_thin_svd = _batched(lambda x: tuple(jnp.linalg.svd(x, full_matrices=False)))
_householder_q = _batched(lambda y: jnp.linalg.qr(y)[0])
_cholesky = _batched(jnp.linalg.cholesky)
# L^{-1} of a lower-triangular r x r L: a solve against the identity, r x r only.
_inverse_lower = _batched(
  lambda lower: jax.lax.linalg.triangular_solve(
    lower,
    jnp.broadcast_to(jnp.eye(lower.shape[-1], dtype=lower.dtype), lower.shape),
    left_side=True,
    lower=True,
  )
)


def svd(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The thin SVD ``(U, s, V^T)`` of each matrix of ``x`` (leading axes: a batch), made
  whole first (:func:`whole`): one batched solver call (a loop on the CPU of jaxlib
  before 0.12, whose batched LAPACK calls can hang)."""
  return _thin_svd(whole(x))


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


def _contracting_as(small: jax.Array, axes, dim: int) -> jax.Array:
  """``small`` with its matrix dimension ``dim`` (-2 or -1) split over ``axes``, as the
  other operand's contracting dimension is (its other dimension whole where it used them)."""
  spec = list(spec_of(small))
  if spec[dim] == axes:
    return small
  other = -1 if dim == -2 else -2
  spec[dim], spec[other] = axes, None if spec[other] == axes else spec[other]
  return jax.sharding.reshard(small, PartitionSpec(*spec))


def product(a: jax.Array, b: jax.Array, precision=None) -> jax.Array:
  """``a @ b`` over any leading batch axes; where both split their inner dimension over
  the same mesh axis, the partial products are summed inside the worker group (an
  all-reduce of the result, never a gather of an operand). Where they split it
  differently (tensor parallelism beside FSDP), the smaller operand (a thin factor) is
  laid out as the larger one's, never the matrix. ``precision`` is ``jnp.matmul``'s."""
  if (is_sharded(a) or is_sharded(b)) and spec_of(a)[-1] != spec_of(b)[-2]:
    if a.size <= b.size:
      a = _contracting_as(a, spec_of(b)[-2], -1)
    else:
      b = _contracting_as(b, spec_of(a)[-1], -2)
  spec_a, spec_b = spec_of(a), spec_of(b)
  rows, inner, cols = spec_a[-2], spec_a[-1], spec_b[-1]
  if inner is None or inner != spec_b[-2]:
    return jnp.matmul(a, b, precision=precision)
  batch = (spec_a if a.ndim >= b.ndim else spec_b)[:-2]
  out = PartitionSpec(*batch, rows, None if cols == rows else cols)
  if a.ndim != b.ndim:
    return jnp.matmul(a, b, precision=precision, out_sharding=out)
  # Batched alike: a dot_general, as jnp.matmul of JAX 0.12 drops a batch axis of size 1
  # before it applies out_sharding (whose spec then has one entry too many).
  dtype = jnp.result_type(a, b)
  axes = tuple(range(a.ndim - 2))
  return jax.lax.dot_general(
    a.astype(dtype),
    b.astype(dtype),
    (((a.ndim - 1,), (b.ndim - 2,)), (axes, axes)),
    precision=precision,
    out_sharding=out,
  )


# A basis whose columns are further than this from orthonormal, max |Q^T Q - I|, is a
# failed orthonormalisation (a good one in float32 is near 1e-6, Householder's n u at worst).
ORTHONORMALITY_TOLERANCE = 1e-3
_EXACT = jax.lax.Precision.HIGHEST  # Grams and solves: no TF32 / bf16 passes on accelerators.


def orthonormal(ys: list[jax.Array]) -> list[tuple[jax.Array, jax.Array]]:
  r"""``[(Q, ok)]``: an orthonormal basis of the columns of each ``n x r`` matrix of each ``y``.

  Each ``y`` is ``(..., n, r)``, with its own ``n`` and leading batch axes (a shape
  group of a model's matrices): all of them are handled in one batched computation of
  matrix products and ``r x r`` Cholesky factorizations (shifted Cholesky-QR, Fukaya
  et al., 2020), never a loop of Householder QRs (which an accelerator's solver
  library runs one matrix at a time). Two passes on the Gram shifted by
  :math:`s = (\sqrt n + r)\, u\, \lVert Y \rVert_F^2` (u the unit roundoff), each of which
  multiplies the condition number by about :math:`(s / \lVert Y \rVert_2^2)^{1/2}`,
  then two plain passes that restore orthogonality (a plain Cholesky-QR breaks down
  beyond condition number :math:`u^{-1/2}`, some :math:`4 \cdot 10^3` in float32):

  .. math::
    R_{k+1} = \mathrm{chol}(Q_k^\top Q_k + s_k I)^\top,\ Q_{k+1} = Q_k R_{k+1}^{-1},
    \qquad Q_0 = Y,\ s_0, s_1 > 0,\ s_2 = s_3 = 0.

  The shift is the Gram's typical rounding error, not Fukaya et al.'s worst-case
  bound :math:`11 (n r + r (r + 1))\, u\, \lVert Y \rVert_2^2`, which at GPT-2's
  ``3072 x 192`` is 40% of the Gram and leaves the condition number where it was; with
  it the passes hold to condition number :math:`10^7` in float32 at every size tested,
  and a breakdown beyond is caught below.

  Each pass multiplies by the inverse of an upper-triangular matrix with a positive
  diagonal, so Q is the thin QR's Q of ``y`` (positive diagonal of R), up to rounding;
  after :func:`~lordo_jax.local.bases.strategy.canonical_signs`, the same basis as a
  Householder QR's. Grams and solves run at ``HIGHEST`` precision. The ``r x r``
  factorizations of every ``y`` of one ``r`` are one solver call per pass
  (:func:`_inverse_factors`): the Grams have that size whatever ``n`` is.

  (On the CPU of jaxlib before 0.12 the factorizations of a batch run one matrix at a
  time in a loop: its batched LAPACK calls can hang.)

  A matrix whose result is not finite or not orthonormal to
  :data:`ORTHONORMALITY_TOLERANCE` (rank-deficient, zero, or conditioned beyond
  :math:`10^7`) falls back, alone, to Householder QR, inside one ``lax.cond`` that runs
  only when some matrix failed (compiled for an accelerator, the Householder QRs of
  every ``y`` are one batched call: :func:`_householder_qs`); ``ok`` (one per matrix,
  shaped like the batch) is then true wherever the result is finite. A ``y`` split by
  rows over a mesh axis (FSDP) has no fallback, which would gather it: ``ok`` is false
  where Cholesky-QR failed, and the caller keeps its previous basis there.

  References:
    Fukaya, Kannan, Nakatsukasa, Yamamoto and Yanagisawa, Shifted Cholesky QR for
    computing the QR factorization of ill-conditioned matrices, SIAM J. Sci. Comput.
    42(1), 2020 (arXiv 1809.11085).
  """
  qs = cholesky_qr(ys)
  oks = [orthonormality_error(q) < ORTHONORMALITY_TOLERANCE for q in qs]
  whole_ones = [i for i, y in enumerate(ys) if not is_sharded(y)]
  if not whole_ones:
    return list(zip(qs, oks, strict=True))

  def householder_where_failed():
    householder = _householder_qs([ys[i] for i in whole_ones])
    return [
      jnp.where(oks[i][..., None, None], qs[i], q)
      for i, q in zip(whole_ones, householder, strict=True)
    ]

  all_ok = jnp.all(jnp.stack([jnp.all(oks[i]) for i in whole_ones]))
  kept = jax.lax.cond(all_ok, lambda: [qs[i] for i in whole_ones], householder_where_failed)
  for i, q in zip(whole_ones, kept, strict=True):
    qs[i], oks[i] = q, jnp.all(jnp.isfinite(q), axis=(-2, -1))
  return list(zip(qs, oks, strict=True))


def _columns_whole(y: jax.Array) -> jax.Array:
  """``y`` with its last (r) dimension whole: split only by rows, so that its ``r x r``
  Gram is the same on every device (a few columns gathered, never a matrix)."""
  spec = spec_of(y)
  if not is_sharded(y) or spec[-1] is None:
    return y
  return jax.sharding.reshard(y, PartitionSpec(*spec[:-1], None))


def cholesky_qr(ys: list[jax.Array]) -> list[jax.Array]:
  """The shifted Cholesky-QR passes of :func:`orthonormal`, with no check or fallback
  (NaN where a factorization failed)."""
  ys = [_columns_whole(y) for y in ys]
  for shifted in (True, True, False, False):
    grams = [product(jnp.matrix_transpose(y), y, precision=_EXACT) for y in ys]
    if shifted:
      grams = [_shifted(gram, y.shape[-2]) for gram, y in zip(grams, ys, strict=True)]
    # Y R^{-1} with R = L^T: a product with the r x r inverse, not a triangular solve
    # against the n x r factor (an accelerator's BLAS runs products far faster).
    inverses = _inverse_factors(grams)
    ys = [
      product(y, jnp.matrix_transpose(inverse), precision=_EXACT)
      for y, inverse in zip(ys, inverses, strict=True)
    ]
  return ys


def _shifted(gram: jax.Array, n: int) -> jax.Array:
  """The Gram of an ``n x r`` factor plus :func:`orthonormal`'s shift."""
  r = gram.shape[-1]
  unit_roundoff = jnp.finfo(gram.dtype).eps / 2
  trace = jnp.trace(gram, axis1=-2, axis2=-1)[..., None, None]
  return gram + (math.sqrt(n) + r) * unit_roundoff * trace * jnp.eye(r, dtype=gram.dtype)


def _inverse_factors(grams: list[jax.Array]) -> list[jax.Array]:
  """:math:`L^{-1}` of each ``r x r`` Gram's Cholesky factor L: the Grams of one size
  and dtype stacked into one batched factorization and one solve (an accelerator's
  solver library spends its time per call, not per small matrix); a Gram split over a
  mesh axis (its batch axis) alone. On the CPU of jaxlib before 0.12, which factorizes
  a batch one matrix at a time anyway (:func:`_batched`), each Gram keeps its own call:
  stacking gains nothing there, and changes how XLA compiles the program around it."""
  if not _CPU_BATCHES_HANG:
    return _stacked_inverse_factors(grams)
  return jax.lax.platform_dependent(
    *grams,
    cpu=lambda *each: [_inverse_lower(_cholesky(gram)) for gram in each],
    default=lambda *each: _stacked_inverse_factors(list(each)),
  )


def _stacked_inverse_factors(grams: list[jax.Array]) -> list[jax.Array]:
  """:func:`_inverse_factors`, the Grams of one size and dtype (unsplit) stacked."""
  inverses: list = [None] * len(grams)
  together: dict = {}
  for i, gram in enumerate(grams):
    alone = i if is_sharded(gram) else None
    together.setdefault((gram.shape[-1], gram.dtype, alone), []).append(i)
  for indices in together.values():
    if len(indices) == 1:
      inverses[indices[0]] = _inverse_lower(_cholesky(grams[indices[0]]))
      continue
    flat = [grams[i].reshape(-1, *grams[i].shape[-2:]) for i in indices]
    stacked = _inverse_lower(_cholesky(jnp.concatenate(flat)))
    ends = np.cumsum([f.shape[0] for f in flat])[:-1]
    for i, part in zip(indices, jnp.split(stacked, ends), strict=True):
      inverses[i] = part.reshape(grams[i].shape)
  return inverses


def _householder_qs(ys: list[jax.Array]) -> list[jax.Array]:
  """Householder QR's Q of each ``(..., n, r)`` ``y`` (unsplit). Compiled for an
  accelerator, the ``y`` of one ``r`` and dtype are one batched call, each padded with
  zero rows to the longest (the Q of :math:`[Y; 0]` is :math:`[Q; 0]`: each reflector
  of Y's columns is zero below Y), since its solver library spends its time per call;
  on a CPU, each ``y`` its own call, as :func:`_batched` makes it."""
  return jax.lax.platform_dependent(
    *ys,
    cpu=lambda *each: [_householder_q(y) for y in each],
    default=lambda *each: _stacked_householder_qs(list(each)),
  )


def _stacked_householder_qs(ys: list[jax.Array]) -> list[jax.Array]:
  """:func:`_householder_qs` on an accelerator: those of one ``r`` and dtype stacked."""
  qs: list = [None] * len(ys)
  together: dict = {}
  for i, y in enumerate(ys):
    together.setdefault((y.shape[-1], y.dtype), []).append(i)
  for indices in together.values():
    rows = max(ys[i].shape[-2] for i in indices)
    flat = [ys[i].reshape(-1, *ys[i].shape[-2:]) for i in indices]
    padded = [jnp.pad(f, ((0, 0), (0, rows - f.shape[-2]), (0, 0))) for f in flat]
    stacked = jnp.linalg.qr(jnp.concatenate(padded))[0]
    ends = np.cumsum([f.shape[0] for f in flat])[:-1]
    for i, f, part in zip(indices, flat, jnp.split(stacked, ends), strict=True):
      qs[i] = part[:, : f.shape[-2]].reshape(ys[i].shape)
  return qs


def orthonormality_error(q: jax.Array) -> jax.Array:
  r""":math:`\max |Q^\top Q - I|` of each ``n x r`` matrix of ``q`` (NaN stays NaN,
  so a comparison with it is false)."""
  q = _columns_whole(q)
  gram = product(jnp.matrix_transpose(q), q, precision=_EXACT)
  error = jnp.abs(gram - jnp.eye(q.shape[-1], dtype=q.dtype))
  return jnp.max(jnp.where(jnp.isnan(error), jnp.inf, error), axis=(-2, -1))


def row_indices(x: jax.Array) -> jax.Array:
  """``i`` at every ``(..., i, j)`` of the matrices ``x``, int32, split like ``x``."""
  sharding = jax.typeof(x).sharding if is_sharded(x) else None
  return jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 2, out_sharding=sharding)


def like(x: jax.Array, reference: jax.Array) -> jax.Array:
  """``x`` split over the mesh axes ``reference`` is split over (a no-op where they agree)."""
  if spec_of(x) == spec_of(reference) or not (is_sharded(x) or is_sharded(reference)):
    return x
  return jax.sharding.reshard(x, PartitionSpec(*spec_of(reference)))
