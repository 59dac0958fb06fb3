r"""What overlapping the sync costs in quality: the LM at 64 rounds, each overlap and merge.

    python benchmarks/overlap/overlap_quality.py           # 1,024 steps, 3 seeds: CPU-hours
    python benchmarks/overlap/overlap_quality.py --cached  # report what is cached, train nothing
    python benchmarks/overlap/overlap_quality.py --quick   # tiny preset, 96 steps: a few minutes

LoRDO and DiLoCo train the long-horizon study's model, data, workers, rank and K = 16
for 1,024 steps (64 rounds; :mod:`long_horizon`), each at the learning rate that study
found best for it there, with every overlap of MATH.md §9: none (every sync blocks),
``overlap="round"`` with the eager merge (Kale et al.'s Algorithm 3) and the delayed one
(their Algorithm 2), and ``overlap=tau`` for tau in {1, 2, 4} with ``merge="rebase"``
and ``merge="streaming"`` (alpha 0.5, Streaming DiLoCo's); and LoRDO with an int8
pseudo-gradient and ``overlap="round"`` (the configuration that needs the least bandwidth).
The rate is not tuned again for each overlap: the question is what turning overlap on
costs a user who keeps their rate.

Runs go to the quality study's cache (``<out>/runs/lm``; :mod:`lm_runs`), the runs without
overlap are the long-horizon study's own, and they are trained in :data:`ORDER`, most
informative first (seed 0 of the "round" rows, then seed 0 of every row, then the other
seeds), so an interrupted study has its most useful rows; ``--cached`` writes the report
from the runs present, with how many seeds each row has.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # Before NumPy loads: see quality.py.

import dataclasses  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import pathlib  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks.*

from benchmarks.harness import lm_runs  # noqa: E402
from benchmarks.harness import studies  # noqa: E402
from benchmarks.harness import variants  # noqa: E402
from benchmarks.paper import long_horizon  # noqa: E402
from benchmarks.quality import quality  # noqa: E402

NAME = "overlap_quality"
STEPS = 1024
METHODS = ("lordo", "diloco")
TAUS = (1, 2, 4)
STREAMING_ALPHA = 0.5
# Both methods' rate in the quick study (the full study takes each its tuned rate).
QUICK_LEARNING_RATE = 3e-3
# Each row: its name and the factory options it adds to the method's; "none" is the
# method as the long-horizon study trained it.
OVERLAPS: dict[str, tuple[tuple[str, Any], ...]] = {
  "none": (),
  "round eager": (("overlap", "round"), ("merge", "eager"), ("delay_correction", "none")),
  "round delayed": (("overlap", "round"), ("merge", "delayed"), ("delay_correction", "none")),
  **{
    f"tau={tau} {merge}": (("overlap", tau), ("merge", merge))
    + ((("merge_alpha", STREAMING_ALPHA),) if merge == "streaming" else ())
    for tau in TAUS
    for merge in ("rebase", "streaming")
  },
}
INT8_ROUND = (
  "int8 + round eager",
  (("compression", "int8"), ("overlap", "round"), ("delay_correction", "none")),
)
ROWS = {
  "lordo": {**OVERLAPS, INT8_ROUND[0]: INT8_ROUND[1]},
  "diloco": OVERLAPS,
}
ROUND = ("none", "round eager", "int8 + round eager", "round delayed")
WINDOWS = ("none", *(row for row in OVERLAPS if row.startswith("tau")))
# Trained in this order: (methods, rows or None for all, seeds). Seed 0 of every row
# first; then the other seeds where a row is closest to no overlap, so that seeds decide
# it (DiLoCo's windows, LoRDO's rebased ones), then the rest.
ORDER = (
  (METHODS, ROUND, (0,)),
  (("diloco",), None, (0,)),
  (("lordo",), None, (0,)),
  (("diloco",), WINDOWS, (1, 2)),
  (("lordo",), ("none", "tau=1 rebase", "tau=2 rebase"), (1, 2)),
  (METHODS, ROUND, (1, 2)),
  (METHODS, None, (1, 2)),
)


def variant(method: str, row: str) -> variants.Variant:
  """The quality-study variant of ``method`` with ``row``'s overlap (its own name, so its
  runs have their own cache files); ``"none"``: the method's own variant."""
  base = variants.by_name(method)
  if row == "none":
    return base
  name = f"{method}_" + row.replace(" + ", "_").replace(" ", "_").replace("=", "")
  return base._replace(name=name, options=base.options + ROWS[method][row])


def spec(study: quality.Study, steps: int, method: str, row: str, rate: float, seed: int):
  return dataclasses.replace(study.spec(variant(method, row), rate, seed), steps=steps)


def tuned_rates(out, steps: int) -> dict[str, float]:
  """Each method's best rate at ``steps`` in the long-horizon study's results."""
  path = out / f"{long_horizon.NAME}.json"
  if not path.exists():
    raise SystemExit(f"{path} is missing: run benchmarks/paper/long_horizon.py first (its rates).")
  rows = json.loads(path.read_text())["horizons"].get(str(steps), [])
  rates = {r["method"]: r["best_lr"] for r in rows if r["best_lr"]}
  missing = [m for m in METHODS if m not in rates]
  if missing:
    raise SystemExit(f"long_horizon.json has no best rate at {steps} steps for {missing}.")
  return {m: float(rates[m]) for m in METHODS}


def planned(study, steps: int, rates: dict) -> list:
  """Every run of the study, once each, in :data:`ORDER`."""
  runs = {}
  for methods, rows, seeds in ORDER:
    for seed in (s for s in seeds if s in study.seeds):
      for method in methods:
        for row in rows or ROWS[method]:
          if row in ROWS[method]:
            run = spec(study, steps, method, row, rates[method], seed)
            runs.setdefault(run.file_name(), run)
  return list(runs.values())


def results(runs: long_horizon.Runs, study, steps: int, rates: dict) -> list[dict]:
  """Every row with the final validation loss of each seed present, its mean and spread,
  and its relative difference from the same method without overlap, seed by seed."""
  out = []
  for method in METHODS:
    losses = {
      row: {
        seed: long_horizon.final(runs.get(spec(study, steps, method, row, rates[method], seed)))
        for seed in study.seeds
      }
      for row in ROWS[method]
    }
    base = losses["none"]
    for row, by_seed in losses.items():
      have = {s: x for s, x in by_seed.items() if x is not None}
      paired = [(x - base[s]) / base[s] for s, x in have.items() if base.get(s) is not None]
      finite = all(math.isfinite(x) for x in have.values())
      out.append(
        {
          "method": method,
          "overlap": row,
          "options": dict(ROWS[method][row]),
          "learning_rate": rates[method],
          "losses": {str(s): x for s, x in have.items()},
          "mean": statistics.fmean(have.values()) if have and finite else None,
          "spread": statistics.stdev(have.values()) if len(have) > 1 and finite else 0.0,
          "vs_none": paired,
          "vs_none_mean": statistics.fmean(paired) if paired and finite else None,
        }
      )
  return out


def markdown(rows: list[dict], study, steps: int) -> list[str]:
  lines = [f"**{steps} steps ({steps // study.sync_every} rounds of K = {study.sync_every})**", ""]
  lines += studies.table(
    [
      "method (rate)",
      "overlap",
      "final val loss per seed",
      "mean +- sd (n)",
      "vs none, per seed",
      "vs none",
    ],
    [
      [
        f"{r['method']} ({r['learning_rate']:g})",
        r["overlap"],
        ", ".join(f"{x:.4f}" for x in r["losses"].values()) or "not yet run",
        "-"
        if r["mean"] is None
        else f"{r['mean']:.4f} +- {r['spread']:.4f} (n={len(r['losses'])})",
        ", ".join(f"{100 * d:+.2f}%" for d in r["vs_none"])
        if r["overlap"] != "none" and r["vs_none"]
        else "-",
        "-"
        if r["vs_none_mean"] is None or r["overlap"] == "none"
        else f"{100 * r['vs_none_mean']:+.2f}%",
      ]
      for r in rows
    ],
    align="llrrrr",
  )
  return lines


def add_options(parser) -> None:
  parser.add_argument("--cached", action="store_true", help="report the cached runs; train nothing")


def main(argv=None) -> int:
  args = studies.parse_args(__doc__, "tiny preset, 96 steps, 1 seed", argv, extra=add_options)
  start = time.perf_counter()
  study = quality.QUICK if args.quick else quality.FULL
  steps = 96 if args.quick else STEPS
  rates = {m: QUICK_LEARNING_RATE for m in METHODS} if args.quick else tuned_rates(args.out, steps)
  args.flags = ["--cached"] if args.cached else []
  runs = long_horizon.Runs(studies.runs(args.out, "lm"), train=not args.cached)
  if not args.cached:
    for run in planned(study, steps, rates):
      runs.get(run)
  rows = results(long_horizon.Runs(studies.runs(args.out, "lm"), train=False), study, steps, rates)
  notes = [
    f"The {study.preset} preset, r = {study.rank}, K = {study.sync_every}, batch "
    f"{study.batch_size} per worker, 8 simulated workers, warmup {study.warmup_steps} then "
    f"cosine over the run; seeds {list(study.seeds)}; each method at "
    + (
      "the quick sweep's first rate"
      if args.quick
      else "the long-horizon study's best rate at this horizon (long_horizon.md)"
    )
    + ", the same for every overlap.",
    "vs none: the relative difference of the final validation loss from the same method "
    "and seed without overlap (positive: overlap is worse); its mean over the seeds "
    "present. Streaming merges with alpha = 0.5.",
  ]
  studies.write(
    NAME,
    args,
    {"steps": steps, "rows": rows, "wall_time_s": time.perf_counter() - start},
    "What overlapping the sync costs in quality",
    markdown(rows, study, steps),
    notes,
  )
  return 0


if __name__ == "__main__":
  lm_runs.simulate_devices()
  raise SystemExit(main())
