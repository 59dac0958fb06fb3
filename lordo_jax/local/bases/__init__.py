"""The bases low-rank Adam projects on: one file per projection method.

:func:`method` makes the :class:`~lordo_jax.local.bases.strategy.Method` of a projection
by name, one-sided (``ONE_SIDED``) or two-sided (``TWO_SIDED``); its docstring lists
them. The interface is in :mod:`lordo_jax.local.bases.strategy`. Nothing here
communicates: a refresh of the workers' mean takes the averaging as an argument.
"""

from lordo_jax.local.bases import dct
from lordo_jax.local.bases import randomized_svd
from lordo_jax.local.bases import subspace_iteration
from lordo_jax.local.bases import svd
from lordo_jax.local.bases import two_sided_randomized_svd
from lordo_jax.local.bases import two_sided_svd
from lordo_jax.local.bases.strategy import BasisStrategy
from lordo_jax.local.bases.strategy import Method
from lordo_jax.local.bases.strategy import Options

ONE_SIDED = {
  "svd": svd.method,
  "subspace_iteration": subspace_iteration.method,
  "dct": dct.method,
  "randomized_svd": randomized_svd.method,
}
TWO_SIDED = {"svd": two_sided_svd.method, "randomized_svd": two_sided_randomized_svd.method}


def method(projection: str, *, two_sided: bool, options: Options) -> Method:
  """The :class:`Method` named ``projection`` (one-sided or two-sided), with ``options``.

  A method is a :class:`~lordo_jax.local.bases.strategy.Method` (the interface, in
  :mod:`lordo_jax.local.bases.strategy`): it makes each matrix's
  :class:`~lordo_jax.local.bases.strategy.BasisStrategy` (compute, project, unproject,
  change_of_basis and carry of one ``p x q`` matrix's basis, its side known). One-sided
  (Q is ``p x r`` on the left, ``q x r`` on the right,
  :mod:`lordo_jax.local.bases.one_sided`):

  * ``svd`` (:mod:`lordo_jax.local.bases.svd`): the first r singular vectors;
  * ``subspace_iteration`` (:mod:`lordo_jax.local.bases.subspace_iteration`):
    warm-started from the previous basis, an SVD first;
  * ``dct`` (:mod:`lordo_jax.local.bases.dct`): the r best-scoring DCT-II frequencies;
  * ``randomized_svd`` (:mod:`lordo_jax.local.bases.randomized_svd`): from a
    Gaussian sketch, which workers average instead of their matrices.

  Two-sided (U and V, an ``r x r`` core, :mod:`lordo_jax.local.bases.two_sided`):

  * ``svd`` (:mod:`lordo_jax.local.bases.two_sided_svd`): the top-r singular vectors;
  * ``randomized_svd`` (:mod:`lordo_jax.local.bases.two_sided_randomized_svd`): from
    Gaussian sketches, which workers average instead of their matrices.

  Nothing here communicates: a refresh of the workers' mean takes the averaging as an
  argument.

  Examples:
    >>> import jax.numpy as jnp
    >>> from lordo_jax.local import bases
    >>> svd = bases.method("svd", two_sided=False, options=bases.Options(rank=2))
    >>> s = svd.strategy(8, 4)  # p >= q: projected on the left, Q is 8 x 2
    >>> q, ok = s.compute(jnp.eye(8, 4), s.init(None), None)
    >>> s.project(s.dense(q), jnp.ones((8, 4))).shape, bool(ok)
    ((2, 4), True)
  """
  return (TWO_SIDED if two_sided else ONE_SIDED)[projection](options)


__all__ = ["BasisStrategy", "Method", "ONE_SIDED", "Options", "TWO_SIDED", "method"]
