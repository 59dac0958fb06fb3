"""The K-step round: local steps, and a synchronisation at the end of every round.

:func:`synchronize` wraps a local optimizer; its parts are a module each: when a
round ends (``_periods``: ``sync_every`` as an int, a function or the quadratic rule;
``_schedule``: which fragments sync at a step), how messages are averaged
(``_averaging``), the pseudo-gradient and outer step (``_outer_step``), the moments
(``_moment_averaging``), the bases (``_basis_refresh``), failed workers
(``_faults``), host offload (``_offload``), a message in flight (``_overlap``; a step
compiled for it: ``_overlap_compile``) and local steps without the round (``_round_phase``).
"""

from lordo_jax.round._overlap import overlap_phase
from lordo_jax.round._overlap_compile import compile_overlapped
from lordo_jax.round._periods import quadratic_sync_rule
from lordo_jax.round._periods import sync_steps
from lordo_jax.round._round_phase import round_phase
from lordo_jax.round._synchronize import SynchronizeState
from lordo_jax.round._synchronize import synchronize

__all__ = [
  "SynchronizeState",
  "compile_overlapped",
  "overlap_phase",
  "quadratic_sync_rule",
  "round_phase",
  "sync_steps",
  "synchronize",
]
