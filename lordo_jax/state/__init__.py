"""What to do with an optimizer state: read it, place it, start from another.

Bytes sent, state bytes and current bases (``_accounting``), the shardings of a fresh
state (``_placement``), a warm start from another run's state (``_warm_start``) and a
state stacked over M workers remapped to another number (``_worker_count``).
Checkpoints are :mod:`lordo_jax.checkpoint`.
"""

from lordo_jax.state._accounting import all_reduce_count
from lordo_jax.state._accounting import communicated_bytes
from lordo_jax.state._accounting import communicated_elements
from lordo_jax.state._accounting import projections
from lordo_jax.state._accounting import state_bytes
from lordo_jax.state._accounting import step_count
from lordo_jax.state._placement import state_sharding
from lordo_jax.state._warm_start import warm_start_state
from lordo_jax.state._worker_count import remap_workers

__all__ = [
  "all_reduce_count",
  "communicated_bytes",
  "communicated_elements",
  "projections",
  "remap_workers",
  "state_bytes",
  "state_sharding",
  "step_count",
  "warm_start_state",
]
