"""lordo_jax: LoRDO, distributed low-rank optimization with infrequent communication.

The public API. Every name here is documented with its math; see README.md for a
table and SPEC.md for the mathematics.
"""

from lordo_jax.accounting import all_reduce_count
from lordo_jax.accounting import communicated_bytes
from lordo_jax.accounting import communicated_elements
from lordo_jax.accounting import projections
from lordo_jax.accounting import state_bytes
from lordo_jax.accounting import step_count
from lordo_jax.agreement import worker_disagreement
from lordo_jax.collectives import Ledger
from lordo_jax.collectives import counted_pmean
from lordo_jax.low_rank import LowRankAdam
from lordo_jax.low_rank import LowRankAdamState
from lordo_jax.low_rank import LowRankMoments
from lordo_jax.low_rank import scale_by_low_rank_adam
from lordo_jax.methods.data_parallel import AverageGradientsState
from lordo_jax.methods.data_parallel import average_gradients
from lordo_jax.methods.data_parallel import ddp
from lordo_jax.methods.data_parallel import low_rank_ddp
from lordo_jax.methods.local_updates import desloc
from lordo_jax.methods.local_updates import diloco
from lordo_jax.methods.local_updates import local_adam
from lordo_jax.methods.lordo import lordo
from lordo_jax.methods.lordo import lordo_global_projection_only
from lordo_jax.methods.lordo import lordo_local_projection
from lordo_jax.placement import state_sharding
from lordo_jax.precision import in_float32
from lordo_jax.projection import DCTBasis
from lordo_jax.projection import compute_projection
from lordo_jax.projection import principal_angles
from lordo_jax.quasi_hyperbolic import quasi_hyperbolic_mix
from lordo_jax.routing import MatrixAxes
from lordo_jax.schedules import quadratic_sync_rule
from lordo_jax.schedules import sync_steps
from lordo_jax.sync import SynchronizeState
from lordo_jax.sync import synchronize
from lordo_jax.two_sided import TwoSidedBasis
from lordo_jax.warm_start import warm_start_state

__version__ = "0.1.0"

__all__ = [
  "AverageGradientsState",
  "DCTBasis",
  "Ledger",
  "LowRankAdam",
  "LowRankAdamState",
  "LowRankMoments",
  "MatrixAxes",
  "SynchronizeState",
  "all_reduce_count",
  "average_gradients",
  "communicated_bytes",
  "communicated_elements",
  "compute_projection",
  "counted_pmean",
  "ddp",
  "desloc",
  "diloco",
  "in_float32",
  "local_adam",
  "lordo",
  "lordo_global_projection_only",
  "lordo_local_projection",
  "low_rank_ddp",
  "principal_angles",
  "projections",
  "quadratic_sync_rule",
  "quasi_hyperbolic_mix",
  "scale_by_low_rank_adam",
  "state_bytes",
  "state_sharding",
  "step_count",
  "sync_steps",
  "synchronize",
  "TwoSidedBasis",
  "warm_start_state",
  "worker_disagreement",
]
