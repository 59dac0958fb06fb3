r"""Two-sided low-rank projection (TSR-Adam): moments and messages in an ``r x r`` core.

The function-level face of the two-sided bases of :mod:`lordo_jax.local.bases`
(:mod:`~lordo_jax.local.bases.two_sided` for what U and V share,
:mod:`~lordo_jax.local.bases.two_sided_svd`,
:mod:`~lordo_jax.local.bases.two_sided_randomized_svd`):
:func:`compute_basis` (whose docstring has the mathematics), :func:`random_basis`,
:func:`randomized_bases`.
"""

import jax

from lordo_jax.local import bases as bases_lib
from lordo_jax.local.bases.two_sided import TwoSidedBasis
from lordo_jax.local.bases.two_sided_randomized_svd import randomized_bases
from lordo_jax.local.bases.two_sided_svd import top_singular_vectors as svd_basis

METHODS = tuple(bases_lib.TWO_SIDED)

__all__ = [
  "METHODS",
  "TwoSidedBasis",
  "compute_basis",
  "random_basis",
  "randomized_bases",
  "svd_basis",
]


def _strategy(p: int, q: int, method: str, rank: int, **sketch) -> bases_lib.BasisStrategy:
  options = bases_lib.Options(rank, **sketch)
  return bases_lib.method(method, two_sided=True, options=options).strategy(p, q)


def random_basis(key: jax.Array, p: int, q: int, rank: int) -> TwoSidedBasis:
  """Orthonormal U (``p x r``) and V (``q x r``) from ``key``."""
  return _strategy(p, q, "svd", rank).init(key)


def compute_basis(
  x: jax.Array,
  previous: TwoSidedBasis,
  method: str,
  rank: int,
  key: jax.Array,
  *,
  oversample: int,
  power_iterations: int,
) -> tuple[TwoSidedBasis, jax.Array]:
  r"""U and V of one matrix, ``(basis, ok)``; ``ok`` false keeps ``previous``.

  For a ``p x q`` matrix with orthonormal bases U (``p x r``) and V (``q x r``), the
  low-rank path of MATH.md §3 keeps its coordinates in the core

  .. math::
    C = U^\top A V \quad (r \times r), \qquad L = U X V^\top,

  so the Adam moments are ``r x r`` instead of ``r x q``, and a per-step all-reduce of
  the coordinates (low-rank DDP with ``communicate="projected"``) sends
  :math:`r^2` numbers per matrix instead of :math:`r q`. The error-feedback residual is
  :math:`E = A - U C V^\top`.

  A refresh takes U and V from a matrix X (the averaged pseudo-gradient in LoRDO, the
  mean gradient in low-rank DDP), each with canonical signs (largest-magnitude entry
  of each column positive):

  * ``svd``: the top-r left and right singular vectors of X;
  * ``randomized_svd`` (Halko, Martinsson and Tropp, 2011): with a Gaussian sketch
    :math:`\Omega` (``q x l``, :math:`l = r + \text{oversample}`, drawn from a key
    that every worker derives alike from the seed and the step),

    .. math::
      Y = X \Omega,\ Q = \mathrm{qr}(Y); \quad
      \text{repeat } k \text{ times: } Q = \mathrm{qr}(X\, \mathrm{qr}(X^\top Q));
      \quad B = Q^\top X = U_B \Sigma V_B^\top, \quad U = Q U_B[:, :r],\ V = V_B[:, :r].

    Each product with X is linear in X, so when every worker holds its own
    :math:`X_m` and the refresh needs the mean, averaging the products
    (``p x l`` and ``l x q`` messages) gives exactly the sketch of the mean: no
    worker ever sends its ``p x q`` matrix (:func:`randomized_bases` takes the
    averaging as its ``mean`` argument; :mod:`lordo_jax.comm._projected_mean` passes it).

  ``rotate`` carries the moments into new bases with :math:`R_U = U_\text{new}^\top
  U_\text{old}` and :math:`R_V = V_\text{new}^\top V_\text{old}` (LDAdam's rule on both
  sides): :math:`u' = R_U u R_V^\top`, and the bias-corrected second moment becomes
  :math:`|(R_U \odot R_U)\,\mathrm{var}\,(R_V \odot R_V)^\top + (R_U \hat m R_V^\top)^2|`
  with :math:`\mathrm{var} = \max(\hat v - \hat m^2, 0)`.

  A refresh from the very gradient it then steps on (low-rank DDP's refresh steps)
  makes the core diagonal: :math:`U^\top G V = \Sigma`. Its off-diagonal entries are
  then float32 rounding, about :math:`10^{-7} \sigma_1`, and on a run's first step,
  where Adam's denominator is :math:`|C| + \epsilon`, they take steps of size
  :math:`|C| / (|C| + \epsilon)`, up to 1 when ``eps`` is below them. Later steps
  divide by the accumulated second moment and do not see it. Two programs that
  round differently (two worker counts, two devices) can therefore differ at step 1
  by up to a learning rate per entry of the core; an ``eps`` above
  :math:`10^{-7} \sigma_1` removes it.

  References:
    Dang et al., From O(mn) to O(r^2): two-sided low-rank communication for Adam
    (TSR-Adam), 2026 (arXiv 2602.08007); Halko,
    Martinsson and Tropp, Finding structure with randomness, 2011 (arXiv 0909.4061);
    Robert et al., LDAdam, 2024 (arXiv 2410.16103).
  """
  sketch = dict(oversample=oversample, power_iterations=power_iterations)
  return _strategy(*x.shape, method, rank, **sketch).compute(x, previous, key)
