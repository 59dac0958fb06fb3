"""The example LM (``examples/lm``) as the LM job's tests use it.

Imported as a user would, from ``examples/``; :func:`short_run` is a few steps of the
tiny preset and :func:`dataset` the embedded text split for it.
"""

import pathlib
import sys

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))
import main  # noqa: E402
from lm import checkpoints  # noqa: E402
from lm import data  # noqa: E402
from lm import model  # noqa: E402
from lm import report  # noqa: E402
from lm import train  # noqa: E402
from lm import warm_start  # noqa: E402

sys.path.remove(str(EXAMPLES))

__all__ = ["EXAMPLES", "checkpoints", "data", "main", "model", "report", "train", "warm_start"]

PRESET = model.PRESETS["tiny"]
BATCH = 4  # Windows per worker per step.


def short_run(workers: int, steps: int, sync_every: int, eval_every: int, **changes):
  """A ``TrainConfig`` of the tiny preset: rank 4, K = T = ``sync_every``, peak rate 1e-2
  after 4 warmup steps, 8 validation windows; ``changes`` set any other field."""
  return train.TrainConfig(
    steps=steps,
    num_workers=workers,
    batch_size=BATCH,
    learning_rate=1e-2,
    warmup_steps=4,
    rank=4,
    sync_every=sync_every,
    refresh_every=sync_every,
    eval_every=eval_every,
    eval_windows=8,
    **changes,
  )


def dataset(workers: int):
  """The embedded text, split for ``workers`` workers and the tiny preset's windows."""
  raw, name = data.load_text(None)
  return data.split(raw, num_workers=workers, seq_len=PRESET.seq_len, batch_size=BATCH, name=name)
