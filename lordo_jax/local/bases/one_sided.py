r"""What every one-sided basis shares: its side, and the products with its matrix Q.

:func:`is_left` picks the side (MATH.md §2), :func:`strategy` makes the
:class:`~lordo_jax.local.bases.strategy.BasisStrategy` of a ``p x q`` matrix (its
docstring has the products with Q), and :func:`dense_method` makes the
:class:`~lordo_jax.local.bases.strategy.Method` of a basis stored as its matrix.
"""

import jax
import jax.numpy as jnp

from lordo_jax import _sharded as sharded
from lordo_jax.local.bases import strategy as strategy_lib


def is_left(p: int, q: int, side: str) -> bool:
  """The side of MATH.md §2: ``auto`` projects on the left when p >= q.

  ``galore_std`` (GaLore's standard projection, which keeps the moments on the larger
  dimension) projects on the left when p <= q: the reverse of ``auto``, except that a
  square matrix stays on the left, the input side of a Flax ``in x out`` kernel,
  where GaLore's rule on the PyTorch ``out x in`` weight puts it.
  """
  if side == "galore_std":
    return p <= q
  return side == "left" or (side == "auto" and p >= q)


def random_q(key: jax.Array, size: int, rank: int) -> jax.Array:
  """An orthonormal ``size x rank`` float32 basis from ``key``, canonical signs."""
  q, _ = jnp.linalg.qr(jax.random.normal(key, (size, rank), jnp.float32))
  return strategy_lib.canonical_signs(q)


def dense_init(size: int, rank: int):
  """``init`` of a basis stored as its matrix: random from a key, zeros without."""

  def init(key):
    if key is None:
      return jnp.zeros((size, rank), jnp.float32)
    return random_q(key, size, rank)

  return init


def strategy(
  p: int,
  q: int,
  rank: int,
  left: bool,
  *,
  init,
  compute,
  exact=None,
  dense=sharded.whole,
  change_of_basis=lambda new, old: jnp.matrix_transpose(sharded.whole(new)) @ sharded.whole(old),
  stored_split: bool = True,
) -> strategy_lib.BasisStrategy:
  r"""The one-sided :class:`~lordo_jax.local.bases.strategy.BasisStrategy` of a ``p x q`` matrix.

  For a ``p x q`` matrix, MATH.md §2 projects on the *left* (Q is ``p x r``) when
  ``p >= q`` with ``side="auto"``, else on the *right* (Q is ``q x r``); ``"galore_std"``
  reverses that for rectangular matrices (:func:`is_left`, which gives ``left``):

  .. math::
    \text{left: } c = Q^\top A \ (r \times q),\ A \approx Q c, \qquad
    \text{right: } c = A Q \ (p \times r),\ A \approx c Q^\top

  so every product is a plain row-major matrix product of the leaf's own matrix (no
  transpose of it, which XLA's CPU matmul runs slower). A change of basis
  :math:`R = Q_\text{new}^\top Q_\text{old}` acts on coordinates as ``R c`` on the
  left and ``c R^T`` on the right.

  ``init``, ``compute``, ``exact``, ``dense`` and ``change_of_basis`` are the method's own;
  the products with Q and the shapes follow from the side. With ``stored_split`` the
  stored ``n x r`` basis of a matrix split over a mesh axis (FSDP) is split over that
  axis too, and made whole only where it is used (``dense``, once a step, as FSDP
  gathers a parameter), so the state shrinks with the worker group as the matrix
  does.
  """
  transposed = jnp.matrix_transpose  # Of each matrix of a batch.
  if left:
    project = lambda basis, matrix: transposed(basis) @ matrix  # noqa: E731
    unproject = lambda basis, coordinates: basis @ coordinates  # noqa: E731
    carry = lambda rotation, coordinates: rotation @ coordinates  # noqa: E731
  else:
    project = lambda basis, matrix: matrix @ basis  # noqa: E731
    unproject = lambda basis, coordinates: coordinates @ transposed(basis)  # noqa: E731
    carry = lambda rotation, coordinates: transposed(rotation @ transposed(coordinates))  # noqa: E731
  return strategy_lib.StrategyFunctions(
    init=init,
    compute=compute,
    exact=exact,
    dense=dense,
    project=project,
    unproject=unproject,
    change_of_basis=change_of_basis,
    carry=carry,
    coordinates_shape=(rank, q) if left else (p, rank),
    side="left" if left else "right",
    coordinates_spec=(lambda spec: (None, spec[1])) if left else (lambda spec: (spec[0], None)),
    basis_spec=(lambda spec: sharded.split_rows(p if left else q, spec))
    if stored_split
    else (lambda spec: None),
  )


def dense_method(options: strategy_lib.Options, compute, exact=None) -> strategy_lib.Method:
  """A :class:`~lordo_jax.local.bases.strategy.Method` whose basis is stored as its matrix Q.

  ``compute(left)`` (and ``exact(left)``, if a run's first basis differs) make the
  side's ``(matrix, previous, key) -> (Q, ok)``.
  """

  def make(p: int, q: int) -> strategy_lib.BasisStrategy:
    left = is_left(p, q, options.side)
    return strategy(
      p,
      q,
      options.rank,
      left,
      init=dense_init(p if left else q, options.rank),
      compute=compute(left),
      exact=None if exact is None else exact(left),
    )

  return strategy_lib.MethodFunctions(make, strategy_lib.bases_of_mean)
