r"""Elastic training in quality: a run resumed on another number of workers, workers away.

    python benchmarks/elastic/elastic.py           # 1,024 steps, 3 seeds: CPU-hours
    python benchmarks/elastic/elastic.py --cached  # report what is cached, train nothing
    python benchmarks/elastic/elastic.py --quick   # tiny preset, 16 steps, 8 devices: a minute

LoRDO on the overlap study's LM (small preset, r = 32, K = 16, 1,024 steps: 64 rounds,
8 windows per worker per step, the long-horizon study's best rate at 1,024 steps), on 16
simulated CPU devices: uninterrupted on 8, 4 and 16 workers; on 8 workers killed after
round 32 (its checkpoint) and resumed on 4 and on 16 (``lordo_jax.remap_workers``: the
anchor, bases and outer state carried, the moments averaged; the text split over the
new workers); and on 8 workers of which a quarter (workers 6 and 7) are away for rounds
25-32 and come back (``fault_tolerant=True``, ``worker_present=False``). Each row's
final validation loss over the seeds, against the uninterrupted 8 workers. Runs are
cached one JSON file each (``<out>/runs/elastic``), seed 0 of every row first.

``--quick`` checks the study's wiring, not its numbers: the tiny preset, 16 steps (2
rounds of 8), one seed, on 8 simulated devices, two rows: 8 workers, and 8 -> 4 (killed,
resumed). The rows on 4 and 16 workers and 8 -> 16 take the same code paths at the cost
of more programs; the row with workers away, a program of its own, is left to the tests
(``tests/benchmark/test_benchmarks_elastic.py`` checks what it asks of ``train``).
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # Before NumPy loads: see quality.py.

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks.*

from benchmarks.harness import lm_runs  # noqa: E402

# isort: split
from lm import checkpoints as lm_checkpoints  # noqa: E402

from benchmarks.harness import studies  # noqa: E402
from benchmarks.harness import variants  # noqa: E402
from benchmarks.overlap import overlap_quality  # noqa: E402
from benchmarks.quality import quality  # noqa: E402

NAME = "elastic"
STEPS, QUICK_STEPS = 1024, 16
DEVICES, QUICK_DEVICES = 16, 8  # Full: 16 workers of one device each; 8 and 4 of several.
AWAY = (6, 7)  # A quarter of the 8 workers.


@dataclasses.dataclass(frozen=True)
class Row:
  """One row: trained on ``workers``; killed after ``kill_round`` rounds on 8 and resumed
  on ``workers``; or with :data:`AWAY` away for ``away`` (first, last) rounds."""

  name: str
  workers: int
  kill_round: int | None = None
  away: tuple[int, int] | None = None


def rows(rounds: int, quick: bool = False) -> tuple[Row, ...]:
  """The study's rows for a run of ``rounds`` rounds (``quick``: see the module's doc)."""
  half, eighth = rounds // 2, max(1, rounds // 8)
  study = (
    Row("8 workers", 8),
    Row("4 workers", 4),
    Row("16 workers", 16),
    Row(f"8 -> 4 after round {half}", 4, kill_round=half),
    Row(f"8 -> 16 after round {half}", 16, kill_round=half),
    Row(f"8, a quarter away rounds {half - eighth + 1}-{half}", 8, away=(half - eighth + 1, half)),
  )
  if not quick:
    return study
  return tuple(
    row for row in study if row.workers != 16 and row.name != "4 workers" and not row.away
  )


def spec(study: quality.Study, steps: int, lr: float, seed: int, workers: int) -> lm_runs.RunSpec:
  """LoRDO on ``workers`` as the overlap study trains it."""
  run = study.spec(variants.by_name("lordo"), lr, seed, None, None)
  return dataclasses.replace(run, steps=steps, num_workers=workers)


def train(run: lm_runs.RunSpec, **changes):
  """``train()`` of ``run``'s config with ``changes`` (checkpoints, resume, absences)."""
  from lm import model

  config = dataclasses.replace(run.config(), **changes)
  model_config = model.PRESETS[run.preset]
  corpus = lm_runs.dataset(run.num_workers, model_config.seq_len, run.batch_size)
  return lm_runs.train.train(run.variant.method, config, model_config, corpus, progress=False)


def slug(name: str) -> str:
  """``name`` as a file name: lower-case letters and digits joined by ``_``."""
  return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def trained(row: Row, study, steps: int, lr: float, seed: int, out, *, killed):
  """The final validation loss of ``row`` at ``seed`` (cached), or None if not trained
  (``killed`` None: train nothing; else the folder of this call's killed runs)."""
  path = studies.runs(out, "elastic") / f"{slug(row.name)}_s{seed}_{steps}.json"
  if path.exists():
    return json.loads(path.read_text())["final_val_loss"]
  if killed is None:
    return None
  tic = time.perf_counter()
  if row.kill_round is None:
    absent = tuple((w, *row.away) for w in AWAY) if row.away else ()
    result = train(spec(study, steps, lr, seed, row.workers), absent=absent)
  else:
    saved = killed / f"s{seed}_{steps}"
    kill = row.kill_round * study.sync_every
    eight = spec(study, steps, lr, seed, 8)
    if lm_checkpoints.latest_step(saved) != kill:  # Not yet killed, or killed before.
      shutil.rmtree(saved, ignore_errors=True)
      train(eight, checkpoint_dir=str(saved), stop_after=kill)
    resumed_dir = saved.with_name(f"{saved.name}_on{row.workers}")
    shutil.rmtree(resumed_dir, ignore_errors=True)
    shutil.copytree(saved, resumed_dir)
    resumed = spec(study, steps, lr, seed, row.workers)
    result = train(resumed, checkpoint_dir=str(resumed_dir), resume=True)
    shutil.rmtree(resumed_dir)
  record = {
    "row": row.name,
    "seed": seed,
    "final_val_loss": result.final_val_loss,
    "wall_time_s": time.perf_counter() - tic,
    "provenance": lm_runs.provenance(),
  }
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(record))
  print(
    f"{row.name:>34} seed {seed}: val {result.final_val_loss:.4f}, {record['wall_time_s']:.0f} s"
  )
  return result.final_val_loss


def summary(losses: dict[str, list[float]]) -> list[dict]:
  """Each row's mean, spread (max - min) and difference from the uninterrupted 8."""
  base = losses.get("8 workers") or []
  base_mean = statistics.mean(base) if base else None
  report = []
  for name, values in losses.items():
    mean = statistics.mean(values) if values else None
    report.append(
      {
        "row": name,
        "seeds": len(values),
        "losses": values,
        "mean": mean,
        "spread": max(values) - min(values) if values else None,
        "vs_8_workers": None if mean is None or base_mean is None else mean / base_mean - 1,
      }
    )
  return report


def markdown(report: list[dict]) -> list[str]:
  def fmt(x, spec):
    return "—" if x is None else format(x, spec)

  lines = [
    "| run | seeds | final val loss (mean) | per seed | spread | vs 8 workers |",
    "|---|---:|---:|---|---:|---:|",
  ]
  for r in report:
    lines.append(
      f"| {r['row']} | {r['seeds']} | {fmt(r['mean'], '.4f')} | "
      f"{', '.join(format(x, '.4f') for x in r['losses'])} | {fmt(r['spread'], '.4f')} | "
      f"{fmt(r['vs_8_workers'], '+.2%')} |"
    )
  return lines


def add_options(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--cached", action="store_true", help="report what is cached only")


def main(argv=None) -> int:
  args = studies.parse_args(
    __doc__, "tiny preset, 16 steps, 1 seed, 8 devices", argv, extra=add_options
  )
  devices = QUICK_DEVICES if args.quick else DEVICES
  lm_runs.simulate_devices(devices)  # Before JAX starts: the imports above start no backend.
  start = time.perf_counter()
  study = quality.QUICK if args.quick else quality.FULL
  steps = QUICK_STEPS if args.quick else STEPS
  lr = (
    study.learning_rates[-1]
    if args.quick
    else overlap_quality.tuned_rates(args.out, steps)["lordo"]
  )
  study_rows = rows(steps // study.sync_every, quick=args.quick)
  losses = {row.name: [] for row in study_rows}
  with tempfile.TemporaryDirectory() as killed:  # The killed runs' checkpoints.
    for seed in study.seeds:  # Seed 0 of every row first.
      for row in study_rows:
        where = None if args.cached else pathlib.Path(killed)
        loss = trained(row, study, steps, lr, seed, args.out, killed=where)
        if loss is not None:
          losses[row.name].append(loss)
  report = summary(losses)
  studies.write(
    NAME,
    args,
    {
      "steps": steps,
      "learning_rate": lr,
      "rows": report,
      "wall_time_s": time.perf_counter() - start,
    },
    "Elastic training: resumed on another number of workers, workers away",
    markdown(report),
    [
      f"LoRDO, {study.preset} preset, {steps} steps (K = {study.sync_every}), rate {lr:g}, "
      f"{study.batch_size} windows per worker per step, {devices} simulated CPU devices; "
      "final validation loss in nats per byte, mean over the seeds.",
    ],
  )
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
