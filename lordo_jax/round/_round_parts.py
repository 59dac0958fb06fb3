"""The parts of a round that :func:`~lordo_jax.synchronize` chooses once from its
options, typed, for the round (``round/_synchronize.py``) and a message in flight
(``round/_overlap.py``) to share."""

from typing import Any
from typing import NamedTuple

import optax

from lordo_jax.round import _averaging as averaging_lib
from lordo_jax.round import _basis_refresh as basis_refresh
from lordo_jax.round import _periods as periods


class RoundParts(NamedTuple):
  """The parts of a round, chosen once from :func:`~lordo_jax.synchronize`'s options."""

  inner: optax.GradientTransformationExtraArgs  # The local optimizer.
  outer: optax.GradientTransformation  # The outer optimizer, float32 state.
  sync_every: periods.SyncPeriod  # K, or a period function of the step.
  fragments: Any  # F, or a function of the params giving each leaf's fragment.
  averaging: averaging_lib.Averaging  # How messages are averaged; who is present.
  moment_groups: list  # [(period, fields)]: the moments averaged together.
  refresh: basis_refresh.BasisRefresh  # What happens to the low-rank bases.
  axis_name: str | None  # The worker axis.
  offload: bool  # Anchor, outer state and residual in host memory between syncs.
  name: str  # How errors name the method.
  fault_tolerant: bool  # Whether update() takes worker_present.
  overlap: str | None = None  # "round": a whole round in flight (_overlap).
  merge: str | None = None  # How it lands: "eager", "delayed", "rebase" or "streaming".
  merge_alpha: float = 0.0  # The streaming merge's weight of the worker's parameters.
  delay_correction: str = "none"  # The outer step's correction for a round in flight.
  moment_decays: tuple = (0.9, 0.999)  # (b1, b2) of the inner optimizer's moments.
  compression: str | None = None  # The codec of the pseudo-gradient, if any.
