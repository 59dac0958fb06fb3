"""Checkpoints of a training run, so that a restarted run continues bit for bit.

:mod:`lordo_jax.checkpoint` saves the parameters and the whole optimizer state (the
anchor, every basis, the moments, the outer optimizer's state, the ledger, the step
counters). The loop needs three things more, kept as the checkpoint's metadata:

* the step, and where each worker's data generator is, so that the restarted run
  draws the batches the uninterrupted run would have drawn;
* the curves so far (losses, bytes, evaluations), so that the result of a run that
  was stopped and resumed is the whole run;
* the settings that decide the trajectory (method, model, data, rank, learning
  rate, seed, ...). Resuming under other settings would not continue the same run,
  so it stops with :class:`ResumeError`: one line naming the setting, its value in
  the checkpoint, and the option to change. The number of workers may change
  (:data:`ELASTIC`): the state is then remapped (:mod:`.elastic`).

The layout is not among the settings (``--fsdp``, ``--offload``): each process writes
its own shards, and a restore places every array on the shardings and memory kinds of
the run that restores it (an anchor back in ``pinned_host`` memory), whatever the
layout that wrote it.
"""

import dataclasses
import json
import pathlib
from typing import Any

from lordo_jax import checkpoint

from . import model as model_lib

# The TrainConfig fields that decide a run's trajectory, each with its main.py option.
OPTIONS = {
  "steps": "--steps",
  "num_workers": "--workers",
  "batch_size": "--batch",
  "learning_rate": "--lr",
  "warmup_steps": "--warmup",
  "weight_decay": "--weight-decay",
  "rank": "--rank",
  "sync_every": "--sync-every",
  "refresh_every": "--refresh-every",
  "seed": "--seed",
  "param_dtype": "--param-dtype",
  "optimizer_options": "optimizer_options",
  "overlap": "--overlap",
  "merge": "--merge",
  "warm_start_from": "--warm-start-from",
  "warm_start_step": "--warm-start-step",
  "warm_start_moments": "--warm-start-moments",
  "clip_norm": "--clip-norm",
  "schedule": "--schedule",
  "absent": "--absent",
}
# The settings a resumed run may change: on another --workers the state is remapped.
ELASTIC = ("num_workers",)
_AFRESH = "or another --checkpoint-dir to start afresh"


class ResumeError(ValueError):
  """A checkpoint this run cannot continue from; the message says what to change."""


def _jsonable(value: Any) -> Any:
  """``value`` as JSON gives it back; objects JSON cannot hold become their type name."""
  return json.loads(json.dumps(value, default=lambda o: f"<{type(o).__name__}>"))


def settings(method: str, config: Any, model_config: Any, dataset: Any) -> dict[str, Any]:
  """What decides the trajectory of ``method`` under ``config``, JSON-ready."""
  return {
    "method": method,
    **{field: _jsonable(getattr(config, field)) for field in OPTIONS},
    "model": dataclasses.asdict(model_config),
    "data": {"name": dataset.name, "bytes": dataset.num_bytes},
  }


def latest_step(directory: str | pathlib.Path) -> int | None:
  """The newest checkpoint's step in ``directory``; None if it holds none (or is missing)."""
  if not pathlib.Path(directory).is_dir():
    return None  # lordo_jax.checkpoint would create it.
  return checkpoint.latest_step(directory)


def _difference(saved: dict, current: dict, where: str) -> str | None:
  """The first setting that differs, as the message of a ResumeError."""
  if saved["method"] != current["method"]:
    return (
      f"checkpoint {where} is a {saved['method']} run, not {current['method']}; resume it "
      f"with --methods {saved['method']}, {_AFRESH}."
    )
  if saved["model"] != current["model"]:
    presets = {name: dataclasses.asdict(c) for name, c in model_lib.PRESETS.items()}
    preset = next((name for name, c in presets.items() if c == saved["model"]), None)
    use = f"--preset {preset}" if preset else "the model that wrote it"
    return f"checkpoint {where} is of another model ({saved['model']}); use {use}, {_AFRESH}."
  if saved["data"] != current["data"]:
    data = saved["data"]
    return (
      f"checkpoint {where} was trained on {data['name']} ({data['bytes']} bytes), this run "
      f"on {current['data']['name']} ({current['data']['bytes']} bytes); use that --text, "
      f"{_AFRESH}."
    )
  for field, option in OPTIONS.items():
    if field not in ELASTIC and saved.get(field) != current[field]:
      return (
        f"checkpoint {where} was written with {option} {saved[field]}, this run has "
        f"{option} {current[field]}; use {option} {saved[field]} to resume it, {_AFRESH}."
      )
  return None


def check(directory: str | pathlib.Path, current: dict, *, resume: bool) -> int | None:
  """The step to resume from (None: start afresh), or a ResumeError saying what to change.

  Args:
    directory: the run's checkpoint directory.
    current: :func:`settings` of the run that is starting.
    resume: whether the run asks to continue from the latest checkpoint there.
  """
  step = latest_step(directory)
  if not resume:
    if step is not None:
      raise ResumeError(
        f"--checkpoint-dir {directory} already holds a checkpoint (step {step}); add "
        "--resume to continue that run, or use an empty --checkpoint-dir."
      )
    return None
  if step is None:
    raise ResumeError(
      f"--resume: no checkpoint in {directory}; train without --resume first, or give "
      "the --checkpoint-dir of an earlier run."
    )
  where = f"{directory} (step {step})"
  saved = saved_settings(directory, step)
  if saved is None:
    raise ResumeError(
      f"checkpoint {where} was not written by this training loop; use another "
      "--checkpoint-dir to start afresh."
    )
  message = _difference(saved, current, where)
  if message is not None:
    raise ResumeError(message)
  return step


def saved_settings(directory: str | pathlib.Path, step: int) -> dict | None:
  """The settings checkpoint ``step`` was written with (None: not by this loop)."""
  with checkpoint.Checkpointer(directory, async_save=False) as checkpointer:
    return checkpointer.metadata(step).get("settings")


def restore(
  directory: str | pathlib.Path, step: int, params_like: Any, opt_state_like: Any
) -> tuple[Any, Any, dict]:
  """``(params, opt_state, metadata)`` of ``step``, shaped and sharded like the targets.

  Raises:
    ResumeError: the checkpoint's trees do not fit the targets (a checkpoint written
      by another version of the code); the message is the first line of
      ``lordo_jax.checkpoint``'s, which names the leaves.
  """
  with checkpoint.Checkpointer(directory, async_save=False) as checkpointer:
    try:
      params, opt_state = checkpointer.restore(step, params_like, opt_state_like)
    except checkpoint.CheckpointMismatchError as error:
      first = str(error).splitlines()[0]
      raise ResumeError(f"{first} Use the options of the run that wrote it, {_AFRESH}.") from None
    return params, opt_state, checkpointer.metadata(step)


class RunCheckpoints:
  """One run's checkpoints: the step it resumes from, and the saves as it goes.

  Checks the directory when built (:func:`check`); keeps the two latest
  checkpoints; saves synchronously, because the training step donates the buffers
  of the parameters and state that a background save would still be reading.

  Args:
    directory: the run's checkpoint directory.
    settings: :func:`settings` of the run.
    resume: continue from the latest checkpoint there.
    every: save every this many steps (0: only after the last step of the call).
  """

  def __init__(self, directory, settings: dict, *, resume: bool, every: int):
    self.resume_step = check(directory, settings, resume=resume) or 0
    self.directory, self.settings, self.every = directory, settings, every
    # The workers the checkpoint was saved on (another --workers is remapped).
    self.saved_workers = settings["num_workers"]
    if self.resume_step:
      self.saved_workers = saved_settings(directory, self.resume_step)["num_workers"]
    self._checkpointer = checkpoint.Checkpointer(directory, max_to_keep=2, async_save=False)

  def restore(self, params_like: Any, opt_state_like: Any) -> tuple[Any, Any, dict]:
    """``(params, opt_state, metadata)`` of :attr:`resume_step` (see :func:`restore`)."""
    return restore(self.directory, self.resume_step, params_like, opt_state_like)

  def due(self, step: int, last: int) -> bool:
    """Whether to save after ``step``, ``last`` being the call's last step."""
    return step == last or (self.every > 0 and step % self.every == 0)

  def save(self, step: int, params: Any, opt_state: Any, *, data_position, history) -> None:
    """Saves the trees with the data position, the curves and the settings."""
    metadata = {"settings": self.settings, "data_position": data_position, "history": history}
    self._checkpointer.save(step, params, opt_state, metadata=metadata)

  def close(self) -> None:
    """Releases orbax's resources."""
    self._checkpointer.close()
