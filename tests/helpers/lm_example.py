"""The example LM (``examples/lm``) as the LM job's tests use it.

Imported as a user would, from ``examples/``; :func:`short_run` is a few steps of the
tiny preset and :func:`dataset` the embedded text split for it.
"""

import contextlib
import io
import json
import pathlib
import shutil
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


def main_args(config) -> list[str]:
  """The ``examples/main.py`` options that train ``config`` (a :func:`short_run` of the
  tiny preset, float32, cosine schedule), without progress bars."""
  args = {
    "--steps": config.steps, "--workers": config.num_workers, "--batch": config.batch_size,
    "--lr": config.learning_rate, "--warmup": config.warmup_steps, "--rank": config.rank,
    "--sync-every": config.sync_every, "--refresh-every": config.refresh_every,
    "--eval-every": config.eval_every, "--eval-windows": config.eval_windows,
    "--fsdp": config.fsdp, "--seed": config.seed,
  }  # fmt: skip
  argv = ["--preset", "tiny", "--no-progress", *(str(x) for kv in args.items() for x in kv)]
  return argv + (["--offload"] if config.offload else [])


def run_main(argv: list[str]) -> tuple[str, dict, list]:
  """``examples/main.py argv`` in this process (``main.main``), which must succeed: its
  standard output, the ``results.json`` it wrote to ``--out`` and its results as
  ``train.RunResult`` (JSON gives back every float exactly)."""
  stdout = io.StringIO()
  with contextlib.redirect_stdout(stdout):
    status = main.main(argv)
  assert status == 0, stdout.getvalue()[-3000:]
  out = pathlib.Path(argv[argv.index("--out") + 1])
  written = json.loads((out / report.JSON_NAME).read_text())
  return stdout.getvalue(), written, [train.RunResult(**r) for r in written["results"]]


def copy_checkpoint(source, destination, step: int) -> None:
  """The checkpoint of ``step`` in the run's directory ``source``, alone, copied to
  ``destination``: a run resumed there continues from ``step``, as if it had stopped
  after it."""
  source = pathlib.Path(source)
  assert (source / str(step)).is_dir(), sorted(p.name for p in source.iterdir())

  def others(directory, names):
    if pathlib.Path(directory) != source:
      return []
    return [n for n in names if n.isdigit() and int(n) != step]

  shutil.copytree(source, destination, ignore=others)
