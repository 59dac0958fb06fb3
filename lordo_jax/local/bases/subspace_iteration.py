r"""Subspace iteration: the SVD subspace, approached from the previous basis.

:func:`iterate` refines the previous Q (its docstring has the iteration, :math:`O(nqr)`
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


def iterate(x: jax.Array, q: jax.Array, iterations: int, left: bool) -> tuple[jax.Array, jax.Array]:
  r"""``(Q, ok)``: ``iterations`` steps of subspace iteration from ``q``, canonical signs.

  Warm-started from the previous Q, ``iterations`` (the option
  ``subspace_iterations``) times

  .. math::
    Q \leftarrow \mathrm{qr}\bigl(X (X^\top Q)\bigr).Q \ \text{(left)}, \qquad
    Q \leftarrow \mathrm{qr}\bigl(X^\top (X Q)\bigr).Q \ \text{(right)}

  then canonical signs; :math:`O(nqr)` per iteration instead of an SVD's. The QR is
  :func:`~lordo_jax._sharded.orthonormal`'s batched Cholesky-QR (the same Q
  to float32 rounding while the factor's condition number, about
  :math:`(\sigma_1 / \sigma_r)^2` of X, stays below :math:`10^7`; Householder QR for a
  matrix past it). Leading axes of ``x`` and ``q`` are a batch of matrices, iterated at
  once; ``ok`` (one per matrix) is false where an orthonormalisation failed.
  """
  transposed = jnp.matrix_transpose(x)
  first, second = (transposed, x) if left else (x, transposed)
  ok = True
  for _ in range(iterations):
    q, new_ok = sharded.orthonormal(sharded.product(second, sharded.product(first, q)))
    ok = ok & new_ok
  return strategy_lib.canonical_signs(q), ok


def method(options: strategy_lib.Options) -> strategy_lib.Method:
  """The subspace-iteration :class:`~lordo_jax.local.bases.strategy.Method`.

  Each refresh is :func:`iterate` from the previous basis. A run's first basis has no
  previous one to start from: it is an exact SVD (:mod:`lordo_jax.local.bases.svd`).
  """

  def compute(left: bool):
    def compute_fn(x, previous, key):
      del key
      basis, ok = iterate(x.astype(jnp.float32), previous, options.subspace_iterations, left)
      return strategy_lib.checked(basis, previous, x.ndim - 2, ok)

    return compute_fn

  return one_sided.dense_method(
    options, compute, exact=lambda left: svd.compute(options.rank, left)
  )
