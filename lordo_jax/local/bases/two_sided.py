r"""What every two-sided basis shares: U and V, and the ``r x r`` core between them.

:class:`TwoSidedBasis` holds U and V; :func:`strategy` makes the
:class:`~lordo_jax.local.bases.strategy.BasisStrategy` of a ``p x q`` matrix (its
docstring has the core and the change of bases) from :func:`project`,
:func:`unproject`, :func:`change_of_basis` and :func:`carry`.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from lordo_jax.local.bases import one_sided
from lordo_jax.local.bases import strategy as strategy_lib


class TwoSidedBasis(NamedTuple):
  """The bases of one matrix's core: U (``p x r``) and V (``q x r``), float32."""

  left: jax.Array  # U, p x r, orthonormal columns.
  right: jax.Array  # V, q x r, orthonormal columns.


def project(basis: TwoSidedBasis, matrix: jax.Array) -> jax.Array:
  """The ``r x r`` core :math:`U^\\top A V`."""
  return jnp.matrix_transpose(basis.left) @ matrix @ basis.right


def unproject(basis: TwoSidedBasis, core: jax.Array) -> jax.Array:
  """Back to ``p x q``: :math:`U C V^\\top`."""
  return basis.left @ core @ jnp.matrix_transpose(basis.right)


def change_of_basis(new: TwoSidedBasis, old: TwoSidedBasis) -> TwoSidedBasis:
  """:math:`(R_U, R_V) = (U_\\text{new}^\\top U_\\text{old}, V_\\text{new}^\\top V_\\text{old})`."""
  transposed = jnp.matrix_transpose
  return TwoSidedBasis(transposed(new.left) @ old.left, transposed(new.right) @ old.right)


def carry(rotation: TwoSidedBasis, core: jax.Array) -> jax.Array:
  """:math:`R_U C R_V^\\top`."""
  return rotation.left @ core @ jnp.matrix_transpose(rotation.right)


def init(p: int, q: int, rank: int):
  """``init``: orthonormal U and V from a key (split in two); zeros without one."""

  def init_fn(key):
    if key is None:
      return TwoSidedBasis(jnp.zeros((p, rank), jnp.float32), jnp.zeros((q, rank), jnp.float32))
    left_key, right_key = jax.random.split(key)
    return TwoSidedBasis(
      one_sided.random_q(left_key, p, rank), one_sided.random_q(right_key, q, rank)
    )

  return init_fn


def strategy(p: int, q: int, rank: int, compute) -> strategy_lib.BasisStrategy:
  r"""The two-sided :class:`~lordo_jax.local.bases.strategy.BasisStrategy` of a ``p x q`` matrix.

  For a ``p x q`` matrix with orthonormal U (``p x r``) and V (``q x r``):

  .. math::
    C = U^\top A V \quad (r \times r), \qquad A \approx U C V^\top

  A change of bases is the pair :math:`R_U = U_\text{new}^\top U_\text{old}`,
  :math:`R_V = V_\text{new}^\top V_\text{old}`, and acts on a core as
  :math:`R_U C R_V^\top` (LDAdam's rule on both sides).

  ``side`` is ``"left"``: the full-rank scale of a core is a scalar, and has no side.
  """
  return strategy_lib.StrategyFunctions(
    init=init(p, q, rank),
    compute=compute,
    exact=None,
    dense=lambda basis: basis,
    project=project,
    unproject=unproject,
    change_of_basis=change_of_basis,
    carry=carry,
    coordinates_shape=(rank, rank),
    side="left",
  )
