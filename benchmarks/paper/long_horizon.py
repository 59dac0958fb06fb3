r"""The paper's claims over many rounds: the quality study at 4x and 8x its steps.

    python benchmarks/paper/long_horizon.py             # 1,024 and 2,048 steps: many CPU-hours
    python benchmarks/paper/long_horizon.py --cached    # report what is cached, train nothing
    python benchmarks/paper/long_horizon.py --quick     # tiny preset, 48 steps: about 30 s

The quality study (:mod:`quality`) trains 256 steps, 16 rounds of K = 16. This study
trains the same model, data, workers, rank and K for ``--horizons`` steps (default 1,024
and 2,048: 64 and 128 rounds; warmup 32, then cosine over the whole run). Each method of
:data:`METHODS` runs at the learning rate the quality study found best for it and at the
rates either side of it on the sweep's grid (and further out, one rate at a time, while
the rate at the sweep's edge wins); the rate with the lowest seed-0 loss at that horizon
is run with every seed (the quality study's rate with every seed in any
case); a rate more than :data:`PRUNE` (10%) above the best seed-0 loss at the shorter
horizon is not swept again at the longer one. A method's loss at a horizon is the mean
over seeds at its best rate there. LoRDO's gap to low-rank DDP is then read against the
number of rounds (16 from the quality study, then each horizon), with the exponent of a
power law fitted through the points where the gap is positive; claims (b) and (c) are
read seed by seed at each horizon, and the rank x batch sweep of claim (d) runs at the
longest horizon.

Runs go to the quality study's cache (``<out>/runs/lm``, one JSON file per run; see
:mod:`lm_runs`) in :data:`GROUPS`' order, most informative first (claim (d) as soon as
its two variants are in), so an interrupted study has its most useful rows;
``--cached`` writes the report from the runs present (rows still missing are marked).
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # Before NumPy loads: see quality.py.

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import pathlib  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks.*

from benchmarks.harness import lm_runs  # noqa: E402
from benchmarks.harness import quality_report  # noqa: E402
from benchmarks.harness import studies  # noqa: E402
from benchmarks.harness import variants  # noqa: E402
from benchmarks.quality import quality  # noqa: E402

# Trained group by group, each at every horizon: claim (a)'s pair first, then the rows
# of claims (b) and (c) with DDP, then claim (d) (its variants are in by then), then the
# other baselines.
GROUPS = (
  ("lordo", "low_rank_ddp"),
  ("ddp", "lordo_global_projection_only", "lordo_local_projection"),
  ("local_adam", "diloco", "desloc"),
)
METHODS = tuple(name for group in GROUPS for name in group)
QUICK_GROUPS = (("lordo", "low_rank_ddp"),)
# Claims (b) and (c): the variant each compares with LoRDO, seed by seed.
PAIRED = {"b": "lordo_local_projection", "c": "lordo_global_projection_only"}
# The sweep's grid, one step further at each end.
GRID = (5e-4, *quality.FULL.learning_rates, 7.5e-2)
NAME = "long_horizon"
# A rate this far (relative) above the best seed-0 loss at a horizon is not swept at the
# next longer one.
PRUNE = 0.10


def neighbours(rate: float, grid: tuple[float, ...]) -> list[float]:
  """``rate`` and the rates either side of it on ``grid`` (``rate`` first)."""
  i = grid.index(rate)
  return [rate, *grid[max(0, i - 1) : i], *grid[i + 1 : i + 2]]


def spec(study: quality.Study, steps: int, name: str, lr: float, seed: int, rank=None, batch=None):
  """The run of variant ``name`` at ``steps`` steps (the rest as the quality study)."""
  run = study.spec(variants.by_name(name), lr, seed, rank, batch)
  return dataclasses.replace(run, steps=steps)


class Runs:
  """The runs of the study, trained (or read) on demand, or only read (``train=False``)."""

  def __init__(self, cache: pathlib.Path, train: bool):
    self.cache, self.train = cache, train

  def get(self, run: lm_runs.RunSpec) -> dict | None:
    path = self.cache / run.file_name()
    if self.train:
      return lm_runs.run(run, self.cache)
    return json.loads(path.read_text()) if path.exists() else None


def final(record: dict | None) -> float | None:
  if record is None:
    return None
  loss = record["result"]["final_val_loss"]
  return loss if math.isfinite(loss) else math.inf


def method_at(
  runs: Runs, study, steps: int, name: str, tuned: float, grid, shorter: dict | None = None
) -> dict:
  """One method at one horizon: its seed-0 sweep over the neighbours of ``tuned``, then
  every seed at ``tuned`` and at the best rate of the sweep.

  A neighbour that wins the sweep may not be the best rate: the sweep goes on past it,
  one rate of ``grid`` at a time, while the newest rate wins.

  ``shorter`` is the method's row at the next shorter horizon: a neighbour whose seed-0
  loss there was more than :data:`PRUNE` above that sweep's best is not run again (a
  rate that far off at 1,024 steps costs 2,048 more to confirm it)."""
  skipped = []
  if shorter is not None:
    seen = {float(lr): x for lr, x in shorter["sweep"].items() if x is not None}
    if seen:
      bound = (1 + PRUNE) * min(seen.values())
      skipped = [lr for lr in neighbours(tuned, grid) if lr != tuned and seen.get(lr, 0) > bound]

  def seed_0(lr: float) -> float | None:
    return final(runs.get(spec(study, steps, name, lr, study.seeds[0])))

  sweep = {lr: seed_0(lr) for lr in neighbours(tuned, grid) if lr not in skipped}
  while None not in sweep.values():
    winner = min(sweep, key=sweep.get)
    i = grid.index(winner) + (1 if winner > tuned else -1)
    if winner == tuned or not 0 <= i < len(grid) or grid[i] in sweep:
      break
    sweep[grid[i]] = seed_0(grid[i])
  done = {lr: x for lr, x in sweep.items() if x is not None}
  candidates = {tuned} | ({min(done, key=done.get)} if len(done) == len(sweep) else set())
  seeds = {}
  for lr in sorted(candidates):
    losses = [final(runs.get(spec(study, steps, name, lr, s))) for s in study.seeds]
    if all(x is not None for x in losses):
      seeds[f"{lr:g}"] = losses
  best = min(seeds, key=lambda lr: statistics.fmean(seeds[lr])) if seeds else None
  return {
    "method": name,
    "steps": steps,
    "tuned_lr": tuned,
    "sweep": {f"{lr:g}": x for lr, x in sweep.items()},
    "skipped": [f"{lr:g}" for lr in skipped],
    "seeds": seeds,
    "best_lr": best,
    "mean": statistics.fmean(seeds[best]) if best else None,
    "spread": statistics.stdev(seeds[best]) if best and len(seeds[best]) > 1 else 0.0,
    "complete": len(done) == len(sweep) and best is not None,
  }


def paired_claims(horizons: dict) -> list[dict]:
  """Claims (b) and (c) at each horizon: the variant of :data:`PAIRED` minus LoRDO, final
  loss seed by seed, each at its best rate there; a claim holds where every difference is
  positive (LoRDO lower at every seed), as in :mod:`quality_claims`. ``final`` is False
  while either method's sweep is unfinished (its rate may still change)."""
  rows = []
  for steps, methods in horizons.items():
    by_name = {r["method"]: r for r in methods}
    lordo = by_name.get("lordo")
    for claim, name in PAIRED.items():
      other = by_name.get(name)
      row = {"claim": claim, "method": name, "steps": int(steps)}
      if lordo is None or other is None or lordo["mean"] is None or other["mean"] is None:
        rows.append({**row, "complete": False})
        continue
      differences = [
        o - x
        for o, x in zip(
          other["seeds"][other["best_lr"]], lordo["seeds"][lordo["best_lr"]], strict=True
        )
      ]
      rows.append(
        {
          **row,
          "complete": True,
          "final": lordo["complete"] and other["complete"],
          "rates": {"lordo": lordo["best_lr"], name: other["best_lr"]},
          "differences": differences,
          "mean": statistics.fmean(differences),
          "holds": all(d > 0 for d in differences),
        }
      )
  return rows


def rank_batch(runs: Runs, study, steps: int, rates: dict) -> list[dict]:
  """Claim (d) at ``steps``, read as the quality study reads it: both variants of
  :data:`variants.RANK_BATCH` at every rank x batch, each at every rate of ``rates`` (the
  variants' best at ``steps``, found at the study's rank and batch) with every seed; in
  each cell, each variant at its rate of lower mean, paired by seed with the other. One
  rate per variant would not do: a rate tuned at batch 8 can be too high at batch 2."""
  grid = sorted(set(rates.values()))
  rows = []
  for r in study.ranks:
    for b in study.batch_sizes:
      by_rate = {
        name: {
          lr: [final(runs.get(spec(study, steps, name, lr, s, r, b))) for s in study.seeds]
          for lr in grid
        }
        for name in variants.RANK_BATCH
      }
      if any(None in xs for by_lr in by_rate.values() for xs in by_lr.values()):
        rows.append({"rank": r, "batch_size": b, "complete": False})
        continue
      best = {
        name: min(by_lr, key=lambda lr, by_lr=by_lr: statistics.fmean(by_lr[lr]))
        for name, by_lr in by_rate.items()
      }
      lordo, local = (by_rate[name][best[name]] for name in variants.RANK_BATCH)
      advantage = [a - b for a, b in zip(local, lordo, strict=True)]
      rows.append(
        {
          "rank": r,
          "batch_size": b,
          "complete": True,
          "learning_rate": best,
          "mean_by_learning_rate": {
            name: {f"{lr:g}": statistics.fmean(xs) for lr, xs in by_lr.items()}
            for name, by_lr in by_rate.items()
          },
          "losses": {name: by_rate[name][best[name]] for name in variants.RANK_BATCH},
          "advantage": advantage,
          "advantage_mean": statistics.fmean(advantage),
        }
      )
  return rows


def gap_rows(short: dict, horizons: dict, study) -> list[dict]:
  """LoRDO's (and every method's) relative gap to low-rank DDP at each number of rounds."""
  points = [(study.steps, {m["variant"]: m["mean"] for m in short["methods"]})]
  for steps, rows in horizons.items():
    points.append((steps, {r["method"]: r["mean"] for r in rows if r["mean"] is not None}))
  out = []
  for steps, means in points:
    reference = means.get("low_rank_ddp")
    for name, mean in means.items():
      if reference is not None and name != "low_rank_ddp":
        gap = (mean - reference) / reference
        out.append(
          {"method": name, "steps": steps, "rounds": steps // study.sync_every, "gap": gap}
        )
  return out


def power_law(rows: list[dict], method: str) -> float | None:
  """The exponent a of gap ~ rounds^a fitted (least squares in log-log) through the
  method's points with a positive gap; None with fewer than two."""
  points = [
    (math.log(r["rounds"]), math.log(r["gap"]))
    for r in rows
    if r["method"] == method and r["gap"] > 0
  ]
  if len(points) < 2:
    return None
  mx = statistics.fmean(x for x, _ in points)
  my = statistics.fmean(y for _, y in points)
  return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)


def run_study(runs: Runs, study, horizons: tuple[int, ...], groups, short: dict) -> dict:
  """Each group of methods at every horizon (shortest first), and claim (d) at the
  longest as soon as both its variants have their rate there (before the later groups).

  Within a group: every seed of every method at its quality-study rate first, seed by
  seed, at every horizon; then each method's sweep (:func:`method_at`), horizon by
  horizon. Claim (d) runs each variant at both variants' best rates of the longest
  horizon (:func:`rank_batch`). Quick mode (any study but :data:`quality.FULL`) runs each
  method at its quality-study rate only, with no sweep around it (its grid is that rate)."""
  tuned = short["best_lr"]
  grid = lambda name: GRID if study is quality.FULL else (tuned[name],)  # noqa: E731
  longest = max(horizons)
  found, claim_d, rates = {}, [], {}
  for group in groups:
    for steps in horizons:  # The group's comparison at its rates first, seed by seed, so
      for seed in study.seeds:  # that an interrupted study has paired seeds at every
        for name in group:  # horizon before it sweeps any.
          runs.get(spec(study, steps, name, tuned[name], seed))
    for i, steps in enumerate(horizons):
      for name in group:
        shorter = found[horizons[i - 1], name] if i else None
        found[steps, name] = method_at(runs, study, steps, name, tuned[name], grid(name), shorter)
    if not rates and all((longest, name) in found for name in variants.RANK_BATCH):
      for name in variants.RANK_BATCH:
        best = found[longest, name]["best_lr"]
        rates[name] = float(best) if best else tuned[name]
      claim_d = rank_batch(runs, study, longest, rates)
  methods = [name for group in groups for name in group]
  results = {steps: [found[steps, name] for name in methods] for steps in horizons}
  gaps = gap_rows(short, results, study)
  return {
    "horizons": {str(k): v for k, v in results.items()},
    "paired_claims": paired_claims(results),
    "rank_batch": claim_d,
    "rank_batch_steps": longest,
    "rank_batch_rates": rates,
    "gaps": gaps,
    "exponents": {name: power_law(gaps, name) for name in methods if name != "low_rank_ddp"},
  }


def _loss(row: dict) -> str:
  if row["mean"] is None:
    return "not yet run"
  n = len(row["seeds"][row["best_lr"]])
  return f"{row['mean']:.4f} +- {row['spread']:.4f} (n={n})"


def markdown(result: dict, short: dict, study) -> list[str]:
  """The per-horizon table, the gap table with its fitted exponents, claims (b) and (c)
  seed by seed, and claim (d)."""
  lines = []
  k = study.sync_every
  for steps, rows in result["horizons"].items():
    reference = next((r["mean"] for r in rows if r["method"] == "low_rank_ddp"), None)
    lines += [f"**{steps} steps ({int(steps) // k} rounds of K = {k})**", ""]
    lines += studies.table(
      [
        "method",
        "LR of the quality sweep",
        "seed 0 at each LR",
        "best LR here",
        "final val loss (mean +- sd)",
        "vs low-rank DDP",
      ],
      [
        [
          r["method"],
          f"{r['tuned_lr']:g}",
          ", ".join(
            [f"{lr}: {'-' if x is None else f'{x:.4f}'}" for lr, x in r["sweep"].items()]
            + [f"{lr}: skipped" for lr in r["skipped"]]
          ),
          r["best_lr"] or "-",
          _loss(r),
          "-"
          if r["mean"] is None or reference is None
          else f"{100 * (r['mean'] - reference) / reference:+.2f}%",
        ]
        for r in rows
      ],
      align="lrlrrr",
    )
    lines.append("")
  rounds = sorted({g["rounds"] for g in result["gaps"]})
  table = {(g["method"], g["rounds"]): g["gap"] for g in result["gaps"]}
  lines += [
    "Gap to low-rank DDP (relative, mean over seeds at each method's best rate) against rounds:",
    "",
  ]
  lines += studies.table(
    ["method", *(f"{n} rounds" for n in rounds), "exponent a (gap ~ rounds^a)"],
    [
      [
        name,
        *(f"{100 * table[name, n]:+.2f}%" if (name, n) in table else "-" for n in rounds),
        "-" if a is None else f"{a:+.2f}",
      ]
      for name, a in result["exponents"].items()
    ],
  )
  claims = [c for c in result["paired_claims"] if c["complete"]]
  if claims:
    lines += [
      "",
      "Claims (b) and (c): the variant minus LoRDO (final val loss, nats, paired by seed; "
      "positive: LoRDO lower), each at its best rate there; the claim holds where every "
      "seed is positive. (b): local projection; (c): no full-rank term (the subspace "
      "freezes by construction, quality.md).",
      "",
    ]
    lines += studies.table(
      ["claim", "steps (rounds)", "rates (LoRDO, variant)", "per seed", "mean", "holds"],
      [
        [
          f"({c['claim']}) {c['method']}",
          f"{c['steps']} ({c['steps'] // k})",
          ", ".join(str(lr) for lr in c["rates"].values()),
          ", ".join(f"{d:+.4f}" for d in c["differences"]),
          f"{c['mean']:+.4f}",
          ("yes" if c["holds"] else "no") + ("" if c["final"] else " (sweep unfinished)"),
        ]
        for c in claims
      ],
      align="llllrl",
    )
  if result["rank_batch"]:
    lines += [
      "",
      f"Claim (d) at {result['rank_batch_steps']} steps "
      "(advantage = local projection - LoRDO, nats, paired by seed):",
      "",
    ]
    lines += studies.table(
      ["rank", "batch per worker", "rates (LoRDO, local)", "advantage per seed", "mean"],
      [
        [
          r["rank"],
          r["batch_size"],
          ", ".join(f"{r['learning_rate'][n]:g}" for n in variants.RANK_BATCH)
          if r["complete"]
          else "-",
          ", ".join(f"{a:+.4f}" for a in r["advantage"]) if r["complete"] else "not yet run",
          f"{r['advantage_mean']:+.4f}" if r["complete"] else "-",
        ]
        for r in result["rank_batch"]
      ],
    )
  return lines


def plot(result: dict, path: pathlib.Path) -> None:
  """Each method's relative gap to low-rank DDP against the number of rounds (log x)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  for name in result["exponents"]:
    points = sorted((g["rounds"], 100 * g["gap"]) for g in result["gaps"] if g["method"] == name)
    if points:
      ax.plot(*zip(*points, strict=True), marker="o", label=name)
  ax.axhline(0, color="gray", linewidth=0.8)
  ax.set_xscale("log", base=2)
  ax.set_xlabel("rounds (K = 16 steps each; log scale)")
  ax.set_ylabel("final val loss vs low-rank DDP (%)")
  ax.set_title("The gap to low-rank DDP over longer runs", fontsize=10)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def add_options(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--horizons", default="1024,2048", help="comma-separated step counts")
  parser.add_argument("--cached", action="store_true", help="report the cached runs; train nothing")


def main(argv=None) -> int:
  args = studies.parse_args(
    __doc__,
    "tiny preset, 48 steps, LoRDO and low-rank DDP at the quality study's rates, 1 seed",
    argv,
    extra=add_options,
  )
  start = time.perf_counter()
  study = quality.QUICK if args.quick else quality.FULL
  horizons = (48,) if args.quick else tuple(sorted(int(h) for h in args.horizons.split(",")))
  groups = QUICK_GROUPS if args.quick else GROUPS
  args.flags = ["--cached"] if args.cached else []
  short = json.loads((args.out / quality_report.JSON_NAME).read_text())
  result = run_study(
    Runs(studies.runs(args.out, "lm"), train=not args.cached), study, horizons, groups, short
  )
  plot(result, args.out / f"{NAME}.png")
  notes = [
    f"The {study.preset} preset, r = {study.rank}, K = {study.sync_every}, batch "
    f"{study.batch_size} per worker, 8 workers, warmup {study.warmup_steps} then cosine over "
    f"each run; seeds {list(study.seeds)}; the {study.steps}-step points are the quality "
    "study's (quality.md).",
    "Quick mode: each method at the quality sweep's best rate only."
    if args.quick
    else "A method's rate at a horizon: the lowest seed-0 loss among the quality sweep's best "
    "and the grid's rates either side (further out while the rate at the edge wins); every "
    "seed runs there and at the quality sweep's rate, and "
    "the lower mean is reported. A rate more than "
    f"{100 * PRUNE:.0f}% above the best seed-0 loss at the shorter horizon is skipped at the "
    "longer one.",
    f"Plot: {NAME}.png.",
  ]
  studies.write(
    NAME,
    args,
    {**result, "wall_time_s": time.perf_counter() - start},
    "The claims over many rounds",
    markdown(result, short, study),
    notes,
  )
  return 0


if __name__ == "__main__":
  lm_runs.simulate_devices()
  raise SystemExit(main())
