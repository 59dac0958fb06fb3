"""The local step: what a worker computes between syncs. Nothing here communicates.

Low-rank Adam (:func:`scale_by_low_rank_adam`, moments in each matrix's subspace,
error feedback, moment transport), the quasi-hyperbolic full-rank term, which leaves
are matrices (:class:`MatrixAxes`), float32 moments for any parameter dtype, and the
bases (``bases/``, one file per projection method, with their function-level API).
"""

from lordo_jax.local._low_rank_adam import LowRankAdam
from lordo_jax.local._low_rank_adam import LowRankAdamState
from lordo_jax.local._low_rank_adam import LowRankMoments
from lordo_jax.local._low_rank_adam import scale_by_low_rank_adam
from lordo_jax.local._low_rank_options import LowRankOptions
from lordo_jax.local._moment_groups import GroupedMoments
from lordo_jax.local._precision import in_float32
from lordo_jax.local._projection import DCTBasis
from lordo_jax.local._projection import compute_projection
from lordo_jax.local._projection import principal_angles
from lordo_jax.local._quasi_hyperbolic import quasi_hyperbolic_mix
from lordo_jax.local._routing import MatrixAxes
from lordo_jax.local._two_sided_projection import TwoSidedBasis

__all__ = [
  "DCTBasis",
  "GroupedMoments",
  "LowRankAdam",
  "LowRankAdamState",
  "LowRankMoments",
  "LowRankOptions",
  "MatrixAxes",
  "TwoSidedBasis",
  "compute_projection",
  "in_float32",
  "principal_angles",
  "quasi_hyperbolic_mix",
  "scale_by_low_rank_adam",
]
