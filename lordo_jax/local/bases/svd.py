r"""One-sided SVD: Q is the first r singular vectors of X on the projected side.

:func:`top_singular_vectors` computes Q (its docstring has the definition),
:func:`compute` is the refresh of one side, and :func:`method` the one-sided SVD
:class:`~lordo_jax.local.bases.strategy.Method`.
"""

import jax
import jax.numpy as jnp

from lordo_jax import _sharded as sharded
from lordo_jax.local.bases import one_sided
from lordo_jax.local.bases import strategy as strategy_lib


def top_singular_vectors(x: jax.Array, rank: int, left: bool) -> jax.Array:
  r"""The first ``rank`` left (or right) singular vectors of ``x``, canonical signs.

  .. math::
    X = U \Sigma V^\top, \qquad Q = U_{:, :r} \ \text{(left)}, \quad Q = V_{:, :r}
    \ \text{(right)}

  ordered by singular value, with canonical signs, in float32 whatever the parameter
  dtype (:func:`compute` casts ``x``). Leading axes of ``x`` are a batch of matrices,
  decomposed in one batched call. The right case takes the right singular vectors
  of X itself, not the left ones of its transpose (a transpose inside the caller's sync
  branch made XLA copy whole matrices on every local step).
  """
  u, _, vh = sharded.svd(x)  # Gathers a split x.
  q = u[..., :rank] if left else jnp.matrix_transpose(vh[..., :rank, :])
  return strategy_lib.canonical_signs(q)


def compute(rank: int, left: bool):
  """``compute(x, previous, key) -> (Q, ok)`` of the SVD on one side."""

  def compute_fn(x, previous, key):
    del key
    basis = top_singular_vectors(x.astype(jnp.float32), rank, left)
    return strategy_lib.checked(basis, previous, x.ndim - 2)

  return compute_fn


def method(options: strategy_lib.Options) -> strategy_lib.Method:
  """The one-sided SVD :class:`~lordo_jax.local.bases.strategy.Method`."""
  return one_sided.dense_method(options, lambda left: compute(options.rank, left))
