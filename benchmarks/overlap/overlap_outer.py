r"""The outer optimizer for a whole round in flight: a sweep of its rate and momentum.

    python benchmarks/overlap/overlap_outer.py           # the sweep, 1,024 steps: CPU-hours
    python benchmarks/overlap/overlap_outer.py --cached  # report what is cached, train nothing
    python benchmarks/overlap/overlap_outer.py --quick   # tiny preset, 96 steps: a few minutes
    python benchmarks/overlap/overlap_outer.py --devices 16  # the M = 16 rows too

``overlap="round"`` (MATH.md §9) lands each round's mean one round late. The overlap
study (:mod:`overlap_quality`) kept each method's outer optimizer, which a blocking
round was tuned for, and lost 41% (LoRDO) and 75% (DiLoCo). On the round's mean
dynamics (identical workers, a round of local steps covers a fraction ``a`` of the way:
``D = a e``) the eager merge is ``e' = e - c ((1 - 1/M) e_old + e / M)`` with
``c = eta a`` for an outer SGD of rate ``eta``: its spectral radius at M = 8 is 0.89 at
``eta = 1, a = 0.9``, smallest (0.48) near ``c = 0.27``; momentum 0.9 makes it worse.
This study measures it: LoRDO and DiLoCo on the overlap study's LM (small preset, 8
simulated workers, r = 32, K = 16, 1,024 steps: 64 rounds, each at the long-horizon
study's best inner rate), ``overlap="round"``:

1. the rebase merge (each worker keeps its own steps and adds the mean minus its own
   message when the mean lands: the limit tau = K of ``overlap=tau``'s rebase) at
   :data:`REBASE_OUTERS`, seed 0;
2. eager, outer rate x Nesterov momentum on :data:`RATES` x :data:`MOMENTA`, seed 0;
3. the best eager settings at every seed, against the blocking round (and rebase's,
   where they beat eager's);
4. the worker count M in :data:`WORKERS` at the best eager settings and at the method's
   own outer optimizer, and the blocking round, seed 0;
5. delayed at the eager grid's best three settings of each method, seed 0;
6. the delay-corrected outer step (``delay_correction``, MATH.md §9: ``"staleness"`` and
   ``"step"``, eager, at each method's own outer optimizer and, for LoRDO, at DiLoCo's,
   :data:`CORRECTED_OUTERS`) at M in :data:`CORRECTION_WORKERS`, against the blocking
   round and today's best settings (LoRDO eager at ``sgd(0.7)``, DiLoCo rebase), seed 0,
   and the blocking worker count with the same loss (:func:`blocking_workers`);
   ``--quick``: M = 8;
7. every seed at M in :data:`SEEDED_WORKERS` (the targets' worker counts) for the
   blocking round, eager at each method's own outer optimizer (:data:`OWN_CORRECTION`:
   LoRDO's averaging outer taken as it is, DiLoCo's Nesterov step staleness-corrected,
   its default) and today's best settings (LoRDO's is its default with a round in
   flight, ``delay_correction="damped"``: ``sgd(0.7)`` taken as it is);
8. the inner rate with a round in flight: step 7's eager rows and today's best
   settings at M in :data:`SEEDED_WORKERS` at the other rates of the long-horizon
   study's grid (:data:`INNER_RATES`), seed 0, against the blocking round at its tuned
   rate, and as which blocking worker count;
9. every seed of each of step 8's rows at its best inner rate, where that is not the
   tuned one (whose seeds step 7 ran), against the blocking round at its tuned rate, and
   the step at which each seed's blocking round reached the row's final loss (the gap in
   steps: :func:`steps_to_reach`).

Every eager and delayed row of steps 1-5 takes its outer optimizer as it is
(``delay_correction="none"``), as the study first ran them.

Each worker needs a simulated device of its own (``--devices``, 8 by default): a row of
more workers than devices is left out of the run and named at its end, for a run with
``--devices M``. The devices beyond a row's M split each worker's batch (the LM's
``data`` axis), which changes its result only by float rounding, so the rows trained
on 8 devices and those on 16 are one study.

The outer optimizer is ``optax.sgd(rate, momentum, nesterov=True)`` (DiLoCo's kind; SGD
without momentum at 0); LoRDO's default is SGD at rate 1 (the workers' mean) and
DiLoCo's rate 0.7 and momentum 0.9, which the grid's rows at those settings are.
Runs go to the quality study's cache (:mod:`lm_runs`), each step's runs in turn, so an
interrupted study has its most useful rows; ``--cached`` writes the report of what is
there. It writes ``<out>/overlap_outer.json``, ``.md`` and ``.png`` (step 6's rows
against M).
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # Before NumPy loads: see quality.py.

import dataclasses  # noqa: E402
import itertools  # noqa: E402
import math  # noqa: E402
import pathlib  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks.*

from benchmarks.harness import lm_runs  # noqa: E402
from benchmarks.harness import studies  # noqa: E402
from benchmarks.harness import variants  # noqa: E402
from benchmarks.overlap import overlap_quality  # noqa: E402
from benchmarks.paper import long_horizon  # noqa: E402
from benchmarks.quality import quality  # noqa: E402

NAME = "overlap_outer"
STEPS = overlap_quality.STEPS
METHODS = overlap_quality.METHODS
RATES = (0.1, 0.3, 0.7)
MOMENTA = (0.0, 0.6, 0.9)
# The grid in the order it is trained: what the mean dynamics predict best first.
GRID = tuple(
  (rate, momentum) for momentum in MOMENTA for rate in sorted(RATES, key=lambda r: abs(r - 0.3))
)
# Each method's outer optimizer as the library builds it (a blocking round's).
DEFAULT_OUTER = {"lordo": (1.0, 0.0), "diloco": (0.7, 0.9)}
# LoRDO's default basis refresh, named, so that its blocking runs are the refresh study's.
NAMED_OPTIONS = {"lordo": (("projection", "subspace_iteration"),), "diloco": ()}
WORKERS = (2, 4, 8, 16)
BEST_DELAYED = 3  # Delayed runs at this many of the eager grid's best settings.
CORRECTIONS = ("staleness", "step")  # delay_correction, MATH.md §9
CORRECTION_WORKERS = (2, 4, 8, 16)
# The worker counts whose rows of step 7 run every seed, and the correction step 7 takes
# at each method's own outer optimizer: LoRDO's averaging outer as it is (its default
# until the study found "damped", today's best row, better at every M), DiLoCo's default.
SEEDED_WORKERS = (2, 8)
OWN_CORRECTION = {"lordo": "none", "diloco": "staleness"}
# The outer optimizers corrected: each method's own, and for LoRDO DiLoCo's Nesterov step
# too, which diverged with LoRDO's eager round uncorrected (step 2) and which a
# correction is meant to keep stable.
CORRECTED_OUTERS = {"lordo": ((1.0, 0.0), (0.7, 0.9)), "diloco": ((0.7, 0.9),)}
# Today's best setting of each method with a round in flight (the study's steps 1-3).
TODAYS_BEST = {"lordo": ("eager", (0.7, 0.0)), "diloco": ("rebase", (0.7, 0.9))}
# The rebase merge with a whole round in flight (tau = K): at the method's own outer
# optimizer and at the other method's kind of outer step.
REBASE_OUTERS = {"lordo": ((1.0, 0.0), (0.7, 0.9)), "diloco": ((0.7, 0.9), (1.0, 0.0))}
# The long-horizon study's inner rates but the tuned one (0.0125 and 0.0005), for step 8.
INNER_RATES = {"lordo": (0.005, 0.03), "diloco": (0.001, 0.002)}


def variant(
  method: str, merge: str | None, outer: tuple[float, float], correction: str = "none"
) -> variants.Variant:
  """``method`` with a round in flight merged by ``merge`` (``None``: blocking), the
  outer optimizer ``outer = (rate, momentum)`` and, eager or delayed, its
  ``delay_correction``; the method's own variant where all are its defaults."""
  base = variants.by_name(method)
  options = NAMED_OPTIONS[method]
  name = "_".join([method, *(str(value) for _, value in options)])
  if merge is not None:
    options += (("overlap", "round"), ("merge", merge))
    name = f"{method}_round_{merge}"
  if merge in ("eager", "delayed"):
    options += (("delay_correction", correction),)
    name += "" if correction == "none" else f"_{correction}"
  if outer != DEFAULT_OUTER[method]:
    options += (("outer_learning_rate", outer[0]), ("outer_momentum", outer[1]))
    name += f"_outer{outer[0]:g}m{outer[1]:g}"
  return base._replace(name=name, options=base.options + options)


@dataclasses.dataclass(frozen=True)
class Row:
  """One configuration: a method, its merge (``None``: blocking), outer settings, M."""

  method: str
  merge: str | None
  outer: tuple[float, float]
  workers: int = 8
  correction: str = "none"  # delay_correction, eager or delayed
  inner_rate: float | None = None  # None: the method's tuned rate

  def spec(self, study, steps, rates, seed) -> lm_runs.RunSpec:
    built = variant(self.method, self.merge, self.outer, self.correction)
    rate = rates[self.method] if self.inner_rate is None else self.inner_rate
    run = study.spec(built, rate, seed)
    return dataclasses.replace(run, steps=steps, num_workers=self.workers)


def best(rows: list[Row], loss) -> list[Row]:
  """``rows`` by their seed-0 loss, best first (rows not yet run last)."""
  return sorted(rows, key=lambda row: math.inf if loss(row, 0) is None else loss(row, 0))


def plan(study, steps, rates, loss) -> list[list[Row]]:
  """The study's steps in the order they are trained, each a list of rows (see
  :data:`STEPS_SEEDS`); a later step reads the losses of the earlier ones
  (``loss(row, seed)``, None if not run)."""
  blocking = [Row(m, None, DEFAULT_OUTER[m]) for m in METHODS]
  rebase = [Row(m, "rebase", outer) for m in METHODS for outer in REBASE_OUTERS[m]]
  eager = [Row(m, "eager", outer) for outer in GRID for m in METHODS]
  eager += [Row(m, "eager", DEFAULT_OUTER[m]) for m in METHODS]
  top = {m: best([r for r in eager if r.method == m], loss) for m in METHODS}
  top_rebase = {m: best([r for r in rebase if r.method == m], loss) for m in METHODS}
  delayed = [Row(m, "delayed", r.outer) for m in METHODS for r in top[m][:BEST_DELAYED]]
  # Every seed for the best eager settings, and for rebase where it beats them.
  finals = blocking + [top[m][0] for m in METHODS]
  finals += [
    top_rebase[m][0]
    for m in METHODS
    if best([top[m][0], top_rebase[m][0]], loss)[0].merge != "eager"
  ]
  workers = [
    dataclasses.replace(row, workers=w)
    for rows in ((top[m][0], Row(m, None, DEFAULT_OUTER[m])) for m in METHODS)
    for w in WORKERS
    for row in rows
  ]
  workers += [
    dataclasses.replace(Row(m, "eager", DEFAULT_OUTER[m]), workers=w)
    for m in METHODS
    for w in WORKERS
  ]
  corrections = _beside_blocking(
    CORRECTION_WORKERS,
    lambda m, w: [Row(m, "eager", o, w, c) for o in CORRECTED_OUTERS[m] for c in CORRECTIONS],
  )
  seeded = _beside_blocking(
    SEEDED_WORKERS, lambda m, w: [Row(m, "eager", DEFAULT_OUTER[m], w, OWN_CORRECTION[m])]
  )
  inner = [
    dataclasses.replace(row, inner_rate=rate)
    for row in seeded
    if row.merge is not None
    for rate in INNER_RATES[row.method]
  ]
  at_best_rate = [
    best_rate
    for row in seeded
    if row.merge is not None
    for best_rate in best([row, *(r for r in inner if _at_tuned_rate(r) == row)], loss)[:1]
    if best_rate.inner_rate is not None and loss(best_rate, 0) is not None
  ]
  steps = [blocking + rebase, eager, finals, workers, delayed, corrections, seeded, inner]
  return steps + [at_best_rate]


def _at_tuned_rate(row: Row) -> Row:
  return dataclasses.replace(row, inner_rate=None)


def _beside_blocking(workers, settings) -> list[Row]:
  """Each method at each M of ``workers``: its blocking round, the rows
  ``settings(method, M)`` and today's best settings."""
  return [
    row
    for m in METHODS
    for w in workers
    for row in (
      Row(m, None, DEFAULT_OUTER[m], w),
      *settings(m, w),
      Row(m, TODAYS_BEST[m][0], TODAYS_BEST[m][1], w),
    )
  ]


# Each step of plan(): whether it runs every seed (else seed 0).
STEPS_SEEDS = (False, False, True, False, False, False, True, False, True)


def add_options(parser) -> None:
  overlap_quality.add_options(parser)
  parser.add_argument(
    "--devices",
    type=int,
    default=lm_runs.DEVICES,
    help="simulated CPU devices, set before JAX starts (rows of more workers are left "
    "for a run with more)",
  )


def main(argv=None) -> int:
  args = studies.parse_args(__doc__, "tiny preset, 96 steps, 1 seed", argv, extra=add_options)
  start = time.perf_counter()
  study = quality.QUICK if args.quick else quality.FULL
  steps = 96 if args.quick else STEPS
  devices = jax.device_count()
  rates = (
    {m: overlap_quality.QUICK_LEARNING_RATE for m in METHODS}
    if args.quick
    else overlap_quality.tuned_rates(args.out, steps)
  )
  args.flags = ["--cached"] if args.cached else []
  args.flags += [f"--devices={args.devices}"] if args.devices != lm_runs.DEVICES else []
  cache = studies.runs(args.out, "lm")
  stored = long_horizon.Runs(cache, train=False)

  def loss(row: Row, seed: int) -> float | None:
    return long_horizon.final(stored.get(row.spec(study, steps, rates, seed)))

  def curve(row: Row, seed: int) -> list[tuple[int, float]] | None:
    record = stored.get(row.spec(study, steps, rates, seed))
    return (
      None if record is None else [(e["step"], e["val_loss"]) for e in record["result"]["evals"]]
    )

  seeds_of = [study.seeds if every else study.seeds[:1] for every in STEPS_SEEDS]
  left_out = {}  # Rows of more workers than devices, by M (a dict as an ordered set).
  if not args.cached:
    trainer = long_horizon.Runs(cache, train=True)
    for index, seeds in enumerate(seeds_of):
      for row in plan(study, steps, rates, loss)[index]:
        for seed in seeds:
          if args.quick and row.workers != 8:
            continue
          if row.workers > devices:
            if loss(row, seed) is None:
              left_out.setdefault(row.workers, {})[row] = None
            continue
          trainer.get(row.spec(study, steps, rates, seed))
  steps_rows = plan(study, steps, rates, loss)
  report = results(steps_rows, study.seeds, loss, curve)
  plot(report, args.out / f"{NAME}.png")
  studies.write(
    NAME,
    args,
    {"steps": steps, "inner_rates": rates, **report, "wall_time_s": time.perf_counter() - start},
    "The outer optimizer for a whole round in flight",
    markdown(report, steps, study),
    notes(study, rates),
  )
  for workers, rows in sorted(left_out.items()):
    print(
      f"{len(rows)} rows at M = {workers} not trained: {devices} simulated devices, one a "
      f"worker; run again with --devices {workers} to train them."
    )
  return 0


def steps_to_reach(curve: list[tuple[int, float]], loss: float) -> float | None:
  """The first step at which ``curve`` (``(step, validation loss)`` pairs, in step order)
  reaches ``loss``, linear between its evaluations; ``None`` if it never does."""
  if curve and curve[0][1] <= loss:
    return float(curve[0][0])
  for (s0, x0), (s1, x1) in itertools.pairwise(curve):
    if x1 <= loss:  # x0 > loss >= x1: the crossing lies between them.
      return s0 + (s1 - s0) * (x0 - loss) / (x0 - x1)
  return None


def blocking_workers(points: list[tuple[int, float]], loss: float) -> float | None:
  """The worker count at which the blocking round reaches ``loss``: ``points`` are its
  ``(M, final loss)`` in M order, linear in ``log2 M`` between them, the first crossing
  from the fewest workers up; ``None`` where the fewest workers' blocking run is already
  below ``loss``, ``math.inf`` where no blocking run reaches it."""
  if not points or points[0][1] < loss:
    return None
  found = steps_to_reach([(math.log2(m), x) for m, x in points], loss)
  return math.inf if found is None else 2**found


def _blocking_steps(row: Row, seeds, loss, curve, blocking: Row) -> dict:
  """Per seed, the step at which the blocking run of that seed first reached ``row``'s
  final loss: the steps a blocking round needs for what ``row`` reaches in the whole run."""
  steps = {}
  for s in seeds:
    final, base = loss(row, s), curve(blocking, s)
    if final is not None and base is not None:
      steps[str(s)] = steps_to_reach(base, final)
  return steps


def _summary(row: Row, seeds, loss, blocking: Row) -> dict:
  """A row's losses per seed, mean and spread, and relative difference from ``blocking``
  (the same method, M and seed, every sync blocking)."""
  have = {s: x for s in seeds if (x := loss(row, s)) is not None}
  base = {s: x for s in seeds if (x := loss(blocking, s)) is not None}
  paired = [(x - base[s]) / base[s] for s, x in have.items() if s in base]
  finite = have and all(math.isfinite(x) for x in have.values())
  return {
    "method": row.method,
    "merge": row.merge or "blocking",
    "outer_learning_rate": row.outer[0],
    "outer_momentum": row.outer[1],
    "workers": row.workers,
    "losses": {str(s): x for s, x in have.items()},
    "mean": statistics.fmean(have.values()) if finite else None,
    "spread": statistics.stdev(have.values()) if finite and len(have) > 1 else 0.0,
    "vs_blocking": statistics.fmean(paired) if paired and finite else None,
    "delay_correction": row.correction if row.merge in ("eager", "delayed") else "-",
  }


def results(steps_rows, seeds, loss, curve=None) -> dict:
  """The grid (eager and delayed, seed 0), the best settings at every seed, the M sweep.
  With ``curve(row, seed)`` (a run's ``(step, validation loss)`` pairs), step 9's rows
  also hold ``blocking_steps``: per seed, the step at which the blocking round reached
  the row's final loss (:func:`steps_to_reach`)."""
  blocking = {
    (r.method, r.workers): r
    for rows in steps_rows
    for r in rows
    if r.merge is None and r.outer == DEFAULT_OUTER[r.method]
  }

  def reference(row):
    own = Row(row.method, None, DEFAULT_OUTER[row.method], row.workers)
    return blocking.get((row.method, row.workers), own)

  def summary(row, on_seeds):
    return _summary(row, on_seeds, loss, reference(row))

  def as_blocking(row):
    """Seed 0: the blocking worker count with ``row``'s loss (:func:`blocking_workers`),
    from the blocking rows of its method at every M the study ran."""
    points = sorted(
      (w, x)
      for (method, w), b in blocking.items()
      if method == row.method and (x := loss(b, seeds[0])) is not None
    )
    final = loss(row, seeds[0])
    found = None if final is None or not points else blocking_workers(points, final)
    return {"blocking_workers": found, "blocking_workers_range": [p[0] for p in points]}

  def in_steps(row):
    if curve is None:
      return {}
    return {"blocking_steps": _blocking_steps(row, seeds, loss, curve, reference(row))}

  rows = dict.fromkeys([*steps_rows[0], *steps_rows[1], *steps_rows[4]])
  grid = [summary(r, seeds[:1]) for r in rows if r.merge is not None]
  finals = [summary(r, seeds) for r in dict.fromkeys(steps_rows[2])]
  workers = [summary(r, seeds[:1]) for r in dict.fromkeys(steps_rows[3])]
  corrections = [summary(r, seeds[:1]) | as_blocking(r) for r in dict.fromkeys(steps_rows[5])]
  seeded = [summary(r, seeds) for r in dict.fromkeys(steps_rows[6])]
  at_rates = [
    row
    for tuned in steps_rows[6]
    if tuned.merge is not None
    for row in (
      tuned,
      *(r for r in steps_rows[7] if _at_tuned_rate(r) == tuned),
    )
  ]
  rates = [
    summary(r, seeds[:1]) | {"inner_rate": r.inner_rate} | as_blocking(r)
    for r in dict.fromkeys(at_rates)
  ]
  seeded_rates = [
    summary(r, seeds) | {"inner_rate": r.inner_rate} | in_steps(r)
    for tuned in steps_rows[6]
    if tuned.merge is not None
    for r in (tuned, *(r for r in steps_rows[8] if _at_tuned_rate(r) == tuned))
    if any(_at_tuned_rate(b) == tuned for b in steps_rows[8])
  ]
  return {
    "grid": grid,
    "best": finals,
    "workers": workers,
    "corrections": corrections,
    "seeded": seeded,
    "rates": rates,
    "seeded_rates": seeded_rates,
  }


CORRECTED_COLUMNS = ("method", "merge", "delay_correction", "outer rate", "momentum", "M")


def _corrected_setting(r: dict) -> list[str]:
  """A row's cells under :data:`CORRECTED_COLUMNS`."""
  outer = (f"{r['outer_learning_rate']:g}", f"{r['outer_momentum']:g}")
  return [r["method"], r["merge"], r["delay_correction"], *outer, str(r["workers"])]


def _seed_cells(r: dict) -> list[str]:
  """A row's loss per seed and its mean +- spread (n), for a table of every seed."""
  per_seed = ", ".join(f"{x:.4f}" for x in r["losses"].values()) or "not yet run"
  if r["mean"] is None:
    return [per_seed, "-"]
  return [per_seed, f"{r['mean']:.4f} +- {r['spread']:.4f} (n={len(r['losses'])})"]


def _steps_cell(steps: dict) -> str:
  """Steps per seed (``never``: not reached), or ``-`` where none are known."""
  cells = ["never" if x is None else f"{x:.0f}" for x in steps.values()]
  return ", ".join(cells) or "-"


def _workers_cell(r: dict) -> str:
  """The blocking worker count with a row's loss, or where it lies outside the blocking
  runs' range of M; ``-`` where its run or theirs is missing."""
  found, known = r.get("blocking_workers"), r.get("blocking_workers_range", [])
  if not known or r["mean"] is None:
    return "-"
  if found is None:
    return f"< {known[0]}"
  return f"> {known[-1]}" if math.isinf(found) else f"{found:.1f}"


def _fmt(x, spec=".4f"):
  return "-" if x is None else format(x, spec)


def _percent(x):
  return "-" if x is None else f"{100 * x:+.1f}%"


def markdown(report: dict, steps: int, study) -> list[str]:
  lines = [f"**{steps} steps ({steps // study.sync_every} rounds of K = {study.sync_every})**", ""]
  lines += ["Seed 0, each merge and outer rate x Nesterov momentum, vs the blocking round:", ""]
  grid_rows = [
    [
      r["method"],
      r["merge"],
      f"{r['outer_learning_rate']:g}",
      f"{r['outer_momentum']:g}",
      _fmt(r["mean"]),
      _percent(r["vs_blocking"]),
    ]
    for r in report["grid"]
  ]
  lines += studies.table(
    ["method", "merge", "outer rate", "momentum", "final val loss", "vs blocking"],
    grid_rows,
    align="llrrrr",
  )
  lines += ["", "The best settings at every seed:", ""]
  lines += studies.table(
    ["method", "merge", "outer rate", "momentum", "loss per seed", "mean +- sd (n)", "vs blocking"],
    [
      [
        r["method"],
        r["merge"],
        f"{r['outer_learning_rate']:g}",
        f"{r['outer_momentum']:g}",
        *_seed_cells(r),
        _percent(r["vs_blocking"]),
      ]
      for r in report["best"]
    ],
    align="llrrrrr",
  )
  lines += ["", "The worker count M, seed 0 (each against the blocking round at the same M):", ""]
  lines += studies.table(
    ["method", "merge", "outer rate", "momentum", "M", "final val loss", "vs blocking"],
    [
      [
        r["method"],
        r["merge"],
        f"{r['outer_learning_rate']:g}",
        f"{r['outer_momentum']:g}",
        str(r["workers"]),
        _fmt(r["mean"]),
        _percent(r["vs_blocking"]),
      ]
      for r in report["workers"]
    ],
    align="llrrrrr",
  )
  lines += [
    "",
    "The delay-corrected outer step at each M, seed 0, at each method's own outer optimizer "
    "(and LoRDO at DiLoCo's), against the blocking round and today's best settings (each "
    "against the blocking round at the same M). *As blocking M*: the worker count at which "
    "the blocking round, seed 0, reaches the row's loss (linear in log M between the M it "
    "ran at):",
    "",
  ]
  lines += studies.table(
    [*CORRECTED_COLUMNS, "final val loss", "vs blocking", "as blocking M"],
    [
      [
        *_corrected_setting(r),
        _fmt(r["mean"]),
        _percent(r["vs_blocking"]),
        _workers_cell(r),
      ]
      for r in report.get("corrections", [])
    ],
    align="lllrrrrrr",
  )
  lines += [
    "",
    "Every seed at M in " + ", ".join(map(str, SEEDED_WORKERS)) + ": the blocking round, "
    "eager at each method's own outer optimizer and today's best settings (LoRDO's is its "
    "default with a round in flight, delay_correction='damped': sgd(0.7) taken as it is):",
    "",
  ]
  lines += studies.table(
    [*CORRECTED_COLUMNS, "loss per seed", "mean +- sd (n)", "vs blocking"],
    [
      [
        *_corrected_setting(r),
        *_seed_cells(r),
        _percent(r["vs_blocking"]),
      ]
      for r in report.get("seeded", [])
    ],
    align="lllrrrrrr",
  )
  lines += [
    "",
    "The inner rate with a round in flight, seed 0: the rows above but the blocking "
    "round's, at the tuned rate and the long-horizon grid's others, against the blocking "
    "round at its tuned rate, and as which blocking worker count (as above):",
    "",
  ]
  lines += studies.table(
    [*CORRECTED_COLUMNS, "inner rate", "final val loss", "vs blocking", "as blocking M"],
    [
      [
        *_corrected_setting(r),
        "tuned" if r["inner_rate"] is None else f"{r['inner_rate']:g}",
        _fmt(r["mean"]),
        _percent(r["vs_blocking"]),
        _workers_cell(r),
      ]
      for r in report.get("rates", [])
    ],
    align="lllrrrrrrr",
  )
  lines += [
    "",
    "Every seed of each row whose best inner rate (seed 0) is not the tuned one, beside "
    "its seeds at the tuned rate, against the blocking round at its tuned rate; and the "
    f"step at which that seed's blocking round reached the row's loss at step {steps}:",
    "",
  ]
  lines += studies.table(
    [
      *CORRECTED_COLUMNS,
      "inner rate",
      "loss per seed",
      "mean +- sd (n)",
      "vs blocking",
      "blocking's steps to it",
    ],
    [
      [
        *_corrected_setting(r),
        "tuned" if r["inner_rate"] is None else f"{r['inner_rate']:g}",
        *_seed_cells(r),
        _percent(r["vs_blocking"]),
        _steps_cell(r.get("blocking_steps", {})),
      ]
      for r in report.get("seeded_rates", [])
    ],
    align="lllrrrrrrrr",
  )
  return lines


def plot(report: dict, path: pathlib.Path) -> None:
  """The corrections' rows, each method's settings against the worker count, with its
  own outer optimizer uncorrected (step 4's rows): the final validation loss relative to
  the blocking round at the same M (log x)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, len(METHODS), figsize=(9.6, 4.0), sharey=True)
  for ax, method in zip(axes, METHODS, strict=True):
    lines: dict[str, list] = {}
    uncorrected = [
      {**r, "delay_correction": "none"}
      for r in report["workers"]
      if r["merge"] == "eager"
      and (r["outer_learning_rate"], r["outer_momentum"]) == DEFAULT_OUTER[r["method"]]
    ]
    for r in report["corrections"] + uncorrected:
      if r["method"] != method or r["merge"] == "blocking" or r["vs_blocking"] is None:
        continue
      label = f"{r['merge']}, outer {r['outer_learning_rate']:g}/{r['outer_momentum']:g}"
      if r["merge"] in ("eager", "delayed"):
        label += f", {r['delay_correction']}"
      lines.setdefault(label, []).append((r["workers"], 100 * r["vs_blocking"]))
    for label, points in lines.items():
      ax.plot(*zip(*sorted(points), strict=True), marker="o", label=label)
    ax.axhline(0, color="gray", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(CORRECTION_WORKERS, [str(w) for w in CORRECTION_WORKERS])
    ax.set_xlabel("workers M")
    ax.set_title(f"{method}: a whole round in flight", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  axes[0].set_ylabel("final val loss vs blocking at the same M (%)")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def notes(study, rates) -> list[str]:
  return [
    f"The {study.preset} preset, r = {study.rank}, K = {study.sync_every}, batch "
    f"{study.batch_size} per worker, warmup {study.warmup_steps} then cosine over the run; "
    f"inner rates {rates} (the long-horizon study's best at this horizon); seeds "
    f"{list(study.seeds)}.",
    "Outer optimizer: optax.sgd(rate, momentum, nesterov=True), plain SGD at momentum 0. "
    "LoRDO's blocking default is rate 1, momentum 0 (the workers' mean); DiLoCo's 0.7, 0.9.",
    "vs blocking: the relative difference of the final validation loss from the same method, "
    "seed and M with every sync blocking at the method's default outer optimizer (positive: "
    "worse); its mean over the seeds present.",
  ]


if __name__ == "__main__":
  lm_runs.simulate_devices(studies.parse_args(__doc__, "", extra=add_options).devices)
  raise SystemExit(main())
