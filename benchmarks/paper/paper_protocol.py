r"""The paper's protocol as a whole on the LM, next to ours (docs/FIDELITY.md).

    python benchmarks/paper/paper_protocol.py          # small preset, 768 steps, 3 seeds: ~1 h
    python benchmarks/paper/paper_protocol.py --quick  # tiny, 48 steps, 1 seed, two arms: ~1.5 min

Each arm is one ``examples/main.py`` command training LoRDO and low-rank DDP on the
``small`` preset for 768 steps (48 rounds of K = 16; 8 workers, batch 8, r = 32):

* ``paper``: the authors' protocol scaled to the LM (FIDELITY.md, "The paper's protocol
  scaled to our LM"): a shared low-rank DDP phase (steps 1-256, error feedback,
  rotated moments), then both arms from its checkpoint with the moments reset, betas
  (0.999, 0.999), a constant learning rate after a warmup over the first third, clipping
  at 0.5, LoRDO with omega 0.97, error feedback, numerator G + E, full-rank QHAdam 0.97
  and half the learning rate, the baseline with QH inside the projection (0.94) and
  error feedback.
* ``warm_start``: our methods as they are, warm-started from the same kind of phase
  (steps 1-256 of low-rank DDP with its defaults): the warm start alone.
* ``ours``: our methods from scratch, warmup 32 then cosine.
* ``paper_subspace_iteration``: ``paper`` with LoRDO's bases refreshed by subspace
  iteration instead of the SVD (the other arms pin the SVD).

Every arm uses the peak rate the quality study tuned for low-rank DDP (0.0125), as the
authors used one peak for both. The number compared is LoRDO's final validation loss
against the baseline's of the same arm and seed. Each arm's ``results.json`` is kept as
``<out>/runs/paper_protocol/<arm>_s<seed>.json``; an arm already there is not rerun. Quick mode
trains the ``paper`` and ``ours`` arms only.
"""

import json
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks.*

from benchmarks.harness import studies

ROOT = pathlib.Path(__file__).resolve().parents[2]
NAME = "paper_protocol"
LEARNING_RATE = 0.0125
WARM_START = [  # The shared phase, as FIDELITY.md's recipe.
  "--warm-start-steps",
  "{warm}",
  "--warm-start-moments",
  "reset",
]
PAPER = [
  *WARM_START,
  "--warmup",
  "{warm}",
  "--schedule",
  "constant",
  "--clip-norm",
  "0.5",
  *("--option", "warm_start.error_feedback=true", "--option", "warm_start.transport=rotate"),
  *("--option", "low_rank_ddp.error_feedback=true", "--option", "low_rank_ddp.transport=rotate"),
  *("--option", "low_rank_ddp.b1=0.999", "--option", "low_rank_ddp.b2=0.999"),
  *("--option", "low_rank_ddp.qh_nu=0.94", "--option", "low_rank_ddp.full_rank_nu=0.94"),
  *("--option", "lordo.omega=0.97", "--option", "lordo.error_feedback=true"),
  *("--option", "lordo.transport=rotate", "--option", "lordo.b1=0.999"),
  *("--option", "lordo.b2=0.999", "--option", "lordo.full_rank_numerator=error_fed"),
  *("--option", "lordo.full_rank_nu=0.97", "--option", "lordo.lr_scale=0.5"),
]
# LoRDO's basis refresh: every arm was first trained with the SVD (the default until
# 2026-11-26); the paper's protocol with the batched subspace iteration is its own arm.
SVD = ["--option", "lordo.projection=svd"]
ARMS = {
  "paper": [*PAPER, *SVD],
  "warm_start": [*WARM_START[:2], *SVD],
  "ours": SVD,
  "paper_subspace_iteration": [*PAPER, "--option", "lordo.projection=subspace_iteration"],
}


def command(arm: str, seed: int, quick: bool, work: pathlib.Path) -> list[str]:
  """The ``examples/main.py`` command of one arm and seed."""
  steps, warm = (48, 16) if quick else (768, 256)
  preset = "tiny" if quick else "small"
  flags = [f.format(warm=warm) for f in ARMS[arm]]
  return [
    sys.executable,
    "examples/main.py",
    *("--preset", preset, "--methods", "lordo,low_rank_ddp", "--steps", str(steps)),
    *("--sync-every", "16", "--lr", str(LEARNING_RATE), "--seed", str(seed)),
    *flags,
    *("--out", str(work / f"{arm}_s{seed}"), "--no-progress"),
  ]


def run_arm(arm: str, seed: int, quick: bool, kept: pathlib.Path, work: pathlib.Path) -> dict:
  """The arm's ``results.json``: read from ``kept`` or trained and copied there."""
  path = kept / f"{arm}_s{seed}.json"
  if not path.exists():
    line = command(arm, seed, quick, work)
    print(" ".join(line[1:]), flush=True)
    subprocess.run(line, cwd=ROOT, check=True)
    kept.mkdir(parents=True, exist_ok=True)
    shutil.copy(work / f"{arm}_s{seed}" / "results.json", path)
  return json.loads(path.read_text())


def summarize(results: dict) -> list[dict]:
  """Per arm: each method's final losses over seeds, LoRDO's gap per seed, the bytes."""
  rows = []
  for arm, by_seed in results.items():
    finals = {
      m: [next(r for r in res["results"] if r["method"] == m)["final_val_loss"] for res in by_seed]
      for m in ("lordo", "low_rank_ddp")
    }
    sent = {
      m: next(r for r in by_seed[0]["results"] if r["method"] == m)["communicated_bytes"]
      for m in finals
    }
    gaps = [(a - b) / b for a, b in zip(finals["lordo"], finals["low_rank_ddp"], strict=True)]
    rows.append(
      {
        "arm": arm,
        "command": by_seed[0]["command"],
        "lordo": finals["lordo"],
        "low_rank_ddp": finals["low_rank_ddp"],
        "gap": gaps,
        "gap_mean": statistics.fmean(gaps),
        "bytes": sent,
        "warm_start_loss": [
          None if res["warm_start"] is None else res["warm_start"]["final_val_loss"]
          for res in by_seed
        ],
      }
    )
  return rows


def _mean(xs: list[float]) -> str:
  sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
  return f"{statistics.fmean(xs):.4f} +- {sd:.4f}"


def markdown(rows: list[dict]) -> list[str]:
  return studies.table(
    ["arm", "LoRDO", "low-rank DDP", "LoRDO vs low-rank DDP, per seed", "mean", "bytes ratio"],
    [
      [
        r["arm"],
        _mean(r["lordo"]),
        _mean(r["low_rank_ddp"]),
        ", ".join(f"{100 * g:+.2f}%" for g in r["gap"]),
        f"{100 * r['gap_mean']:+.2f}%",
        f"{r['bytes']['low_rank_ddp'] / r['bytes']['lordo']:.1f}x",
      ]
      for r in rows
    ],
    align="lrrrrr",
  )


def main(argv=None) -> int:
  args = studies.parse_args(__doc__, "tiny preset, 48 steps, 1 seed, the paper and ours", argv)
  start = time.perf_counter()
  seeds = (0,) if args.quick else (0, 1, 2)
  # The arms' checkpoints and plots: beside a quick run's results, else in runs/ (ignored).
  kept = studies.runs(args.out, NAME)
  work = (args.out / "checkpoints" if args.quick else ROOT / "runs") / NAME
  arms = ("paper", "ours") if args.quick else ARMS
  results = {arm: [run_arm(arm, seed, args.quick, kept, work) for seed in seeds] for arm in arms}
  rows = summarize(results)
  notes = [
    "Each arm: `examples/main.py --methods lordo,low_rank_ddp --lr 0.0125` plus its flags "
    "(the `command` of each row in paper_protocol.json); seeds " + ", ".join(map(str, seeds)) + ".",
    "bytes ratio: low-rank DDP's bytes over LoRDO's in the arm (after the shared phase, whose "
    "bytes are not counted).",
  ]
  studies.write(
    NAME,
    args,
    {"rows": rows, "wall_time_s": time.perf_counter() - start},
    "The paper's protocol next to ours",
    markdown(rows),
    notes,
  )
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
