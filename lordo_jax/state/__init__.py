"""What to do with an optimizer state: read it, place it, start from another.

Bytes sent, state bytes and current bases (``_accounting``), the shardings of a fresh
state (``_placement``) and a warm start from another run's state (``_warm_start``).
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

__all__ = [
  "all_reduce_count",
  "communicated_bytes",
  "communicated_elements",
  "projections",
  "state_bytes",
  "state_sharding",
  "step_count",
  "warm_start_state",
]
