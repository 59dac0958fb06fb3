r"""Two-sided low-rank projection (TSR-Adam): moments and messages in an r x r core.

For a ``p x q`` matrix with orthonormal bases U (``p x r``) and V (``q x r``), the
low-rank path of SPEC section 3 keeps its coordinates in the core

.. math::
  C = U^\top A V \quad (r \times r), \qquad L = U X V^\top,

so the Adam moments are ``r x r`` instead of ``r x q``, and a per-step all-reduce of
the coordinates (low-rank DDP with ``communicate="projected"``) sends
:math:`r^2` numbers per matrix instead of :math:`r q`. The error-feedback residual is
:math:`E = A - U C V^\top`.

A refresh takes U and V from a matrix X (the averaged pseudo-gradient in LoRDO, the
mean gradient in low-rank DDP), each with canonical signs (largest-magnitude entry
of each column positive):

* ``svd``: the top-r left and right singular vectors of X;
* ``randomized_svd`` (Halko, Martinsson and Tropp, 2011): with a Gaussian sketch
  :math:`\Omega` (``q x l``, :math:`l = r + \text{oversample}`, drawn from a key
  that every worker derives alike from the seed and the step),

  .. math::
    Y = X \Omega,\ Q = \mathrm{qr}(Y); \quad
    \text{repeat } k \text{ times: } Q = \mathrm{qr}(X\, \mathrm{qr}(X^\top Q));
    \quad B = Q^\top X = U_B \Sigma V_B^\top, \quad U = Q U_B[:, :r],\ V = V_B[:, :r].

  Each product with X is linear in X, so when every worker holds its own
  :math:`X_m` and the refresh needs the mean, averaging the products
  (``p x l`` and ``l x q`` messages) gives exactly the sketch of the mean: no
  worker ever sends its ``p x q`` matrix (:func:`randomized_bases` takes the
  averaging as its ``mean`` argument).

``rotate`` carries the moments into new bases with :math:`R_U = U_\text{new}^\top
U_\text{old}` and :math:`R_V = V_\text{new}^\top V_\text{old}` (LDAdam's rule on both
sides): :math:`u' = R_U u R_V^\top`, and the bias-corrected second moment becomes
:math:`|(R_U \odot R_U)\,\mathrm{var}\,(R_V \odot R_V)^\top + (R_U \hat m R_V^\top)^2|`
with :math:`\mathrm{var} = \max(\hat v - \hat m^2, 0)`.

A refresh from the very gradient it then steps on (low-rank DDP's refresh steps)
makes the core diagonal: :math:`U^\top G V = \Sigma`. Its off-diagonal entries are
then float32 rounding, about :math:`10^{-7} \sigma_1`, and on a run's first step,
where Adam's denominator is :math:`|C| + \epsilon`, they take steps of size
:math:`|C| / (|C| + \epsilon)`, up to 1 when ``eps`` is below them. Later steps
divide by the accumulated second moment and do not see it. Two programs that
round differently (two worker counts, two devices) can therefore differ at step 1
by up to a learning rate per entry of the core; an ``eps`` above
:math:`10^{-7} \sigma_1` removes it.

References:
  Dang et al., From O(mn) to O(r^2): two-sided low-rank communication for Adam
  (TSR-Adam), 2026 (arXiv 2602.08007); Halko,
  Martinsson and Tropp, Finding structure with randomness, 2011 (arXiv 0909.4061);
  Robert et al., LDAdam, 2024 (arXiv 2410.16103).
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from lordo_jax import projection as projection_lib

METHODS = ("svd", "randomized_svd")
OVERSAMPLE = 8  # Default extra sketch columns.
POWER_ITERATIONS = 1  # Default power iterations.


class TwoSidedBasis(NamedTuple):
  """The bases of one matrix's core: U (``p x r``) and V (``q x r``), float32."""

  left: jax.Array
  right: jax.Array


def project(basis: TwoSidedBasis, matrix: jax.Array) -> jax.Array:
  """The ``r x r`` core :math:`U^\\top A V`."""
  return basis.left.T @ matrix @ basis.right


def unproject(basis: TwoSidedBasis, core: jax.Array) -> jax.Array:
  """Back to ``p x q``: :math:`U C V^\\top`."""
  return basis.left @ core @ basis.right.T


def empty_basis(p: int, q: int, rank: int) -> TwoSidedBasis:
  """A placeholder (zeros), replaced by the first refresh."""
  return TwoSidedBasis(jnp.zeros((p, rank), jnp.float32), jnp.zeros((q, rank), jnp.float32))


def random_basis(key: jax.Array, p: int, q: int, rank: int) -> TwoSidedBasis:
  """Orthonormal U and V from ``key`` (``init_projection="random"``)."""
  left_key, right_key = jax.random.split(key)
  return TwoSidedBasis(
    projection_lib.random_basis(left_key, p, rank, "svd"),
    projection_lib.random_basis(right_key, q, rank, "svd"),
  )


def _checked(basis: TwoSidedBasis, previous: TwoSidedBasis) -> tuple[TwoSidedBasis, jax.Array]:
  """``(basis, ok)``: the previous basis where the new one is not finite."""
  ok = jnp.all(jnp.isfinite(basis.left)) & jnp.all(jnp.isfinite(basis.right))
  return jax.tree.map(lambda new, old: jnp.where(ok, new, old), basis, previous), ok


def svd_basis(x: jax.Array, rank: int) -> TwoSidedBasis:
  """The top-r left and right singular vectors of X, canonical signs each."""
  u, _, vh = jnp.linalg.svd(x.astype(jnp.float32), full_matrices=False)
  return TwoSidedBasis(
    projection_lib.canonical_signs(u[:, :rank]), projection_lib.canonical_signs(vh[:rank].T)
  )


def sketch_width(shape: tuple[int, int], rank: int, oversample: int) -> int:
  """l = r + oversample, at most min(p, q)."""
  return min(rank + oversample, *shape)


def randomized_bases(
  matrices: list[jax.Array],
  rank: int,
  keys: list[jax.Array],
  *,
  oversample: int,
  power_iterations: int,
  mean: Callable[[list[jax.Array]], list[jax.Array]] = lambda xs: xs,
) -> list[TwoSidedBasis]:
  """Randomized SVD bases of several matrices at once (see the module docstring).

  Args:
    matrices: ``p x q`` matrices (each worker's own, when ``mean`` averages).
    rank: r.
    keys: one PRNG key per matrix, the same on every worker.
    oversample: extra sketch columns, l = r + oversample.
    power_iterations: k, passes of :math:`X X^\\top` over the range.
    mean: applied to each list of products with the matrices, e.g. a counted
      ``pmean`` over the workers; the identity (default) takes the bases of the
      matrices themselves. One call per pass, so all matrices share each message.

  Returns:
    One :class:`TwoSidedBasis` per matrix (not yet checked for finiteness).
  """
  xs = [x.astype(jnp.float32) for x in matrices]
  sketches = [
    jax.random.normal(key, (x.shape[1], sketch_width(x.shape, rank, oversample)), jnp.float32)
    for x, key in zip(xs, keys, strict=True)
  ]
  orthonormal = lambda ys: [jnp.linalg.qr(y)[0] for y in ys]  # noqa: E731
  ranges = orthonormal(mean([x @ s for x, s in zip(xs, sketches, strict=True)]))
  for _ in range(power_iterations):
    co_ranges = orthonormal(mean([x.T @ q for x, q in zip(xs, ranges, strict=True)]))
    ranges = orthonormal(mean([x @ z for x, z in zip(xs, co_ranges, strict=True)]))
  cores = mean([q.T @ x for x, q in zip(xs, ranges, strict=True)])
  bases = []
  for q, b in zip(ranges, cores, strict=True):
    u, _, vh = jnp.linalg.svd(b, full_matrices=False)
    bases.append(
      TwoSidedBasis(
        projection_lib.canonical_signs(q @ u[:, :rank]),
        projection_lib.canonical_signs(vh[:rank].T),
      )
    )
  return bases


def compute_basis(
  x: jax.Array,
  previous: TwoSidedBasis,
  method: str,
  rank: int,
  key: jax.Array,
  *,
  oversample: int,
  power_iterations: int,
) -> tuple[TwoSidedBasis, jax.Array]:
  """U and V of one matrix, ``(basis, ok)``; ``ok`` false keeps ``previous``."""
  if method == "svd":
    basis = svd_basis(x, rank)
  else:
    (basis,) = randomized_bases(
      [x], rank, [key], oversample=oversample, power_iterations=power_iterations
    )
  return _checked(basis, previous)


def checked(bases: list[TwoSidedBasis], previous: list[TwoSidedBasis]):
  """:func:`compute_basis`'s check for a list of bases: ``[(basis, ok), ...]``."""
  return [_checked(b, p) for b, p in zip(bases, previous, strict=True)]


def rotate_moments(mu, nu, new: TwoSidedBasis, old: TwoSidedBasis, count, b1, b2):
  r"""LDAdam's transport on both sides of ``r x r`` moments (module docstring)."""
  rot_left = new.left.T @ old.left
  rot_right = new.right.T @ old.right
  first_correction = 1 - b1**count
  second_correction = 1 - b2**count
  mean = mu / first_correction
  variance = jnp.maximum(nu / second_correction - mean**2, 0.0)
  rotated_mean = rot_left @ mean @ rot_right.T
  second = jnp.abs((rot_left * rot_left) @ variance @ (rot_right * rot_right).T + rotated_mean**2)
  return rot_left @ mu @ rot_right.T, second * second_correction
