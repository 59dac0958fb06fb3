"""Warm start: a method started at step S from another run's checkpoint (the paper's protocol).

The LoRDO paper's runs (``docs/FIDELITY.md``, point 1) train low-rank DDP for the first
third of the run and start LoRDO from that run's checkpoint at step S, its optimizer
state included, so that every worker begins LoRDO in the same subspace with the same
moments. This module gives the training loop (:func:`.train.train` with
``TrainConfig.warm_start_from``) that start. With ``theta_S`` the source run's
parameters after step S, the new run's first step is S + 1 and:

* **parameters**: ``theta_S`` (every worker's; the source's workers must agree, as they
  do after a DDP step); **data**: the source's data position, so the new run draws the
  batches the source run would have drawn next;
* **optimizer state**: the new method's ``tx.init(theta_S)``, then every *inner
  optimizer state* taken from the source's (:func:`transplant`, which is
  ``lordo_jax.warm_start_state``; its module docstring has the leaf-by-leaf table):
  each low-rank matrix's basis, moments (or zeros, ``--warm-start-moments reset``)
  and error buffer, the full-rank leaves' Adam moments, and every step counter (the
  bias corrections and the learning-rate schedule go on at step S + 1). LoRDO's
  anchor (= ``theta_S``), round counters, outer state, ledger and fault counts start
  fresh (its first sync is after step S + K). The new method is built with
  ``init_projection="random"`` where it takes it (:func:`.train.make_optimizer`), so
  it does not recompute the bases from its first gradient: the random ones are
  replaced by the transplanted ones before step S + 1.

With ``moments="keep"`` a warm start into the source's own method continues that run
exactly (``tests/integration/test_lm_warm_start.py`` checks it bit for bit); into LoRDO, the
subspace, moments and error buffers of the switch are those of the shared low-rank DDP
phase, identical on every worker.
"""

import dataclasses
import json
from typing import Any

import jax
import numpy as np

import lordo_jax

from . import checkpoints


class WarmStartError(ValueError):
  """A checkpoint this run cannot warm-start from; the message says what to change."""


def transplant(source: Any, target: Any, *, moments: str = "keep") -> Any:
  """``lordo_jax.warm_start_state(source, target, moments=moments)``, for the LM job.

  Args:
    source: the source run's optimizer state (restored from its checkpoint).
    target: the new method's fresh state, ``tx.init`` of the warm-start parameters.
    moments: ``"keep"`` copies the moments; ``"reset"`` leaves the target's zeros.

  Returns:
    ``target`` with the source's inner optimizer states (bases, moments, error
    buffers, step counters); its anchor, ledger and round counters its own.

  Raises:
    WarmStartError: the two states do not hold the same inner optimizer states, or a
      basis or moment of another shape: the checkpoint is of another method, model,
      ``--rank`` or projection side.
  """
  try:
    return lordo_jax.warm_start_state(source, target, moments=moments)
  except ValueError as error:
    raise WarmStartError(
      f"--warm-start-from: {error} (the checkpoint's method, model, --rank and "
      "projection side must fit this run's)"
    ) from None


def first_worker(params: Any) -> Any:
  """Worker 0's parameters; a WarmStartError if the workers' parameters differ.

  Raises:
    WarmStartError: the source run's workers do not agree at its step S.
  """
  stacked = jax.tree.map(np.asarray, params)
  for leaf in jax.tree.leaves(stacked):
    if not (leaf == leaf[:1]).all():
      raise WarmStartError(
        "the checkpoint's workers hold different parameters; warm-start from a DDP "
        "method (low_rank_ddp, ddp) or from a step right after a sync."
      )
  return jax.tree.map(lambda x: x[0], stacked)


def source_config(config: Any, saved: dict) -> Any:
  """The ``TrainConfig`` of the run that wrote the checkpoint (its optimizer's template)."""
  fields = {f: saved[f] for f in checkpoints.OPTIONS if f in saved}
  options = fields.get("optimizer_options", ())
  fields["optimizer_options"] = tuple(tuple(pair) for pair in options)
  fields |= {"warm_start_from": None, "warm_start_step": None}
  return dataclasses.replace(config, **fields)


def read_settings(directory: str, step: int | None) -> tuple[int, dict]:
  """``(step, settings)`` of the checkpoint to start from (``None``: the latest).

  Raises:
    WarmStartError: no checkpoint there, or one this training loop did not write.
  """
  if step is None:
    step = checkpoints.latest_step(directory)
  if step is None:
    raise WarmStartError(f"--warm-start-from {directory}: no checkpoint there.")
  with checkpoints.checkpoint.Checkpointer(directory, async_save=False) as checkpointer:
    saved = checkpointer.metadata(step).get("settings")
  if saved is None:
    raise WarmStartError(f"--warm-start-from {directory}: not written by this training loop.")
  return step, json.loads(json.dumps(saved))


def check_compatible(saved: dict, current: dict, directory: str) -> None:
  """The checkpoint must be of the same model, data, workers, batch, rank and seed.

  Raises:
    WarmStartError: naming the first setting that differs.
  """
  for field in ("model", "data", "num_workers", "batch_size", "rank", "seed", "param_dtype"):
    if saved.get(field) != current.get(field):
      raise WarmStartError(
        f"--warm-start-from {directory}: the checkpoint has {field} {saved.get(field)}, "
        f"this run {current.get(field)}; warm-start from a run with the same {field}."
      )
