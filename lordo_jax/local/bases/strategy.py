r"""The basis strategy: one projection method, for one ``p x q`` matrix, as a value.

:class:`BasisStrategy` is what low-rank Adam (:mod:`lordo_jax.local._low_rank_adam`)
asks of one matrix's basis (its docstring has the interface and the rules every basis
keeps); a :class:`Method` makes the strategy of every matrix shape and the bases of the
workers' mean, and :class:`Options` holds what methods read. :func:`canonical_signs`,
:func:`checked`, :func:`by_first` and :func:`bases_of_mean` are helpers the methods share.
"""

from collections.abc import Callable
from typing import Any
from typing import NamedTuple
from typing import Protocol

import jax
import jax.numpy as jnp

from lordo_jax import _sharded as sharded

Mean = Callable[[list], list]  # Averages a list of arrays over the workers (or not).
Basis = Any  # Q (an array), a DCTBasis, or a TwoSidedBasis (U and V).


class BasisStrategy(Protocol):
  r"""How one ``p x q`` matrix is projected: its basis's kind, side and shapes.

  Low-rank Adam (:mod:`lordo_jax.local._low_rank_adam`) keeps each matrix's moments in
  the coordinates of a basis, and only asks the basis a few things. A
  :class:`BasisStrategy` answers them for one matrix (its shape, rank and side are
  known when it is made):

  .. math::
    c = \mathrm{project}(Q, A), \qquad A \approx \mathrm{unproject}(Q, c), \qquad
    (Q', \mathrm{ok}) = \mathrm{compute}(X, Q, \mathrm{key}), \qquad
    R = \mathrm{change\_of\_basis}(Q', Q)

  and ``carry(R, c)`` applies the change of basis R to coordinates (``R c`` on the
  left, ``c R^T`` on the right, ``R_U c R_V^T`` two-sided), which is all the
  ``rotate`` transport needs. A :class:`Method` makes the strategy of every matrix
  shape, and computes the bases of the workers' mean of several matrices at once
  given a ``mean`` function (the strategies never communicate: the caller's ``mean``
  does). Adding a projection method is adding one file that returns a
  :class:`Method`, and one line in :mod:`lordo_jax.local.bases`.

  Every member also takes a batch: leading axes before the matrix's two (a stack of
  same-shape matrices, a transformer's layers), handled in one batched computation;
  ``compute`` then takes one key per matrix (an array of keys shaped like the batch)
  and returns one ``ok`` per matrix. Every refresh keeps the previous basis where its
  result is not finite (``ok=False``). Bases have canonical signs: each column's
  largest-magnitude entry is positive, so every worker and any reference agree on the
  basis, not only its span.

  Implemented by :class:`StrategyFunctions` (one per matrix, made by a
  :class:`Method`). ``exact`` is ``None`` or, for a run's first basis, a ``compute``
  that differs (an SVD before ``subspace_iteration`` can warm-start).
  """

  exact: Callable | None
  coordinates_shape: tuple[int, int]  # r x q (left), p x r (right), r x r (two-sided).
  side: str  # "left" or "right": the axis of the coordinates that is the rank's.

  def init(self, key: jax.Array | None) -> Basis:
    """A random basis from ``key``; with ``None``, a placeholder replaced before use."""

  def compute(self, matrix: jax.Array, previous: Basis, key) -> tuple[Basis, jax.Array]:
    """``(basis, ok)``: a refresh from ``matrix``, warm-started from ``previous``; ``key``
    (one per matrix) is ``None`` for a method that draws nothing."""

  def dense(self, basis: Basis) -> Any:
    """The form :meth:`project` and :meth:`unproject` take (formed once a step)."""

  def project(self, dense: Any, matrix: jax.Array) -> jax.Array:
    """The coordinates ``c`` of a ``p x q`` matrix."""

  def unproject(self, dense: Any, coordinates: jax.Array) -> jax.Array:
    """The ``p x q`` matrix of coordinates."""

  def change_of_basis(self, new: Basis, old: Basis) -> Any:
    """``R``, the change of basis from ``old`` to ``new``."""

  def carry(self, rotation: Any, coordinates: jax.Array) -> jax.Array:
    """``R`` applied to coordinates (and to ``R * R`` alike)."""

  def coordinates_spec(self, matrix_spec: tuple) -> tuple:
    """The coordinates' mesh axes, from the matrix's (rows, cols) mesh axes."""

  def basis_spec(self, matrix: jax.Array) -> Any:
    """The stored basis's mesh axes, from the matrix (``None``: kept whole)."""


class StrategyFunctions(NamedTuple):
  """A :class:`BasisStrategy` made of functions, one field per member."""

  init: Callable
  compute: Callable
  exact: Callable | None
  dense: Callable
  project: Callable
  unproject: Callable
  change_of_basis: Callable
  carry: Callable
  coordinates_shape: tuple[int, int]
  side: str
  coordinates_spec: Callable = lambda matrix_spec: (None, None)
  basis_spec: Callable = lambda matrix: None


class Method(Protocol):
  """A projection method: the strategy of each matrix shape, and bases of a mean.

  Implemented by :class:`MethodFunctions`.
  """

  def strategy(self, p: int, q: int) -> BasisStrategy:
    """The :class:`BasisStrategy` of a ``p x q`` matrix."""

  def bases_of_mean(
    self, strategies: list, matrices: list, previous: list, keys: list, first, mean: Mean
  ) -> list:
    """``[(basis, ok)]``: the bases of the workers' mean of each matrix
    (:func:`bases_of_mean` is the default: average, then compute)."""


class MethodFunctions(NamedTuple):
  """A :class:`Method` made of functions."""

  strategy: Callable  # (p, q) -> the BasisStrategy of a p x q matrix.
  bases_of_mean: Callable  # As Method.bases_of_mean.


class Options(NamedTuple):
  """The options a method may read; each reads only its own."""

  rank: int  # r.
  side: str = "auto"  # One-sided: "auto" (left when p >= q), "left", "right", "galore_std".
  subspace_iterations: int = 2  # Steps of subspace iteration per refresh.
  oversample: int = 8  # Extra sketch columns of the randomized SVD.
  power_iterations: int = 1  # Power iterations of the randomized SVD.


def canonical_signs(q: jax.Array) -> jax.Array:
  """Flips each column of each ``n x r`` matrix of ``q`` (leading axes: a batch) so
  that its largest-magnitude entry is positive."""
  rows = jnp.argmax(jnp.abs(q), axis=-2)
  # The pivot of each column as a masked sum, not a gather: q may be split by rows.
  at_pivot = sharded.row_indices(q) == rows[..., None, :]
  pivots = jnp.sum(q * at_pivot.astype(q.dtype), axis=-2, keepdims=True)
  return q * jnp.where(pivots < 0, -1.0, 1.0).astype(q.dtype)


def checked(basis: Any, previous: Any, batch_ndim: int = 0, ok=True) -> tuple[Any, jax.Array]:
  """``(basis, ok)``, one ``ok`` per matrix: true where the given ``ok`` holds and every
  entry of the matrix's basis is finite; elsewhere the matrix keeps ``previous``.

  The first ``batch_ndim`` axes of every leaf are a batch of matrices (``ok`` is shaped
  like them). The basis is laid out as ``previous`` is (its sharding over ``Explicit``
  mesh axes).
  """
  for x in jax.tree.leaves(basis):
    ok = ok & jnp.all(jnp.isfinite(x), axis=tuple(range(batch_ndim, x.ndim)))

  def kept(new, old):
    where = jnp.reshape(ok, ok.shape + (1,) * (new.ndim - batch_ndim))
    return jnp.where(where, sharded.like(new, old), old)

  return jax.tree.map(kept, basis, previous), ok


def by_first(first, exact: Callable, compute: Callable):
  """``exact()`` for a run's first basis, else ``compute()``: ``first`` a bool, or a
  traced bool that picks one in a ``lax.cond``."""
  if first is True or first is False:
    return exact() if first else compute()
  return jax.lax.cond(first, exact, compute)


def compute_of(strategy: BasisStrategy, first) -> Callable:
  """The ``compute`` of one refresh: ``exact`` for a run's first basis (:func:`by_first`),
  else ``compute``."""
  if first is False or strategy.exact is None:
    return strategy.compute
  if first is True:
    return strategy.exact
  exact, compute = strategy.exact, strategy.compute
  return lambda x, previous, key: by_first(
    first, lambda: exact(x, previous, key), lambda: compute(x, previous, key)
  )


def bases_of_mean(strategies, matrices, previous, keys, first, mean: Mean) -> list:
  r"""The bases of :math:`\bar X = \mathrm{mean}(X)` for each matrix: average, then compute.

  The default of :attr:`Method.bases_of_mean`: one ``mean`` of all the matrices, then
  each basis from its averaged matrix. ``mean`` may be the identity (a local refresh).
  Each entry may be a batch of matrices of one shape (leading axes), computed at once.
  """
  averaged = mean(matrices)
  return [
    compute_of(s, first)(x, p, k)
    for s, x, p, k in zip(strategies, averaged, previous, keys, strict=True)
  ]
