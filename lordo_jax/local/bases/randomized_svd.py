r"""One-sided randomized SVD: Q from a Gaussian sketch, the range finder's l columns
cut to the r that matter (Halko, Martinsson and Tropp, 2011).

:func:`ranges` is the range finder both randomized methods share (its docstring has the
sketch and the power iterations); :func:`one_sided_bases` computes the bases of several
matrices, or of the workers' mean from averaged products (its docstring has the
algorithm, its accuracy, its cost and the references); :func:`method` is the one-sided
randomized-SVD :class:`~lordo_jax.local.bases.strategy.Method`;
:mod:`lordo_jax.local.bases.two_sided_randomized_svd` keeps both sides.
"""

import jax
import jax.numpy as jnp

from lordo_jax import _sharded as sharded
from lordo_jax.local.bases import one_sided
from lordo_jax.local.bases import strategy as strategy_lib


def sketch_width(shape: tuple[int, int], rank: int, oversample: int) -> int:
  """l = r + oversample, at most min(p, q)."""
  return min(rank + oversample, *shape)


def times(x: jax.Array, y: jax.Array, left: bool) -> jax.Array:
  """:math:`X Y` (``left``) or :math:`X^\\top Y`, never gathering a split X."""
  return sharded.product(x, y) if left else sharded.product(jnp.matrix_transpose(x), y)


def gaussian(keys: jax.Array, shape: tuple[int, int]) -> jax.Array:
  """A standard normal float32 matrix of ``shape`` per key (``keys``: one, or a batch)."""
  draw = jax.vmap(lambda key: jax.random.normal(key, shape, jnp.float32))
  return draw(jnp.reshape(keys, (-1,))).reshape(*jnp.shape(keys), *shape)


def ranges(
  matrices: list[jax.Array],
  keys: list[jax.Array],
  lefts: list[bool],
  *,
  rank: int,
  oversample: int,
  power_iterations: int,
  mean: strategy_lib.Mean,
) -> list[jax.Array]:
  r"""The range finder: an orthonormal ``n x l`` Q per matrix.

  With a Gaussian sketch :math:`\Omega` (``q x l``, :math:`l = r + \text{oversample}`
  capped at :math:`\min(p, q)`, drawn from a key that every worker derives alike from
  the seed and the step), the range finder of :func:`ranges` is

  .. math::
    Y = X \Omega,\ Q = \mathrm{qr}(Y); \quad
    \text{repeat } k \text{ times: } Q = \mathrm{qr}(X\, \mathrm{qr}(X^\top Q))

  (the right case is the left case of :math:`X^\top`, from a ``p x l`` sketch).

  Args:
    matrices: float32 ``p x q`` matrices.
    keys: one PRNG key per matrix; it draws the sketch :math:`\Omega`.
    lefts: per matrix, whether Q spans the range of X (``n = p``, the sketch is
      ``q x l``) or of :math:`X^\top` (``n = q``, the sketch is ``p x l``).
    rank, oversample: ``l = min(rank + oversample, p, q)``.
    power_iterations: k.
    mean: applied to each list of products with the matrices (one call per pass).

  Returns:
    ``(qs, oks)``: one Q per matrix, split by rows where the products are, and one
    ``ok`` per matrix, false where an orthonormalisation failed. Leading axes of a
    matrix (and of its key) are a batch, sketched at once.
  """

  def sketch(x: jax.Array, key: jax.Array, left: bool) -> jax.Array:
    """Omega: Gaussian, ``q x l`` on the left, ``p x l`` on the right."""
    width = sketch_width(x.shape[-2:], rank, oversample)
    return gaussian(key, (x.shape[-1] if left else x.shape[-2], width))

  oks = [True] * len(matrices)

  def orthonormal_products(factors: list[jax.Array], flip: bool) -> list[jax.Array]:
    """orth(mean(X F)) per matrix on the left, orth(mean(X^T F)) on the right (or,
    with ``flip``, the other way round)."""
    pairs = zip(matrices, factors, lefts, strict=True)
    products = mean([times(x, f, left != flip) for x, f, left in pairs])
    results = sharded.orthonormal(products)
    oks[:] = [ok & new_ok for ok, (_, new_ok) in zip(oks, results, strict=True)]
    return [q for q, _ in results]

  sketches = [sketch(x, key, left) for x, key, left in zip(matrices, keys, lefts, strict=True)]
  qs = orthonormal_products(sketches, False)
  for _ in range(power_iterations):
    qs = orthonormal_products(orthonormal_products(qs, True), False)
  return qs, oks


def one_sided_bases(
  matrices: list[jax.Array],
  rank: int,
  keys: list[jax.Array],
  lefts: list[bool],
  *,
  oversample: int,
  power_iterations: int,
  mean: strategy_lib.Mean = lambda xs: xs,
) -> list[jax.Array]:
  r"""One-sided randomized SVD bases of several matrices at once.

  For the left case (Q is ``p x r``), with the range finder of
  :func:`ranges` (a ``q x l`` sketch :math:`\Omega`,
  :math:`l = r + \text{oversample}` capped at :math:`\min(p, q)`, k power iterations):

  .. math::
    Y = X \Omega,\ Q_l = \mathrm{qr}(Y); \quad
    \text{k times: } Q_l = \mathrm{qr}(X\, \mathrm{qr}(X^\top Q_l)); \quad
    B = Q_l^\top X = U_B \Sigma V_B^\top, \quad Q = Q_l U_B[:, :r]

  with canonical signs. The right case (Q is ``q x r``) is the left case of
  :math:`X^\top`: a ``p x l`` sketch, :math:`Y = X^\top \Omega`, and
  :math:`B = Q_l^\top X^\top = (X Q_l)^\top` (formed as :math:`X Q_l`, never
  transposing X). Q approximates the top-r singular vectors of X, exactly when X has
  rank at most l; cost :math:`O(pql)` per pass against an SVD's :math:`O(pq\min(p, q))`.

  :math:`U_B` comes from the SVD of the core B itself, not from the eigenvectors of its
  ``l x l`` Gram :math:`B B^\top`: the Gram squares the singular values, so in float32
  its top-r eigenvectors would err by about
  :math:`\epsilon\,\sigma_1^2 / (\sigma_r^2 - \sigma_{r+1}^2)` instead of
  :math:`\epsilon\,\sigma_1 / (\sigma_r - \sigma_{r+1})`, a factor
  :math:`\sigma_1 / (\sigma_r + \sigma_{r+1})` worse. B is only ``l x q`` (``l x p`` on
  the right), so where X is split over a worker group's ``Explicit`` mesh axes,
  gathering B for its SVD is cheap. Every product with X goes through
  :func:`lordo_jax._sharded.product` and every ``n x l`` factor through
  :func:`lordo_jax._sharded.orthonormal` (shifted Cholesky-QR when split by
  rows, which needs the factor well conditioned: a failed refresh keeps the previous
  basis), so nothing ``p x q`` is gathered.

  Every product with X is linear in X: the bases of the workers' mean matrix come from
  the workers' averaged products (this function with a ``mean``), ``n x l`` messages
  instead of the ``p x q`` matrix, as for the two-sided method.

  Args:
    matrices: ``p x q`` matrices (each worker's own, when ``mean`` averages).
    rank: r.
    keys: one PRNG key per matrix, the same on every worker.
    lefts: per matrix, whether Q is ``p x r`` (left) or ``q x r`` (right).
    oversample: extra sketch columns, l = r + oversample.
    power_iterations: k.
    mean: applied to each list of products with the matrices, e.g. a counted
      ``pmean`` over the workers; the identity (default) takes the bases of the
      matrices themselves. One call per pass, so all matrices share each message.

  Returns:
    ``(bases, oks)``: one float32 Q per matrix, canonical signs (not yet checked for
    finiteness), and the ``ok`` of its orthonormalisations. Leading axes of a matrix
    (and of its key) are a batch, computed at once.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> column = jnp.arange(1.0, 7.0)
    >>> x = jnp.outer(column, jnp.ones(4))  # rank 1: Q is the normalised column
    >>> keys = [jax.random.key(0)]
    >>> (q,), _ = one_sided_bases([x], 1, keys, [True], oversample=2, power_iterations=1)
    >>> bool(jnp.allclose(q[:, 0], column / jnp.linalg.norm(column), atol=1e-5))
    True

  References:
    Halko, Martinsson and Tropp, Finding structure with randomness, 2011
    (arXiv 0909.4061), algorithms 4.4 and 5.1.
  """
  xs = [x.astype(jnp.float32) for x in matrices]
  sketched = dict(rank=rank, oversample=oversample, power_iterations=power_iterations, mean=mean)
  qs, oks = ranges(xs, keys, lefts, **sketched)
  # The transposed core B^T = X^T Q_l (left) or X Q_l (right), n' x l: its right
  # singular vectors are U_B.
  transposed_cores = mean([times(x, q, not left) for x, q, left in zip(xs, qs, lefts, strict=True)])
  bases = []
  for q, core in zip(qs, transposed_cores, strict=True):
    vh = sharded.svd(core)[2]  # Gathers n' x l at most.
    bases.append(strategy_lib.canonical_signs(q @ jnp.matrix_transpose(vh[..., :rank, :])))
  return bases, oks


def method(options: strategy_lib.Options) -> strategy_lib.Method:
  """The one-sided randomized-SVD :class:`~lordo_jax.local.bases.strategy.Method`."""
  sketched = dict(oversample=options.oversample, power_iterations=options.power_iterations)

  def compute(left: bool):
    def compute_fn(x, previous, key):
      (basis,), (ok,) = one_sided_bases([x], options.rank, [key], [left], **sketched)
      return strategy_lib.checked(basis, previous, x.ndim - 2, ok)

    return compute_fn

  def bases_of_mean(strategies, matrices, previous, keys, first, mean):
    """The bases of the mean, from averaged products; the first is like any other."""
    del first
    lefts = [s.side == "left" for s in strategies]
    bases, oks = one_sided_bases(matrices, options.rank, keys, lefts, mean=mean, **sketched)
    entries = zip(bases, previous, matrices, oks, strict=True)
    return [strategy_lib.checked(b, p, x.ndim - 2, ok) for b, p, x, ok in entries]

  return one_sided.dense_method(options, compute)._replace(bases_of_mean=bases_of_mean)
