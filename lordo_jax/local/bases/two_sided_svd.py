r"""Two-sided SVD: U and V are the top-r left and right singular vectors of X.

.. math::
  X = U \Sigma V^\top, \qquad (U, V) = (U_{:, :r}, V_{:, :r})

each with canonical signs, in float32 whatever the parameter dtype.
"""

import jax
import jax.numpy as jnp

from lordo_jax import _sharded as sharded
from lordo_jax.local.bases import strategy as strategy_lib
from lordo_jax.local.bases import two_sided


def top_singular_vectors(x: jax.Array, rank: int) -> two_sided.TwoSidedBasis:
  """The top-r left and right singular vectors of X, canonical signs each."""
  u, _, vh = sharded.svd(x.astype(jnp.float32))
  return two_sided.TwoSidedBasis(
    strategy_lib.canonical_signs(u[..., :rank]),
    strategy_lib.canonical_signs(jnp.matrix_transpose(vh[..., :rank, :])),
  )


def method(options: strategy_lib.Options) -> strategy_lib.Method:
  """The two-sided SVD :class:`~lordo_jax.local.bases.strategy.Method`."""

  def compute(x, previous, key):
    del key
    return strategy_lib.checked(top_singular_vectors(x, options.rank), previous, x.ndim - 2)

  def make(p: int, q: int) -> strategy_lib.BasisStrategy:
    return two_sided.strategy(p, q, options.rank, compute)

  return strategy_lib.MethodFunctions(make, strategy_lib.bases_of_mean)
