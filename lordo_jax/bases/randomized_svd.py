r"""Two-sided randomized SVD (Halko, Martinsson and Tropp, 2011): U and V from sketches.

With a Gaussian sketch :math:`\Omega` (``q x l``, :math:`l = r + \text{oversample}`
capped at :math:`\min(p, q)`, drawn from a key that every worker derives alike from
the seed and the step):

.. math::
  Y = X \Omega,\ Q = \mathrm{qr}(Y); \quad
  \text{repeat } k \text{ times: } Q = \mathrm{qr}(X\, \mathrm{qr}(X^\top Q));
  \quad B = Q^\top X = U_B \Sigma V_B^\top, \quad U = Q U_B[:, :r],\ V = V_B[:, :r].

Each product with X is linear in X, so when every worker holds its own
:math:`X_m` and the refresh needs the mean, averaging the products (``p x l`` and
``l x q`` messages) gives exactly the sketch of the mean: no worker ever sends its
``p x q`` matrix. :func:`randomized_bases` takes the averaging as its ``mean``
argument, and is this method's :attr:`~lordo_jax.bases.strategy.Method.bases_of_mean`.

References:
  Halko, Martinsson and Tropp, Finding structure with randomness, 2011
  (arXiv 0909.4061).
"""

import jax
import jax.numpy as jnp

from lordo_jax.bases import layout
from lordo_jax.bases import strategy as strategy_lib
from lordo_jax.bases import two_sided


def sketch_width(shape: tuple[int, int], rank: int, oversample: int) -> int:
  """l = r + oversample, at most min(p, q)."""
  return min(rank + oversample, *shape)


def randomized_bases(
  matrices: list[jax.Array],
  rank: int,
  keys: list[jax.Array],
  *,
  oversample: int,
  power_iterations: int,
  mean: strategy_lib.Mean = lambda xs: xs,
) -> list[two_sided.TwoSidedBasis]:
  """Randomized SVD bases of several matrices at once (see the module docstring).

  Args:
    matrices: ``p x q`` matrices (each worker's own, when ``mean`` averages).
    rank: r.
    keys: one PRNG key per matrix, the same on every worker.
    oversample: extra sketch columns, l = r + oversample.
    power_iterations: k, passes of :math:`X X^\\top` over the range.
    mean: applied to each list of products with the matrices, e.g. a counted
      ``pmean`` over the workers; the identity (default) takes the bases of the
      matrices themselves. One call per pass, so all matrices share each message.

  Returns:
    One :class:`~lordo_jax.bases.two_sided.TwoSidedBasis` per matrix (not yet
    checked for finiteness).
  """
  xs = [layout.whole(x).astype(jnp.float32) for x in matrices]
  sketches = [
    jax.random.normal(key, (x.shape[1], sketch_width(x.shape, rank, oversample)), jnp.float32)
    for x, key in zip(xs, keys, strict=True)
  ]
  orthonormal = lambda ys: [jnp.linalg.qr(y)[0] for y in ys]  # noqa: E731
  ranges = orthonormal(mean([x @ s for x, s in zip(xs, sketches, strict=True)]))
  for _ in range(power_iterations):
    co_ranges = orthonormal(mean([x.T @ q for x, q in zip(xs, ranges, strict=True)]))
    ranges = orthonormal(mean([x @ z for x, z in zip(xs, co_ranges, strict=True)]))
  cores = mean([q.T @ x for x, q in zip(xs, ranges, strict=True)])
  bases = []
  for q, b in zip(ranges, cores, strict=True):
    u, _, vh = jnp.linalg.svd(b, full_matrices=False)
    bases.append(
      two_sided.TwoSidedBasis(
        strategy_lib.canonical_signs(q @ u[:, :rank]),
        strategy_lib.canonical_signs(vh[:rank].T),
      )
    )
  return bases


def method(options: strategy_lib.Options) -> strategy_lib.Method:
  """The randomized-SVD :class:`~lordo_jax.bases.strategy.Method`."""
  sketched = dict(oversample=options.oversample, power_iterations=options.power_iterations)

  def compute(x, previous, key):
    (basis,) = randomized_bases([x], options.rank, [key], **sketched)
    return strategy_lib.checked(basis, previous)

  def make(p: int, q: int) -> strategy_lib.BasisStrategy:
    return two_sided.strategy(p, q, options.rank, compute)

  def bases_of_mean(strategies, matrices, previous, keys, first, mean):
    """The bases of the mean, from averaged sketches; the first is like any other."""
    del strategies, first
    bases = randomized_bases(matrices, options.rank, keys, mean=mean, **sketched)
    return [strategy_lib.checked(b, p) for b, p in zip(bases, previous, strict=True)]

  return strategy_lib.Method(make, bases_of_mean)
