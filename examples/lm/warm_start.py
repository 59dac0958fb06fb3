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
  optimizer state* taken from the source's (:func:`transplant`). An inner optimizer
  state is recognised by its fields, not its type, and the source's and the new
  method's must list the same kinds in the same order (both follow the parameter tree
  and the ``optax.partition`` of :func:`lordo_jax.aliases.local_adamw_path`):

  ===========================================  =======================================
  source leaf (``low_rank_ddp``: the chain     goes to (``lordo``: ``SynchronizeState
  after ``average_gradients``)                 .inner_state``, the same chain)
  ===========================================  =======================================
  ``LowRankMoments.basis`` Q, per matrix       the same matrix's ``basis`` (exactly)
  ``LowRankMoments.mu, nu`` (u, v; r-sized)    ``mu, nu`` (``moments="keep"``) or zeros
                                               (``"reset"``: the authors' switch)
  ``LowRankMoments.error`` E (p x q)           ``error``, when both have error feedback;
                                               else the new method's (zeros or ``(0,)``)
  ``LowRankAdamState.count``                   ``count`` (bias correction continues)
  ``ScaleByAdamState.count, mu, nu`` (the      ``count``; ``mu, nu`` as the low-rank
  full-rank leaves' Adam)                      moments (kept, or zeros with "reset")
  ``ScaleByScheduleState.count``               ``count``: the learning-rate schedule
                                               goes on at step S + 1
  ===========================================  =======================================

  What starts fresh, from ``tx.init(theta_S)``: LoRDO's **anchor** (= ``theta_S``, the
  same on every worker), its step count, round counters and next sync (its rounds are
  counted from the switch: the first sync is after step S + K), its outer optimizer
  state, its ledger (zero: the bytes of the shared phase are the source run's), its
  fault counts, and ``LowRankAdamState.refresh_failures``. The new method is built with
  ``init_projection="random"`` where it takes it (:func:`.train.make_optimizer`), so it
  does not recompute the bases from its first gradient: the random ones are replaced
  by the transplanted ones before step S + 1.

With ``moments="keep"`` a warm start into the source's own method continues that run
exactly (``tests/test_lm_warm_start.py`` checks it bit for bit); into LoRDO, the
subspace, moments and error buffers of the switch are those of the shared low-rank DDP
phase, identical on every worker.
"""

import dataclasses
import json
from typing import Any

import jax
import numpy as np

from . import checkpoints

# What becomes of the moments at the switch: copied, or zeros (the authors' switch,
# ``HP_SWITCH_RESET_MOMENTA="exp_avg,exp_avg_sq"``, docs/FIDELITY.md point 10).
MOMENTS = ("keep", "reset")
_MATRIX_FIELDS = {"basis", "mu", "nu", "error"}


class WarmStartError(ValueError):
  """A checkpoint this run cannot warm-start from; the message says what to change."""


def _fields(node: Any) -> set[str]:
  """The field names of a NamedTuple, or the empty set."""
  return set(getattr(node, "_fields", ())) if isinstance(node, tuple) else set()


def is_matrix_state(node: Any) -> bool:
  """Whether ``node`` is one low-rank matrix's state (basis Q, moments u, v, error E)."""
  return _MATRIX_FIELDS <= _fields(node)


def is_optimizer_state(node: Any) -> bool:
  """Whether ``node`` is an inner optimizer state that a warm start takes over.

  A step counter alone (a learning-rate schedule's), a counter with ``mu`` and ``nu``
  (Adam's), or a counter with per-matrix ``moments`` (low-rank Adam's).
  """
  fields = _fields(node)
  kind = fields == {"count"} or "moments" in fields or {"mu", "nu"} <= fields
  return "count" in fields and kind


def optimizer_states(tree: Any) -> list:
  """Every inner optimizer state in ``tree`` (:func:`is_optimizer_state`), in tree order."""
  leaves = jax.tree.leaves(tree, is_leaf=is_optimizer_state)
  return [leaf for leaf in leaves if is_optimizer_state(leaf)]


def _shapes(tree: Any) -> Any:
  return jax.tree.map(np.shape, tree)


def _moments(source: Any, target: Any, moments: str) -> dict:
  """``mu`` and ``nu``: the source's (``keep``) or the target's fresh zeros (``reset``)."""
  if _shapes((source.mu, source.nu)) != _shapes((target.mu, target.nu)):
    raise WarmStartError(
      "the checkpoint's moments are not shaped as this run's; warm-start from a run of "
      "the same model, --rank and projection side."
    )
  chosen = source if moments == "keep" else target
  return {"mu": chosen.mu, "nu": chosen.nu}


def _matrix(source: Any, target: Any, moments: str) -> Any:
  """One matrix's state: the source's basis, error buffer (if both have one) and moments."""
  if _shapes(source.basis) != _shapes(target.basis):
    raise WarmStartError(
      f"the checkpoint's basis is shaped {_shapes(source.basis)}, this run's "
      f"{_shapes(target.basis)}; warm-start from a run with the same --rank."
    )
  error = source.error if np.shape(source.error) == np.shape(target.error) else target.error
  return target._replace(basis=source.basis, error=error, **_moments(source, target, moments))


def _take(source: Any, target: Any, moments: str) -> Any:
  """``target`` (an inner optimizer state) with the source's counter, bases and moments."""
  taken = {"count": source.count}
  fields = _fields(target)
  if "moments" in fields:
    try:
      taken["moments"] = jax.tree.map(
        lambda s, t: _matrix(s, t, moments), source.moments, target.moments, is_leaf=is_matrix_state
      )
    except ValueError as error:
      if isinstance(error, WarmStartError):
        raise
      raise WarmStartError(
        "the checkpoint's low-rank matrices are not this run's; warm-start from a run of "
        "the same model, --rank and low-rank leaves."
      ) from None
  elif {"mu", "nu"} <= fields:
    taken |= _moments(source, target, moments)
  return target._replace(**taken)


def transplant(source: Any, target: Any, *, moments: str = "keep") -> Any:
  """``target`` with every inner optimizer state taken from ``source`` (see the table above).

  Args:
    source: the source run's optimizer state (restored from its checkpoint).
    target: the new method's fresh state, ``tx.init`` of the warm-start parameters.
    moments: ``"keep"`` copies the moments; ``"reset"`` leaves the target's zeros.

  Returns:
    ``target`` with each inner optimizer state's counter, and each low-rank matrix's
    basis and error buffer, from ``source``; the moments as ``moments`` says; every
    other leaf (anchor, ledger, round counters) the target's.

  Raises:
    WarmStartError: the two states do not hold the same inner optimizer states, or a
      basis or moment of another shape (another rank or model).
  """
  if moments not in MOMENTS:
    raise WarmStartError(f"warm-start moments {moments!r}: use one of {', '.join(MOMENTS)}.")
  old, new = optimizer_states(source), optimizer_states(target)
  kinds = lambda states: [type(s).__name__ for s in states]  # noqa: E731
  if kinds(old) != kinds(new):
    raise WarmStartError(
      f"the checkpoint's optimizer holds {kinds(old)}, this run's {kinds(new)}; warm-start "
      "from a method with the same inner optimizer (low_rank_ddp for lordo)."
    )
  leaves, treedef = jax.tree.flatten(target, is_leaf=is_optimizer_state)
  taken = iter(old)
  leaves = [_take(next(taken), x, moments) if is_optimizer_state(x) else x for x in leaves]
  return jax.tree.unflatten(treedef, leaves)


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
