"""Runs whose workers change: resumed on another number, or absent for some rounds.

A checkpoint saved on M workers resumes on M' (:func:`restore_on`): restored on its own
M, remapped by :func:`lordo_jax.remap_workers` (the shared state carried, the moments
averaged, every worker on the anchor; MATH.md §10) and placed on this run's mesh. The
text is split over the M' workers afresh, each drawing from a generator seeded by
``(seed, worker, step)``. With ``absent`` a worker leaves for whole rounds and comes
back (:func:`presence`): the method is built with ``fault_tolerant=True``.
"""

from typing import Any

import jax
import numpy as np

import lordo_jax

from . import checkpoints


def restore_on(
  directory, step: int, saved_workers: int, params: Any, opt_state: Any, shardings: Any, *,
  sync_every: int, mid_round: str | None,
) -> tuple[Any, Any, dict]:  # fmt: skip
  """``(params, opt_state, metadata)`` of checkpoint ``step``, saved on ``saved_workers``,
  for the workers ``params`` is stacked over, placed like ``params`` and ``shardings``.

  Raises:
    checkpoints.ResumeError: a state saved mid-round without ``mid_round="restart"``, or
      one :func:`lordo_jax.remap_workers` refuses (its reason, then what to change here).
  """
  workers = jax.tree.leaves(params)[0].shape[0]
  one_device = jax.sharding.SingleDeviceSharding(jax.devices()[0])

  def saved_like(x):
    return jax.ShapeDtypeStruct((saved_workers, *x.shape[1:]), x.dtype, sharding=one_device)

  saved_params, saved_state, metadata = checkpoints.restore(
    directory, step, jax.tree.map(saved_like, params), jax.tree.map(saved_like, opt_state)
  )
  try:
    new_params, new_state = lordo_jax.remap_workers(
      jax.device_get(saved_params),
      jax.device_get(saved_state),
      workers,
      sync_every=sync_every,
      mid_round=mid_round,
    )
  except ValueError as error:
    raise checkpoints.ResumeError(
      f"--resume on --workers {workers} of a run saved on {saved_workers} (step {step}): "
      f"{error} In this job: --resume-mid-round restart, or --workers {saved_workers}."
    ) from None
  params_sharding = jax.tree.map(lambda x: x.sharding, params)
  return jax.device_put(new_params, params_sharding), jax.device_put(new_state, shardings), metadata


def round_of(step: int, sync_every: int) -> int:
  """The round (1-based) that step ``step`` (1-based) belongs to."""
  return (step - 1) // sync_every + 1


def presence(step: int, workers: int, sync_every: int, absent) -> np.ndarray:
  """Which workers are present at ``step``: bool ``(workers,)``.

  Args:
    step: the step, 1-based.
    workers: M.
    sync_every: K.
    absent: ``(worker, first_round, last_round)`` triples: the worker is absent for
      every step of those rounds (1-based, inclusive), so the syncs that end them
      leave it out, and it takes the synchronised state at each of them.
  """
  present = np.ones((workers,), bool)
  r = round_of(step, sync_every)
  for worker, first, last in absent:
    if first <= r <= last:
      present[worker] = False
  return present


def check_absent(absent, workers: int) -> None:
  """A ValueError naming an ``absent`` triple that cannot be: a worker out of range, or
  rounds out of order."""
  for triple in absent:
    worker, first, last = triple
    if not 0 <= worker < workers or not 1 <= first <= last:
      raise ValueError(
        f"--absent {worker}:{first}-{last}: give a worker in 0..{workers - 1} and rounds "
        "FIRST <= LAST counted from 1 (worker:first-last)."
      )
