r"""Quality against communication on the example LM, and the paper's four claims.

    python benchmarks/quality/quality.py          # the full study: small preset, 1-3 h on 2 cores
    python benchmarks/quality/quality.py --quick  # tiny preset, 24 steps, 1 seed: about 1.5 min

Every variant of :data:`variants.QUALITY` trains the same model from the same
initialisation on the same data (8 simulated workers, the same steps and batch, so
the same token budget). Learning rates are tuned the same way for every method: one
seed at each rate of :attr:`Study.learning_rates`, then the best rate of each
method with every seed of :attr:`Study.seeds` (mean and spread). Then LoRDO and its
local-projection ablation at every rank x per-worker batch of the sweep, at their
best rates and every seed. :mod:`quality_summary` turns the runs into the tables and
claim checks, :mod:`quality_report` into ``quality.json``, ``quality.md`` and plots.

Each run is cached as one JSON file under ``--cache`` (default ``<out>/runs/lm``), so a
re-run, or a run after an interruption, trains only what is missing; ``--fresh``
retrains everything. ``--quick`` writes to ``runs/benchmarks_quick`` (ignored by
git), never over the committed full results.
"""

import os

# The CPU SVD is OpenBLAS: eight simulated devices each starting a multi-threaded
# SVD on a few cores run about 100x slower. Before NumPy loads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import math  # noqa: E402
import pathlib  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks.*

from benchmarks.harness import lm_runs  # noqa: E402
from benchmarks.harness import studies  # noqa: E402
from benchmarks.harness import variants  # noqa: E402

RESULTS = lm_runs.ROOT / "benchmarks" / "results"
QUICK_RESULTS = lm_runs.ROOT / "runs" / "benchmarks_quick"


@dataclasses.dataclass(frozen=True)
class Study:
  """The settings of the quality study."""

  preset: str
  steps: int
  rank: int
  batch_size: int
  sync_every: int  # K of every local-update method.
  refresh_every: int  # T of low-rank DDP.
  warmup_steps: int
  learning_rates: tuple[float, ...]  # The sweep, the same for every method.
  seeds: tuple[int, ...]  # The first one is the sweep's.
  ranks: tuple[int, ...]  # The rank x batch sweep of claim (d).
  batch_sizes: tuple[int, ...]

  def spec(self, variant, learning_rate, seed, rank=None, batch_size=None) -> lm_runs.RunSpec:
    """The run of ``variant`` at these settings (rank and batch default to the study's)."""
    return lm_runs.RunSpec(
      variant=variant,
      preset=self.preset,
      steps=self.steps,
      learning_rate=learning_rate,
      seed=seed,
      rank=rank or self.rank,
      batch_size=batch_size or self.batch_size,
      sync_every=self.sync_every,
      refresh_every=self.refresh_every,
      warmup_steps=self.warmup_steps,
      eval_every=self.sync_every,  # One reading per round: successive projections.
    )


FULL = Study(
  preset="small",
  steps=256,
  rank=32,
  batch_size=8,
  sync_every=16,
  refresh_every=16,
  warmup_steps=32,
  learning_rates=(1e-3, 2e-3, 5e-3, 1.25e-2, 3e-2),
  seeds=(0, 1, 2),
  ranks=(4, 8, 32),
  batch_sizes=(2, 8),
)
QUICK = Study(
  preset="tiny",
  steps=24,
  rank=8,
  batch_size=8,
  sync_every=8,
  refresh_every=8,
  warmup_steps=8,
  # One rate: the choice of the best one is tested on made-up losses
  # (tests/benchmark/test_benchmarks_quality.py), so each quick run checks a study's
  # wiring, not a second program per method.
  learning_rates=(1e-2,),
  seeds=(0,),
  # The study's own cell (rank 8, batch 8), whose runs are the sweep's: the rank x batch
  # table end to end without a run of its own (its grid of several cells is tested on
  # made-up losses in tests/benchmark/test_benchmarks_quality.py).
  ranks=(8,),
  batch_sizes=(8,),
)


def final_loss(record) -> float:
  """A run's final validation loss; a diverged run counts as infinitely bad."""
  loss = record["result"]["final_val_loss"]
  return loss if math.isfinite(loss) else math.inf


def run_study(study: Study, cache: pathlib.Path, *, fresh: bool = False) -> dict:
  """Trains (or reads from ``cache``) every run of ``study``.

  Returns:
    ``{"sweep": {variant: {lr: record}}, "best_lr": {variant: lr},
    "seeds": {variant: [record per seed]}, "rank_batch": {variant: {(rank, batch):
    {lr: [record per seed]}}}}``. In the rank x batch sweep each variant runs at
    the best rate of each variant of the sweep, so that every cell can take each
    variant's better one (a rate tuned at one batch may not suit another).
  """
  run = lambda spec: lm_runs.run(spec, cache, fresh=fresh)  # noqa: E731
  tuned = [v for v in variants.QUALITY if v.same_iterates_as is None]
  sweep = {
    v.name: {lr: run(study.spec(v, lr, study.seeds[0])) for lr in study.learning_rates}
    for v in tuned
  }
  best_lr = {
    name: min(runs, key=lambda lr, runs=runs: final_loss(runs[lr])) for name, runs in sweep.items()
  }
  for v in variants.QUALITY:
    if v.same_iterates_as is not None:
      best_lr[v.name] = best_lr[v.same_iterates_as]
  seeds = {
    v.name: [run(study.spec(v, best_lr[v.name], seed)) for seed in study.seeds]
    for v in variants.QUALITY
  }
  rates = sorted({best_lr[name] for name in variants.RANK_BATCH})
  rank_batch = {
    name: {
      (rank, batch): {
        lr: [run(study.spec(variants.by_name(name), lr, seed, rank, batch)) for seed in study.seeds]
        for lr in rates
      }
      for rank in study.ranks
      for batch in study.batch_sizes
    }
    for name in variants.RANK_BATCH
  }
  return {"sweep": sweep, "best_lr": best_lr, "seeds": seeds, "rank_batch": rank_batch}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--quick", action="store_true", help="tiny preset, 24 steps, 1 seed")
  parser.add_argument("--out", type=pathlib.Path, default=None, help="where results go")
  parser.add_argument("--cache", type=pathlib.Path, default=None, help="default: <out>/runs/lm")
  parser.add_argument("--fresh", action="store_true", help="retrain runs already cached")
  args = parser.parse_args(argv)
  study = QUICK if args.quick else FULL
  out = args.out or (QUICK_RESULTS if args.quick else RESULTS)
  cache = args.cache or studies.runs(out, "lm")
  lm_runs.simulate_devices()

  from benchmarks.harness import quality_report
  from benchmarks.harness import quality_summary

  start = time.perf_counter()
  runs = run_study(study, cache, fresh=args.fresh)
  summary = quality_summary.summarize(study, runs)
  summary["command"] = "python benchmarks/quality/quality.py" + (" --quick" if args.quick else "")
  summary["study_wall_time_s"] = time.perf_counter() - start
  written = quality_report.write(summary, out)
  print("\n".join(["wrote", *map(str, written)]))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
