r"""Two-sided randomized SVD (Halko, Martinsson and Tropp, 2011): U and V from sketches.

:func:`randomized_bases` makes the two-sided bases from the range finder of
:func:`lordo_jax.local.bases.randomized_svd.ranges`, and averages only sketches when the
workers' mean is needed (its docstring says how, and has the references);
:mod:`lordo_jax.local.bases.randomized_svd` keeps one side.
"""

import jax
import jax.numpy as jnp

from lordo_jax import _sharded as sharded
from lordo_jax.local.bases import randomized_svd
from lordo_jax.local.bases import strategy as strategy_lib
from lordo_jax.local.bases import two_sided


def randomized_bases(
  matrices: list[jax.Array],
  rank: int,
  keys: list[jax.Array],
  *,
  oversample: int,
  power_iterations: int,
  mean: strategy_lib.Mean = lambda xs: xs,
) -> list[two_sided.TwoSidedBasis]:
  r"""Randomized SVD bases of several matrices at once.

  From the ranges of
  :func:`~lordo_jax.local.bases.randomized_svd.ranges`, the two-sided bases come from the ``l x q``
  core:

  .. math::
    B = Q^\top X = U_B \Sigma V_B^\top, \quad U = Q U_B[:, :r],\ V = V_B[:, :r];

  :mod:`lordo_jax.local.bases.randomized_svd` keeps the one side.

  Each product with X is linear in X, so when every worker holds its own
  :math:`X_m` and the refresh needs the mean, averaging the products (``p x l`` and
  ``l x q`` messages) gives exactly the sketch of the mean: no worker ever sends its
  ``p x q`` matrix. This function takes the averaging as its ``mean`` argument, and
  is this method's :meth:`~lordo_jax.local.bases.strategy.Method.bases_of_mean`.

  Nothing ``p x q`` is gathered either when X is split over a worker group's
  ``Explicit`` mesh axes: every product with X is
  :func:`lordo_jax._sharded.product` (a split inner dimension summed inside
  the group), every ``n x l`` factor is orthonormalised by
  :func:`lordo_jax._sharded.orthonormal` (shifted Cholesky-QR when it is
  split by rows), and only the ``l x q`` core is made whole for its SVD.

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
    ``(bases, oks)``: one :class:`~lordo_jax.local.bases.two_sided.TwoSidedBasis` per
    matrix (not yet checked for finiteness), and the ``ok`` of its orthonormalisations.

  References:
    Halko, Martinsson and Tropp, Finding structure with randomness, 2011
    (arXiv 0909.4061).
  """
  xs = [x.astype(jnp.float32) for x in matrices]
  sketched = dict(rank=rank, oversample=oversample, power_iterations=power_iterations, mean=mean)
  qs, oks = randomized_svd.ranges(xs, keys, [True] * len(xs), **sketched)
  cores = mean([sharded.product(jnp.matrix_transpose(q), x) for x, q in zip(xs, qs, strict=True)])
  bases = []
  for q, b in zip(qs, cores, strict=True):
    u, _, vh = sharded.svd(b)  # l x q: small.
    bases.append(
      two_sided.TwoSidedBasis(
        strategy_lib.canonical_signs(q @ u[..., :rank]),
        strategy_lib.canonical_signs(jnp.matrix_transpose(vh[..., :rank, :])),
      )
    )
  return bases, oks


def method(options: strategy_lib.Options) -> strategy_lib.Method:
  """The two-sided randomized-SVD :class:`~lordo_jax.local.bases.strategy.Method`."""
  sketched = dict(oversample=options.oversample, power_iterations=options.power_iterations)

  def compute(x, previous, key):
    (basis,), (ok,) = randomized_bases([x], options.rank, [key], **sketched)
    return strategy_lib.checked(basis, previous, x.ndim - 2, ok)

  def make(p: int, q: int) -> strategy_lib.BasisStrategy:
    return two_sided.strategy(p, q, options.rank, compute)

  def bases_of_mean(strategies, matrices, previous, keys, first, mean):
    """The bases of the mean, from averaged sketches; the first is like any other."""
    del strategies, first
    bases, oks = randomized_bases(matrices, options.rank, keys, mean=mean, **sketched)
    entries = zip(bases, previous, matrices, oks, strict=True)
    return [strategy_lib.checked(b, p, x.ndim - 2, ok) for b, p, x, ok in entries]

  return strategy_lib.MethodFunctions(make, bases_of_mean)
