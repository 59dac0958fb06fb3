"""What an optimizer state says about a run, read on the host each logging step.

All of it comes from the state through the public ``lordo_jax`` API: the bytes
all-reduced so far (the ledger), the number of synchronisation rounds, how far the
low-rank bases turned since the last reading (principal angles), the norm of the
error-feedback buffer, and the bytes of the optimizer state itself. A state stacked
over workers (a leading worker axis) is read from worker 0 (its bytes: one worker's
share); after a sync all workers agree.
"""

import math
from typing import Any

import jax
import numpy as np

import lordo_jax

HOST_KINDS = ("pinned_host", "unpinned_host")  # Memory kinds of host memory.


def _nodes(state: Any, cls: type) -> list:
  is_node = lambda x: isinstance(x, cls)  # noqa: E731
  return [x for x in jax.tree.leaves(state, is_leaf=is_node) if is_node(x)]


def _worker0(x: Any) -> np.ndarray:
  return np.asarray(jax.device_get(x))[0]


def rounds(state: Any) -> int:
  """Synchronisation rounds completed, from the ``SynchronizeState``'s sync counters.

  With streaming fragments a round is complete when its last fragment has synced
  (the fewest syncs of any fragment). A method without one (DDP, low-rank DDP)
  communicates every step: its rounds are its all-reduce calls.
  """
  syncs = _nodes(state, lordo_jax.SynchronizeState)
  if not syncs:
    return lordo_jax.all_reduce_count(state)
  return int(np.min(_worker0(syncs[0].syncs)))


def error_norm(state: Any) -> float | None:
  """Frobenius norm of all error-feedback buffers of worker 0; None when they are off."""
  errors = [
    _worker0(e) for m in _nodes(state, lordo_jax.LowRankMoments) for e in jax.tree.leaves(m.error)
  ]
  if not errors:
    return None
  return math.sqrt(sum(float(np.sum(np.square(e, dtype=np.float64))) for e in errors))


class ProjectionTracker:
  """Similarity of each reading's low-rank bases with the previous reading's.

  The similarity of two bases is the mean cosine of their principal angles (1: the
  same subspace, 0: orthogonal), averaged over all matrices. A state whose bases are
  still the all-zero placeholders of ``init`` (the first basis comes with the first
  gradient) has no basis yet.
  """

  def __init__(self):
    self.previous: list[np.ndarray] | None = None

  def __call__(self, state: Any) -> float | None:
    """The similarity with the last call's bases (None on the first call, or none)."""
    if not _nodes(state, lordo_jax.LowRankAdamState):
      return None
    bases = [_worker0(q) for q in jax.tree.leaves(lordo_jax.projections(state))]
    if not any(np.any(q) for q in bases):
      return None
    previous, self.previous = self.previous, bases
    if previous is None or not bases:
      return None
    cosines = [
      float(np.mean(np.cos(np.asarray(lordo_jax.principal_angles(a, b)))))
      for a, b in zip(previous, bases, strict=True)
    ]
    return float(np.mean(cosines))


def state_bytes(state: Any) -> dict[str, int]:
  """Bytes of one worker's optimizer state: device, host, offloadable, total, per device.

  ``lordo_jax.state_bytes`` of the state stacked over the workers, divided by their
  number: ``"device"`` and ``"host"`` are where the arrays really are (``"host"`` is 0
  unless the method offloads), ``"offloadable"`` what ``offload=True`` keeps in host
  memory, and ``"total"`` is ``device + host``. These count whole arrays: a worker's
  state split over FSDP devices counts once. ``"per_device"`` is what one device holds
  in its own memory, its shard of every device-resident leaf: ``"device"`` divided by
  the FSDP ways, but for the leaves that stay whole (bases, scalars).
  """
  workers = jax.tree.leaves(state)[0].shape[0]
  parts = {str(k): int(v) // workers for k, v in lordo_jax.state_bytes(state).items()}
  per_device = sum(
    math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
    for x in jax.tree.leaves(state)
    if x.sharding.memory_kind not in HOST_KINDS
  )
  return parts | {"total": parts["device"] + parts["host"], "per_device": per_device}


def step_metrics(state: Any, tracker: ProjectionTracker) -> dict[str, Any]:
  """Everything above for one logging step, as a JSON-ready dict."""
  return {
    "bytes": lordo_jax.communicated_bytes(state),
    "all_reduces": lordo_jax.all_reduce_count(state),
    "rounds": rounds(state),
    "projection_similarity": tracker(state),
    "error_norm": error_norm(state),
  }
