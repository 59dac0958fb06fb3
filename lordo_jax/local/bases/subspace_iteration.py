r"""Subspace iteration: the SVD subspace, approached from the previous basis.

:func:`iterate` refines the previous Q (its docstring has the iteration, :math:`O(nqr)`
each instead of an SVD's); :func:`method` is the subspace-iteration
:class:`~lordo_jax.local.bases.strategy.Method`, whose first basis is an exact SVD
(:mod:`lordo_jax.local.bases.svd`).
"""

import jax
import jax.numpy as jnp

from lordo_jax.local.bases import layout
from lordo_jax.local.bases import one_sided
from lordo_jax.local.bases import strategy as strategy_lib
from lordo_jax.local.bases import svd


def iterate(x: jax.Array, q: jax.Array, iterations: int, left: bool) -> jax.Array:
  r"""``iterations`` steps of subspace iteration from ``q``, then canonical signs.

  Warm-started from the previous Q, ``iterations`` (the option
  ``subspace_iterations``) times

  .. math::
    Q \leftarrow \mathrm{qr}\bigl(X (X^\top Q)\bigr).Q \ \text{(left)}, \qquad
    Q \leftarrow \mathrm{qr}\bigl(X^\top (X Q)\bigr).Q \ \text{(right)}

  then canonical signs; :math:`O(nqr)` per iteration instead of an SVD's.
  """
  for _ in range(iterations):
    if left:
      y = layout.product(x, layout.product(x.T, q))
    else:
      y = layout.product(x.T, layout.product(x, q))
    q = layout.orthonormal(y)
  return strategy_lib.canonical_signs(q)


def method(options: strategy_lib.Options) -> strategy_lib.Method:
  """The subspace-iteration :class:`~lordo_jax.local.bases.strategy.Method`.

  Each refresh is :func:`iterate` from the previous basis. A run's first basis has no
  previous one to start from: it is an exact SVD (:mod:`lordo_jax.local.bases.svd`).
  """

  def compute(left: bool):
    def compute_fn(x, previous, key):
      del key
      basis = iterate(x.astype(jnp.float32), previous, options.subspace_iterations, left)
      return strategy_lib.checked(basis, previous)

    return compute_fn

  return one_sided.dense_method(
    options, compute, exact=lambda left: svd.compute(options.rank, left)
  )
