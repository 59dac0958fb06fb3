r"""The basis strategy: one projection method, for one ``p x q`` matrix, as a value.

Low-rank Adam (:mod:`lordo_jax.local._low_rank_adam`) keeps each matrix's moments in the
coordinates of a basis, and only asks the basis a few things. A
:class:`BasisStrategy` answers them for one matrix (its shape, rank and side are
known when it is made):

.. math::
  c = \mathrm{project}(Q, A), \qquad A \approx \mathrm{unproject}(Q, c), \qquad
  (Q', \mathrm{ok}) = \mathrm{compute}(X, Q, \mathrm{key}), \qquad
  R = \mathrm{overlap}(Q', Q)

and ``carry(R, c)`` applies the change of basis R to coordinates (``R c`` on the
left, ``c R^T`` on the right, ``R_U c R_V^T`` two-sided), which is all the
``rotate`` transport needs. A :class:`Method` makes the strategy of every matrix
shape, and computes the bases of the workers' mean of several matrices at once
given a ``mean`` function (the strategies never communicate: the caller's ``mean``
does). Adding a projection method is adding one file that returns a
:class:`Method`, and one line in :mod:`lordo_jax.local.bases`.

Every refresh keeps the previous basis where its result is not finite
(``ok=False``). Bases have canonical signs: each column's largest-magnitude entry is
positive, so every worker and any reference agree on the basis, not only its span.
"""

from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp

from lordo_jax.local.bases import layout

Mean = Callable[[list], list]  # Averages a list of arrays over the workers (or not).


class BasisStrategy(NamedTuple):
  """How one ``p x q`` matrix is projected: its basis's kind, side and shapes."""

  init: Callable  # key -> a random basis; None -> a placeholder, replaced before use.
  compute: Callable  # (matrix, previous, key) -> (basis, ok): a refresh, warm-started.
  exact: Callable | None  # Like compute, for a run's first basis where it differs.
  dense: Callable  # basis -> the form project, unproject take (formed once a step).
  project: Callable  # (dense, p x q matrix) -> coordinates.
  unproject: Callable  # (dense, coordinates) -> p x q matrix.
  overlap: Callable  # (new basis, old basis) -> R, the change of basis.
  carry: Callable  # (R, coordinates) -> R applied to them (and to R * R alike).
  coordinates_shape: tuple[int, int]  # r x q (left), p x r (right), r x r (two-sided).
  side: str  # "left" or "right": the axis of the coordinates that is the rank's.
  # The matrix's (rows, cols) mesh axes -> the coordinates' (the same sharding).
  coordinates_spec: Callable = lambda matrix_spec: (None, None)
  # The matrix (its sharding) -> the stored basis's mesh axes (None: kept whole).
  basis_spec: Callable = lambda matrix: None


class Method(NamedTuple):
  """A projection method: the strategy of each matrix shape, and bases of a mean."""

  strategy: Callable  # (p, q) -> the BasisStrategy of a p x q matrix.
  # (strategies, matrices, previous, keys, first, mean) -> [(basis, ok)]: the bases
  # of the workers' mean of each matrix; see :func:`bases_of_mean`.
  bases_of_mean: Callable


class Options(NamedTuple):
  """The options a method may read; each reads only its own."""

  rank: int  # r.
  side: str = "auto"  # One-sided: "auto" (left when p >= q), "left", "right", "galore_std".
  subspace_iterations: int = 2  # Steps of subspace iteration per refresh.
  oversample: int = 8  # Extra sketch columns of the randomized SVD.
  power_iterations: int = 1  # Power iterations of the randomized SVD.


def canonical_signs(q: jax.Array) -> jax.Array:
  """Flips each column of ``q`` so that its largest-magnitude entry is positive."""
  rows = jnp.argmax(jnp.abs(q), axis=0)
  # The pivot of each column as a masked sum, not a gather: q may be split by rows.
  at_pivot = layout.row_indices(q) == rows[None, :]
  pivots = jnp.sum(q * at_pivot.astype(q.dtype), axis=0)
  return q * jnp.where(pivots < 0, -1.0, 1.0).astype(q.dtype)


def checked(basis: Any, previous: Any) -> tuple[Any, jax.Array]:
  """``(basis, ok)``: ``ok`` is true where every entry is finite; else ``previous``.

  The basis is laid out as ``previous`` is (its sharding over ``Explicit`` mesh axes).
  """
  finite = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(basis)]
  ok = finite[0]
  for more in finite[1:]:
    ok = ok & more
  kept = lambda new, old: jnp.where(ok, layout.like(new, old), old)  # noqa: E731
  return jax.tree.map(kept, basis, previous), ok


def new_basis(strategy: BasisStrategy, matrix, previous, key, first) -> tuple[Any, jax.Array]:
  """``(basis, ok)`` of one refresh; ``first`` (bool, or a traced bool) picks ``exact``."""
  exact = strategy.exact or strategy.compute
  if first is True:
    return exact(matrix, previous, key)
  if first is False or strategy.exact is None:
    return strategy.compute(matrix, previous, key)
  return jax.lax.cond(
    first, lambda: exact(matrix, previous, key), lambda: strategy.compute(matrix, previous, key)
  )


def bases_of_mean(strategies, matrices, previous, keys, first, mean: Mean) -> list:
  r"""The bases of :math:`\bar X = \mathrm{mean}(X)` for each matrix: average, then compute.

  The default of :attr:`Method.bases_of_mean`: one ``mean`` of all the matrices, then
  each basis from its averaged matrix. ``mean`` may be the identity (a local refresh).
  """
  averaged = mean(matrices)
  return [
    new_basis(s, x, p, k, first)
    for s, x, p, k in zip(strategies, averaged, previous, keys, strict=True)
  ]
