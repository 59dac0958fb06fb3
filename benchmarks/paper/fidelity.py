r"""The measured effect of each of the paper's variants (docs/FIDELITY.md) on the LM.

    python benchmarks/paper/fidelity.py          # the quality study's settings, 3 seeds: ~35 min
    python benchmarks/paper/fidelity.py --quick  # the tiny preset, 1 seed, 3 changes: ~30 s

Each row changes one setting of LoRDO (or of the low-rank DDP baseline) to the paper's
or the authors' value, everything else as in the quality study (:mod:`quality`: the
``small`` preset, 256 steps, r = 32, K = 16, warmup 32 then cosine) at the learning
rate the quality study found best for that method, over its seeds. The effect is the
change of the final validation loss against the method's own default run, paired by
seed (the default rows are the quality study's own runs, read from its cache). The
whole protocol (warm start, the betas' switch, constant schedule, all options
together) is ``paper_protocol.py``.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # Before NumPy loads: see quality.py.

import dataclasses  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402
from typing import NamedTuple  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks.*

from benchmarks.harness import lm_runs  # noqa: E402
from benchmarks.harness import quality_report  # noqa: E402
from benchmarks.harness import studies  # noqa: E402
from benchmarks.harness import variants  # noqa: E402
from benchmarks.harness.variants import Variant  # noqa: E402
from benchmarks.quality import quality  # noqa: E402


class Change(NamedTuple):
  """One row: ``options`` added to ``base``'s factory, or a setting of the run changed."""

  name: str
  base: str  # "lordo" or "low_rank_ddp": the quality study's row it changes.
  point: str  # Where docs/FIDELITY.md discusses it.
  options: tuple[tuple[str, Any], ...] = ()
  sync_every: int | None = None  # K of the run, if changed.
  clip_norm: float | None = None


CHANGES = (
  Change("omega=0.97", "lordo", "2", (("omega", 0.97),)),
  Change("error feedback", "lordo", "7", (("error_feedback", True),)),
  Change(
    "error feedback, numerator G + E",
    "lordo",
    "4, 7",
    (("error_feedback", True), ("full_rank_numerator", "error_fed")),
  ),
  Change("low-rank term Q u_hat (not / D)", "lordo", "3", (("low_rank_term", "momentum"),)),
  Change("side=galore_std", "lordo", "16", (("side", "galore_std"),)),
  Change("full-rank QHAdam nu=0.97", "lordo", "15", (("full_rank_nu", 0.97),)),
  Change("K=32", "lordo", "12", sync_every=32),
  Change("clip 0.5", "lordo", "9", clip_norm=0.5),
  Change(
    "authors' LoRDO options together",
    "lordo",
    "2, 4, 7, 9, 15",
    (
      ("omega", 0.97),
      ("error_feedback", True),
      ("full_rank_numerator", "error_fed"),
      ("full_rank_nu", 0.97),
    ),
    clip_norm=0.5,
  ),
  # The together row without clipping: every part of it that is a library option.
  Change(
    "authors' LoRDO options together, no clipping",
    "lordo",
    "2, 4, 7, 15",
    (
      ("omega", 0.97),
      ("error_feedback", True),
      ("full_rank_numerator", "error_fed"),
      ("full_rank_nu", 0.97),
    ),
  ),
  # ... and without the full-rank QH term either.
  Change(
    "omega=0.97, error feedback, numerator G + E",
    "lordo",
    "2, 4, 7",
    (("omega", 0.97), ("error_feedback", True), ("full_rank_numerator", "error_fed")),
  ),
  Change("error feedback", "low_rank_ddp", "22", (("error_feedback", True),)),
  Change("QH inside, nu=0.94", "low_rank_ddp", "22", (("qh_nu", 0.94),)),
  Change(
    "authors' baseline options together",
    "low_rank_ddp",
    "22",
    (
      ("error_feedback", True),
      ("transport", "rotate"),
      ("qh_nu", 0.94),
      ("full_rank_nu", 0.94),
    ),
    clip_norm=0.5,
  ),
)


# Quick mode: one change of each kind (the run's K and clipping on LoRDO, an option of the
# method's factory on the baseline), so that both methods' defaults are paired.
QUICK_CHANGES = ("K=32", "clip 0.5", "QH inside, nu=0.94")


def spec(study: quality.Study, change: Change | None, base: str, lr: float, seed: int):
  """The run of ``change`` (None: ``base`` itself, the quality study's run)."""
  if change is None:
    return study.spec(variants.by_name(base), lr, seed)
  name = re.sub(r"[^A-Za-z0-9=.]+", "_", f"{base}__{change.name}").strip("_")
  run = study.spec(Variant(name, base, change.options), lr, seed)
  k = change.sync_every or study.sync_every
  return dataclasses.replace(run, sync_every=k, eval_every=k, clip_norm=change.clip_norm)


def measure(study: quality.Study, out, changes=CHANGES) -> list[dict]:
  """Every row of ``changes`` over the study's seeds, with its base's runs."""
  best_lr = json.loads((out / quality_report.JSON_NAME).read_text())["best_lr"]
  final = lambda record: record["result"]["final_val_loss"]  # noqa: E731
  base = {
    name: [
      final(lm_runs.run(spec(study, None, name, best_lr[name], s), studies.runs(out, "lm")))
      for s in study.seeds
    ]
    for name in ("lordo", "low_rank_ddp")
  }
  rows = []
  for change in changes:
    lr = best_lr[change.base]
    losses = [
      final(lm_runs.run(spec(study, change, change.base, lr, s), studies.runs(out, "lm")))
      for s in study.seeds
    ]
    effect = [a - b for a, b in zip(losses, base[change.base], strict=True)]
    rows.append(
      {
        **change._asdict(),
        "learning_rate": lr,
        "losses": losses,
        "base_losses": base[change.base],
        "mean": statistics.fmean(losses),
        "effect": effect,
        "effect_mean": statistics.fmean(effect),
        "effect_spread": statistics.stdev(effect) if len(effect) > 1 else 0.0,
      }
    )
  return rows


def markdown(rows: list[dict]) -> list[str]:
  return studies.table(
    [
      "method",
      "change (FIDELITY point)",
      "LR",
      "final val loss (mean)",
      "default",
      "change - default, per seed",
      "mean",
    ],
    [
      [
        r["base"],
        f"{r['name']} ({r['point']})",
        f"{r['learning_rate']:g}",
        f"{r['mean']:.4f}",
        f"{statistics.fmean(r['base_losses']):.4f}",
        ", ".join(f"{e:+.4f}" for e in r["effect"]),
        f"{r['effect_mean']:+.4f} +- {r['effect_spread']:.4f}",
      ]
      for r in rows
    ],
    align="llrrrrr",
  )


def main(argv=None) -> int:
  args = studies.parse_args(__doc__, "the tiny preset, 24 steps, 1 seed, 3 changes", argv)
  start = time.perf_counter()
  study = quality.QUICK if args.quick else quality.FULL
  changes = [c for c in CHANGES if c.name in QUICK_CHANGES] if args.quick else CHANGES
  rows = measure(study, args.out, changes)
  notes = [
    f"The {study.preset} preset, {study.steps} steps, r = {study.rank}, K = {study.sync_every} "
    f"unless the row changes it, seeds {list(study.seeds)}; each method at the quality "
    "study's best learning rate; the default is the quality study's run of the same seed.",
    "change - default < 0: the paper's variant is better.",
  ]
  studies.write(
    "fidelity",
    args,
    {"rows": rows, "wall_time_s": time.perf_counter() - start},
    "The paper's variants, one at a time, on the LM",
    markdown(rows),
    notes,
  )
  return 0


if __name__ == "__main__":
  lm_runs.simulate_devices()
  raise SystemExit(main())
