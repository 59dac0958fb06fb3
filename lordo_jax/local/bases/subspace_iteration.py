r"""Subspace iteration: the SVD subspace, approached from the previous basis.

:func:`iterate` refines the previous Qs (its docstring has the iteration, :math:`O(nqr)`
each instead of an SVD's); :func:`method` is the subspace-iteration
:class:`~lordo_jax.local.bases.strategy.Method`, whose first basis is an exact SVD
(:mod:`lordo_jax.local.bases.svd`).
"""

import jax
import jax.numpy as jnp

from lordo_jax import _sharded as sharded
from lordo_jax.local.bases import one_sided
from lordo_jax.local.bases import strategy as strategy_lib
from lordo_jax.local.bases import svd


def iterate(xs: list, qs: list, iterations: int, lefts: list) -> list[tuple[jax.Array, jax.Array]]:
  r"""``[(Q, ok)]``: ``iterations`` steps of subspace iteration from each ``q``, canonical signs.

  Warm-started from the previous Q of each matrix X of ``xs``, ``iterations`` (the
  option ``subspace_iterations``) times

  .. math::
    Q \leftarrow \mathrm{qr}\bigl(X (X^\top Q)\bigr).Q \ \text{(left)}, \qquad
    Q \leftarrow \mathrm{qr}\bigl(X^\top (X Q)\bigr).Q \ \text{(right)}

  then canonical signs; :math:`O(nqr)` per iteration instead of an SVD's. The QR is
  :func:`~lordo_jax._sharded.orthonormal`'s batched Cholesky-QR (the same Q to float32
  rounding while the factor's condition number, about :math:`(\sigma_1 / \sigma_r)^2`
  of X, stays below :math:`10^7`; Householder QR for a matrix past it), of every
  matrix at once: the leading axes of an ``x`` and its ``q`` are a batch of matrices
  (a shape group), and the ``r x r`` factorizations of all the groups are one solver
  call per pass. ``ok`` (one per matrix) is false where an orthonormalisation failed.
  """
  products = [
    (jnp.matrix_transpose(x), x) if left else (x, jnp.matrix_transpose(x))
    for x, left in zip(xs, lefts, strict=True)
  ]
  oks = [True] * len(xs)
  for _ in range(iterations):
    ys = [
      sharded.product(second, sharded.product(first, q))
      for (first, second), q in zip(products, qs, strict=True)
    ]
    results = sharded.orthonormal(ys)
    qs = [q for q, _ in results]
    oks = [ok & new_ok for ok, (_, new_ok) in zip(oks, results, strict=True)]
  return [(strategy_lib.canonical_signs(q), ok) for q, ok in zip(qs, oks, strict=True)]


def method(options: strategy_lib.Options) -> strategy_lib.Method:
  """The subspace-iteration :class:`~lordo_jax.local.bases.strategy.Method`.

  Each refresh is :func:`iterate` from the previous basis, of every matrix of a
  refresh at once (its ``bases_of_mean``). A run's first basis has no previous one
  to start from: it is an exact SVD (:mod:`lordo_jax.local.bases.svd`).
  """

  def refined(xs: list, previous: list, lefts: list) -> list:
    xs = [x.astype(jnp.float32) for x in xs]
    results = iterate(xs, previous, options.subspace_iterations, lefts)
    return [
      strategy_lib.checked(q, old, x.ndim - 2, ok)
      for (q, ok), old, x in zip(results, previous, xs, strict=True)
    ]

  def compute(left: bool):
    return lambda x, previous, key: refined([x], [previous], [left])[0]

  def bases_of_mean(strategies, matrices, previous, keys, first, mean):
    averaged = mean(matrices)

    def exact():
      pairs = zip(strategies, averaged, previous, keys, strict=True)
      return [s.exact(x, old, key) for s, x, old, key in pairs]

    def iterated():
      return refined(averaged, previous, [s.side == "left" for s in strategies])

    return strategy_lib.by_first(first, exact, iterated)

  dense = one_sided.dense_method(
    options, compute, exact=lambda left: svd.compute(options.rank, left)
  )
  return dense._replace(bases_of_mean=bases_of_mean)
