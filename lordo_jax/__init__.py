"""lordo_jax: LoRDO, distributed low-rank optimization with infrequent communication.

The public API, re-exported from the layers (docs/ARCHITECTURE.md): ``methods/`` (the
optimizers), ``round/`` (the K-step round), ``comm/`` (every message, counted),
``local/`` (the local step, which never communicates) and ``state/`` (reading,
placing and warm-starting a state); ``checkpoint`` is a public module of its own.
"""

from lordo_jax.comm import Ledger
from lordo_jax.comm import counted_pmean
from lordo_jax.comm import worker_disagreement
from lordo_jax.local import DCTBasis
from lordo_jax.local import GroupedMoments
from lordo_jax.local import LowRankAdam
from lordo_jax.local import LowRankAdamState
from lordo_jax.local import LowRankMoments
from lordo_jax.local import MatrixAxes
from lordo_jax.local import TwoSidedBasis
from lordo_jax.local import compute_projection
from lordo_jax.local import in_float32
from lordo_jax.local import principal_angles
from lordo_jax.local import quasi_hyperbolic_mix
from lordo_jax.local import scale_by_low_rank_adam
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
from lordo_jax.round import SynchronizeState
from lordo_jax.round import compile_overlapped
from lordo_jax.round import overlap_phase
from lordo_jax.round import quadratic_sync_rule
from lordo_jax.round import round_phase
from lordo_jax.round import sync_steps
from lordo_jax.round import synchronize
from lordo_jax.state import all_reduce_count
from lordo_jax.state import communicated_bytes
from lordo_jax.state import communicated_elements
from lordo_jax.state import projections
from lordo_jax.state import remap_workers
from lordo_jax.state import state_bytes
from lordo_jax.state import state_sharding
from lordo_jax.state import step_count
from lordo_jax.state import warm_start_state

__version__ = "0.1.0"

__all__ = [
  "AverageGradientsState",
  "DCTBasis",
  "GroupedMoments",
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
  "compile_overlapped",
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
  "overlap_phase",
  "principal_angles",
  "projections",
  "quadratic_sync_rule",
  "round_phase",
  "quasi_hyperbolic_mix",
  "remap_workers",
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
