"""Another number of workers: a state stacked over M workers, remapped to M'.

:func:`remap_workers` starts every new worker from what the saved workers agreed on
(MATH.md §10): shared leaves carried, per-worker moments and residuals averaged, the
parameters on the anchor; a state saved mid-round is refused or its round restarted,
and a message in flight is refused.
"""

import numbers
from typing import Any

import jax
import numpy as np

from lordo_jax.local import _low_rank_adam as low_rank_lib
from lordo_jax.round import _periods as periods
from lordo_jax.round._faults import FaultCounts
from lordo_jax.round._synchronize import SynchronizeState

MID_ROUND = ("restart",)


def _path(path) -> str:
  """A leaf's path as the error names it (a tuple of key entries, or of strings)."""
  if all(isinstance(key, str) for key in path):
    return ".".join(path) or "the round's counters"
  return jax.tree_util.keystr(path)


def _workers_of(params) -> int:
  sizes = {np.shape(x)[0] if np.ndim(x) else None for x in jax.tree.leaves(params)}
  if len(sizes) != 1 or None in sizes:
    raise ValueError(
      "remap_workers: the params must be stacked over the workers along a leading axis "
      f"(every leaf shaped (M, ...)); their leading sizes are {sorted(map(str, sizes))}."
    )
  return sizes.pop()


def _shared(path, x, workers: int):
  """Worker 0's value of a leaf every worker holds alike; refused where they differ."""
  x = np.asarray(x)
  if not (x == x[:1]).all() and not (np.isnan(x) & np.isnan(x[:1])).all():
    raise ValueError(
      f"remap_workers: the workers disagree on {_path(path)}, which every worker holds "
      "alike when the state comes from one run (stacked over workers as the training "
      "loop holds it). A state whose bases differ between workers "
      "(projection_source='local_gradient') cannot be shared out to another number."
    )
  return np.broadcast_to(x[:1], (workers, *x.shape[1:]))


def _averaged(path, x, workers: int):
  """The mean over the workers of a per-worker leaf; integers must agree."""
  x = np.asarray(x)
  if not np.issubdtype(x.dtype, np.inexact):
    return _shared(path, x, workers)
  average = x.astype(np.float64).mean(axis=0).astype(x.dtype)
  return np.broadcast_to(average, (workers, *x.shape[1:]))


def _on_host(tree):
  """Every leaf readable here: a ``jax.Array`` spread over several processes (restored
  in a multi-process run, not fully addressable) gathered whole onto each process's
  host, so that every process computes the same remap. A collective: all must call."""
  from jax.experimental import multihost_utils

  def host(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return x

  return jax.tree.map(host, tree)


def _is_basis(path) -> bool:
  return any(getattr(key, "name", None) == "basis" for key in path)


def _inner(inner_state, workers: int):
  """The inner optimizer's state: bases and integers shared, the rest averaged."""

  def remap(path, x):
    return (_shared if _is_basis(path) else _averaged)(path, x, workers)

  return jax.tree_util.tree_map_with_path(remap, inner_state)


def _round(state: SynchronizeState, sync_every, workers: int, mid_round: str | None, where: str):
  if jax.tree.leaves(state.in_flight):
    raise ValueError(
      f"remap_workers: {where} holds a message in flight (overlap), which is in transit "
      "between the saved workers. Resume on their number, or build the run without "
      "overlap."
    )
  count = int(_shared(("count",), state.count, 1)[0])
  fragments = int(np.shape(state.syncs)[-1])
  ended = count == 0 or periods.sync_steps(sync_every, count)[-1:] == [count]
  at_boundary = fragments == 1 and ended
  if not at_boundary and mid_round is None:
    where_in_round = (
      f"{fragments} fragments sync at staggered steps, so every step is mid-round for some"
      if fragments > 1
      else "the workers have taken their own steps since the last sync"
    )
    raise ValueError(
      f"remap_workers: the state was saved mid-round (update {count}): {where_in_round}, "
      "and a worker's own steps cannot be split between another number of workers. "
      "Pass mid_round='restart' to restart the round from the anchor with the averaged "
      "moments (losing the local steps since the sync, at most K - 1), or resume on "
      "the saved number of workers and save at the round's end."
    )
  with_path = jax.tree_util.tree_map_with_path
  faults = FaultCounts(
    round_ok=np.ones((workers,), bool),  # A new round, or a restarted one.
    excluded=_shared(("faults.excluded",), state.faults.excluded, workers),
    empty_syncs=_shared(("faults.empty_syncs",), state.faults.empty_syncs, workers),
  )
  remapped = SynchronizeState(
    count=_shared(("count",), state.count, workers),
    inner_state=_inner(state.inner_state, workers),
    anchor=with_path(lambda p, x: _shared(p, x, workers), state.anchor),
    outer_state=with_path(lambda p, x: _shared(p, x, workers), state.outer_state),
    ledger=with_path(lambda p, x: _shared(p, x, workers), state.ledger),
    faults=faults,
    syncs=_shared(("syncs",), state.syncs, workers),
    next_sync=_shared(("next_sync",), state.next_sync, workers),
    residual=with_path(lambda p, x: _averaged(p, x, workers), state.residual),
    in_flight=state.in_flight,
  )
  return remapped


def remap_workers(
  params: Any,
  opt_state: Any,
  workers: int,
  *,
  sync_every: periods.SyncPeriod,
  mid_round: str | None = None,
):
  r"""``(params, opt_state)`` stacked over M workers, remapped to ``workers`` (M').

  Every new worker starts from what the M saved workers agreed on (MATH.md §10):

  * the shared state, the anchor, the outer optimizer's state, the bases, the ledger
    and every counter, is worker 0's (a leaf on which the workers differ is refused,
    named);
  * the per-worker moments (low-rank and full-rank, and the error-feedback buffers)
    become their mean, what the next moment average would give; a compressed run's
    residuals :math:`e_m` become :math:`\bar e`, so the next mean still carries what the
    rounding lost, :math:`\frac{1}{M'}\sum_{m'} (\Delta_{m'} + \bar e) = \bar\Delta +
    \bar e`;
  * the parameters are the anchor :math:`\theta`, where the round ended (each worker's
    own landed on it up to the rounding of ``params + (theta - params)``).

  Restore the checkpoint on its own number of workers (into a target stacked over M,
  from ``jax.eval_shape``), remap, then place the result as the new run's loop places a
  fresh state. In a multi-process run every process calls this with the same trees (a
  leaf restored across processes, not fully addressable, is gathered to every host: a
  collective) and gets the whole result; each keeps its own devices' slices with
  ``jax.make_array_from_callback(shape, sharding, lambda index: value[index])`` (or
  ``jax.device_put(value, sharding)``) over the new run's global mesh.

  Args:
    params: the parameters, every leaf stacked ``(M, ...)`` along the workers.
    opt_state: the optimizer state the same way (a :func:`~lordo_jax.synchronize`-based method's:
      LoRDO, DiLoCo, DES-LOC, Local Adam; or any state the workers hold alike, such as
      DDP's).
    workers: M', the number of workers to continue on.
    sync_every: the optimizer's ``sync_every`` (K, or its period function), which says
      whether the saved update ended a round.
    mid_round: what to do with a state saved mid-round, when the workers' parameters
      have left the anchor: ``None`` refuses it (resume on M workers, save at the
      round's end); ``"restart"`` restarts the round from the anchor with the averaged
      moments, losing the local steps since the last sync (at most K - 1); the round
      still ends at the step it would have.

  Returns:
    ``(params, opt_state)`` stacked over ``workers``, NumPy arrays in host memory,
    the same on every process.

  Raises:
    ValueError: a state saved mid-round without ``mid_round``, a message in flight
      (``overlap``), workers that disagree on a leaf they should share (the leaf is
      named), or leaves not stacked over the workers.

  Examples:
    >>> import jax, jax.numpy as jnp, lordo_jax
    >>> tx = lordo_jax.diloco(1e-2, sync_every=4, axis_name=None)
    >>> params = {"w": jnp.ones((8, 3, 2))}  # eight workers at a boundary
    >>> state = jax.vmap(tx.init)(params)
    >>> params4, state4 = lordo_jax.remap_workers(params, state, 4, sync_every=4)
    >>> params4["w"].shape, lordo_jax.step_count(state4).shape
    ((4, 3, 2), (4,))
  """
  if isinstance(workers, bool) or not isinstance(workers, numbers.Integral) or workers < 1:
    raise ValueError(f"remap_workers: workers={workers!r} must be a positive int.")
  if mid_round is not None and mid_round not in MID_ROUND:
    raise ValueError(
      f"remap_workers: mid_round={mid_round!r} is not a choice; expected None or "
      f"one of {MID_ROUND}."
    )
  params, opt_state = _on_host((params, opt_state))
  _workers_of(params)
  is_round = lambda x: isinstance(x, SynchronizeState)  # noqa: E731
  found = [x for x in jax.tree.leaves(opt_state, is_leaf=is_round) if is_round(x)]
  if len(found) > 1:
    raise ValueError(
      f"remap_workers: the state holds {len(found)} rounds (synchronize states); "
      "remap one method's state at a time."
    )
  rounds = [_round(x, sync_every, workers, mid_round, "the state") for x in found]
  # Every worker starts from the round's synchronised parameters, the anchor.
  synchronised = found[0].anchor if found else params
  new_params = jax.tree_util.tree_map_with_path(lambda p, x: _shared(p, x, workers), synchronised)

  def remap(path, x):
    if is_round(x):
      return rounds[0]
    if isinstance(x, low_rank_lib.LowRankAdamState):  # A low-rank optimizer on its own.
      return _inner(x, workers)
    return _shared(path, x, workers)

  new_state = jax.tree_util.tree_map_with_path(
    remap, opt_state, is_leaf=lambda x: is_round(x) or isinstance(x, low_rank_lib.LowRankAdamState)
  )
  return new_params, new_state
