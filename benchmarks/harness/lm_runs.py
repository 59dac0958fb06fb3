"""One training run of the example LM, described by a :class:`RunSpec`, cached on disk.

A run is ``examples/lm``'s ``train()`` (imported as a user would, from
``examples/``) on simulated CPU workers. Its result is kept as one JSON file per
run in a cache folder, named by the run's settings and a hash of all of them, so a
study that is interrupted or re-run trains only what it has not finished. The file
also records where it was measured (jax version, CPU, git commit, date).

Entry points must set ``OPENBLAS_NUM_THREADS=1`` before NumPy loads and call
:func:`simulate_devices` before JAX starts (see ``examples/main.py``).
"""

import dataclasses
import datetime
import functools
import hashlib
import inspect
import json
import os
import pathlib
import platform
import subprocess
import sys
from typing import Any

import jax

import lordo_jax
from benchmarks.harness.variants import Variant
from lordo_jax.methods import lordo as lordo_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

from lm import data  # noqa: E402
from lm import model  # noqa: E402
from lm import train  # noqa: E402

DEVICES = 8


def simulate_devices(count: int = DEVICES) -> None:
  """``count`` simulated CPU devices; call before JAX starts."""
  jax.config.update("jax_num_cpu_devices", count)


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """Everything that determines one run's result."""

  variant: Variant
  preset: str
  steps: int
  learning_rate: float
  seed: int
  rank: int
  batch_size: int  # Windows per worker per step.
  sync_every: int  # K.
  refresh_every: int  # T of low-rank DDP.
  num_workers: int = 8
  warmup_steps: int = 32
  weight_decay: float = 0.0
  eval_every: int = 16
  eval_windows: int = 64
  clip_norm: float | None = None  # Each worker's gradient clipped to this global norm.

  def config(self) -> train.TrainConfig:
    """The ``TrainConfig`` of this run."""
    return train.TrainConfig(
      steps=self.steps,
      num_workers=self.num_workers,
      batch_size=self.batch_size,
      learning_rate=self.learning_rate,
      warmup_steps=self.warmup_steps,
      weight_decay=self.weight_decay,
      rank=self.rank,
      sync_every=self.sync_every,
      refresh_every=self.refresh_every,
      seed=self.seed,
      eval_every=self.eval_every,
      eval_windows=self.eval_windows,
      optimizer_options=self.variant.options,
      clip_norm=self.clip_norm,
    )

  def key(self) -> dict[str, Any]:
    """The settings that name the cache file (the description is not one).

    A setting added after runs were cached (:data:`ADDED`) is left out at its default,
    so that those runs keep their names. So is the basis refresh where it is the SVD,
    which every run was first cached with (named or not), and where it is another a
    method takes by default (LoRDO's ``subspace_iteration``), the key names it, so that
    such runs never take the place of the SVD's. So is ``delay_correction="none"``, what
    every round in flight was cached with before the option.
    """
    fields = dataclasses.asdict(self)
    for name, default in ADDED.items():
      if fields[name] == default:
        del fields[name]
    variant = self.variant
    dropped = (("projection", "svd"), ("delay_correction", "none"))
    options = [list(o) for o in variant.options if tuple(o) not in dropped]
    fields["variant"] = {"name": variant.name, "method": variant.method, "options": options}
    given = dict(variant.options)
    # A round in flight merged eager or delayed was cached uncorrected before the library
    # had delay_correction: "none" keeps those names, and the library's default, which
    # may correct, gets names of its own.
    merged = given.get("merge", "eager") in ("eager", "delayed")
    if given.get("overlap") == "round" and merged and "delay_correction" not in given:
      fields["delay_correction"] = "default"
    projection = default_projection(variant.method, dict(variant.options))
    if projection not in (None, "svd") and "projection" not in dict(variant.options):
      fields["projection"] = projection
    return fields

  def file_name(self) -> str:
    """The cache file of this run: see :func:`file_name`."""
    return file_name(self.key())


def default_projection(method: str, options: dict[str, Any]) -> str | None:
  """The basis refresh ``lordo_jax.<method>(**options)`` takes (None: it has none)."""
  parameter = inspect.signature(getattr(lordo_jax, method)).parameters.get("projection")
  if parameter is None:
    return None
  if parameter.default == lordo_lib.DEFAULT_PROJECTION:  # LoRDO's: one-sided or two.
    return lordo_lib.with_projection(options)["projection"]
  return options.get("projection", parameter.default)


# Settings added to RunSpec after the first runs were cached, with their defaults.
ADDED = {"clip_norm": None}


def file_name(key: dict[str, Any]) -> str:
  """``<variant>_<preset>_r<rank>_b<batch>_lr<lr>_s<seed>_<hash of key>.json``."""
  digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]
  return (
    f"{key['variant']['name']}_{key['preset']}_r{key['rank']}_b{key['batch_size']}_"
    f"lr{key['learning_rate']:g}_s{key['seed']}_{digest}.json"
  )


@functools.cache
def dataset(num_workers: int, seq_len: int, batch_size: int) -> data.Dataset:
  """The default corpus, split for ``num_workers`` workers."""
  raw, name = data.load_text()
  return data.split(raw, num_workers=num_workers, seq_len=seq_len, batch_size=batch_size, name=name)


def cpu_model() -> str:
  """The CPU's model name (``/proc/cpuinfo``), or the platform's processor string."""
  cpuinfo = pathlib.Path("/proc/cpuinfo")
  if cpuinfo.exists():
    for line in cpuinfo.read_text().splitlines():
      if line.startswith("model name"):
        return line.split(":", 1)[1].strip()
  return platform.processor() or platform.machine()


def provenance() -> dict[str, Any]:
  """Where and with what a result was measured."""
  commit = subprocess.run(
    ["git", "describe", "--always", "--dirty"], capture_output=True, text=True, cwd=ROOT
  ).stdout.strip()
  return {
    "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    "git_commit": commit or None,
    "jax": jax.__version__,
    "python": platform.python_version(),
    "cpu": cpu_model(),
    "cores": os.cpu_count(),
    "devices": jax.device_count(),
  }


def run(spec: RunSpec, cache: pathlib.Path, *, fresh: bool = False, log=print) -> dict[str, Any]:
  """The result of ``spec``: read from ``cache`` if there, else trained and stored.

  Returns:
    ``{"spec": ..., "provenance": ..., "result": RunResult as a dict}``.
  """
  path = cache / spec.file_name()
  if path.exists() and not fresh:
    return json.loads(path.read_text())
  model_config = model.PRESETS[spec.preset]
  corpus = dataset(spec.num_workers, model_config.seq_len, spec.batch_size)
  result = train.train(spec.variant.method, spec.config(), model_config, corpus, progress=False)
  record = {
    "spec": spec.key(),
    "provenance": provenance(),
    "result": dataclasses.asdict(result),
  }
  cache.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(".tmp")
  tmp.write_text(json.dumps(record))
  tmp.replace(path)
  log(
    f"{spec.variant.name:>30} lr {spec.learning_rate:g} seed {spec.seed} r {spec.rank} "
    f"b {spec.batch_size}: val {result.final_val_loss:.4f}, {result.wall_time_s:.0f} s"
  )
  return record
