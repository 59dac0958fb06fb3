r"""LDAdam's transport of the Adam moments into a refreshed basis (MATH.md §4.6)."""

import jax
import jax.numpy as jnp

from lordo_jax.local import bases as bases_lib


def rotate_moments(strategy: bases_lib.BasisStrategy, mu, nu, new_basis, old_basis, count, b1, b2):
  r"""LDAdam's moment transport into a new basis (MATH.md §4, step 6).

  .. math::
    R = \mathrm{change\_of\_basis}(Q_\text{new}, Q_\text{old}), \quad
    \hat m = \frac{u}{1 - \beta_1^t}, \quad \hat v = \frac{v}{1 - \beta_2^t}, \quad
    u' = R u, \quad
    v' = (1 - \beta_2^t)\,\bigl|(R \odot R) \max(\hat v - \hat m^2, 0)
      + (R \hat m)^2\bigr|

  where "R applied" is the strategy's ``carry`` (``R x`` on the left, ``x R^T`` on
  the right, :math:`R_U x R_V^\top` two-sided); R is exactly 0/1 for two DCT bases.
  """
  rotation = strategy.change_of_basis(new_basis, old_basis)
  if strategy.side == "right":  # The left case of the transposes (the same products).
    transposed = jnp.matrix_transpose
    mu, nu = _rotated(lambda r, x: r @ x, rotation, transposed(mu), transposed(nu), count, b1, b2)
    return transposed(mu), transposed(nu)
  return _rotated(strategy.carry, rotation, mu, nu, count, b1, b2)


def _rotated(carry, rotation, mu, nu, count, b1, b2):
  """:func:`rotate_moments` with R applied by ``carry``."""
  squared = jax.tree.map(lambda r: r * r, rotation)
  first_correction = 1 - b1**count
  second_correction = 1 - b2**count
  mean = mu / first_correction
  variance = jnp.maximum(nu / second_correction - mean**2, 0.0)
  new_second = jnp.abs(carry(squared, variance) + carry(rotation, mean) ** 2)
  return carry(rotation, mu), new_second * second_correction
