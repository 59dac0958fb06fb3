"""Byte-level text data: the default corpus, a validation split, one shard per worker.

The default corpus is the text of the Python standard library's ``pydoc_data.topics``
(the help pages of the language reference, about 460 KB of English), present on every
Python install, so nothing is downloaded. ``load_text(path)`` reads a user file
instead. Tokens are the raw UTF-8 bytes (vocabulary 256).

The last ``val_fraction`` of the bytes is held out for validation; the rest is cut into
one contiguous shard per worker, and each worker samples its training windows only
from its own shard (a data-parallel run's workers see different data).
"""

import dataclasses
import math
import pathlib

import numpy as np

DEFAULT_CORPUS = "pydoc_data.topics"


class DataError(ValueError):
  """Input the run cannot use; the message says what to change."""


def load_text(path: str | None = None) -> tuple[np.ndarray, str]:
  """``(bytes as uint8 array, name)`` of ``path``, or of the default corpus."""
  if path is None:
    from pydoc_data import topics

    text = "".join(topics.topics[key] for key in sorted(topics.topics))
    return np.frombuffer(text.encode("utf-8"), np.uint8), DEFAULT_CORPUS
  file = pathlib.Path(path)
  if not file.is_file():
    raise DataError(f"--text {path}: no such file; give the path of a text file.")
  return np.frombuffer(file.read_bytes(), np.uint8), str(file)


def unigram_entropy(data: np.ndarray) -> float:
  """Entropy of the byte frequencies of ``data``, in nats.

  The loss of the best model that ignores context: a language model that has
  learned anything beyond byte frequencies ends below it.
  """
  counts = np.bincount(data, minlength=256)
  p = counts[counts > 0] / counts.sum()
  return float(-(p * np.log(p)).sum())


@dataclasses.dataclass(frozen=True)
class Dataset:
  """Training shards (one per worker) and a validation split, as uint8 arrays."""

  shards: tuple[np.ndarray, ...]
  validation: np.ndarray
  name: str
  num_bytes: int  # Of the whole text.
  unigram_entropy: float  # Nats per byte, of the whole text.


def split(
  data: np.ndarray,
  *,
  num_workers: int,
  seq_len: int,
  batch_size: int,
  name: str = "text",
  val_fraction: float = 0.1,
) -> Dataset:
  """Holds out the last ``val_fraction`` of ``data`` and shards the rest over workers.

  Raises:
    DataError: if a worker's shard cannot hold one batch of ``batch_size``
      non-overlapping windows of ``seq_len + 1`` bytes, or the validation split
      cannot hold one window.
  """
  window = seq_len + 1
  num_val = max(int(len(data) * val_fraction), window)
  shard_len = (len(data) - num_val) // num_workers
  needed = num_workers * batch_size * window + window
  if shard_len < batch_size * window:
    raise DataError(
      f"the text ({name}) has {len(data)} bytes, shorter than one batch: "
      f"{num_workers} workers x {batch_size} windows x {window} bytes plus a validation "
      f"split need at least {needed + needed // 9} bytes; use a longer --text, or "
      "fewer --workers, a smaller --batch or a smaller --preset."
    )
  shards = tuple(data[m * shard_len : (m + 1) * shard_len] for m in range(num_workers))
  validation = data[len(data) - num_val :]
  return Dataset(shards, validation, name, len(data), unigram_entropy(data))


class Batches:
  """Random training windows: each call gives ``(M, batch_size, seq_len + 1)`` int32.

  Worker m's windows come from shard m only, drawn by its own generator, so a run is
  reproducible from ``seed``. :meth:`position` and :meth:`seek` read and set where
  the generators are, so a restarted run draws the batches it would have drawn.
  """

  def __init__(self, dataset: Dataset, *, seq_len: int, batch_size: int, seed: int):
    self.dataset, self.window, self.batch_size = dataset, seq_len + 1, batch_size
    self.seed = seed
    self.rngs = [np.random.default_rng([seed, m]) for m in range(len(dataset.shards))]

  def __call__(self) -> np.ndarray:
    batches = []
    for shard, rng in zip(self.dataset.shards, self.rngs, strict=True):
      starts = rng.integers(0, len(shard) - self.window + 1, self.batch_size)
      batches.append(np.stack([shard[s : s + self.window] for s in starts]))
    return np.stack(batches).astype(np.int32)

  def position(self) -> list[dict]:
    """Every worker's generator state, JSON-ready (NumPy's ``bit_generator.state``)."""
    return [rng.bit_generator.state for rng in self.rngs]

  def seek(self, position: list[dict]) -> None:
    """Continues from a :meth:`position` of the same data and worker count."""
    for rng, state in zip(self.rngs, position, strict=True):
      rng.bit_generator.state = state

  def restart(self, step: int) -> None:
    """New generators seeded from ``(seed, worker, step)``: a run resumed after ``step``
    on another number of workers, whose saved positions belong to other shards."""
    self.rngs = [np.random.default_rng([self.seed, m, step]) for m in range(len(self.rngs))]


def validation_windows(dataset: Dataset, *, seq_len: int, max_windows: int) -> np.ndarray:
  """Up to ``max_windows`` evenly spaced windows ``(N, seq_len + 1)`` of the split."""
  window = seq_len + 1
  available = len(dataset.validation) - window + 1
  count = max(1, min(max_windows, math.ceil(available / window)))
  starts = np.linspace(0, available - 1, count).astype(np.int64)
  return np.stack([dataset.validation[s : s + window] for s in starts]).astype(np.int32)
