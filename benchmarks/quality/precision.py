r"""bfloat16 parameters against float32 on the example LM: where each run ends.

    python benchmarks/quality/precision.py            # 128 steps of 32 windows, seeds 0-3
    python benchmarks/quality/precision.py --seeds 0  # the same, seed 0 only
    python benchmarks/quality/precision.py --quick    # 48 steps of 4 windows, seed 0

LoRDO trains the tiny preset with 8 workers (K = 8, rank 8, 128 steps of 32 windows per
worker, peak learning rate 2e-2 after 8 warmup steps, then cosine) from the same seed
twice: with float32 parameters and with bfloat16 ones (``TrainConfig.param_dtype``, the
job's ``--param-dtype``). The optimizer keeps its moments and bases in float32 either
way. Each run's final validation loss over 512 windows; the gap is bfloat16 minus
float32, relative to float32 (the claim: within 2%). The dtypes
the bfloat16 run's last checkpoint holds are recorded with the losses, and the text's
unigram entropy (the loss of a model that learned only byte frequencies). Each seed's
pair is cached, one JSON file (``<out>/runs/precision``), so a study that is stopped
or run seed by seed trains only what it has not finished.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # Before NumPy loads: see quality.py.

import dataclasses  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks.*

from benchmarks.harness import lm_runs  # noqa: E402

lm_runs.simulate_devices()  # 8 workers of one device each.

from lm import model  # noqa: E402
from lm import train  # noqa: E402

from benchmarks.harness import studies  # noqa: E402
from lordo_jax import checkpoint  # noqa: E402

NAME = "precision"
DTYPES = ("float32", "bfloat16")
PRESET = "tiny"
FULL = train.TrainConfig(
  steps=128,
  num_workers=8,
  batch_size=32,
  learning_rate=2e-2,
  warmup_steps=8,
  rank=8,
  sync_every=8,
  refresh_every=8,
  eval_every=128,
  eval_windows=512,
)
QUICK = dataclasses.replace(FULL, steps=48, batch_size=4, eval_every=48, eval_windows=64)
SEEDS, QUICK_SEEDS = (0, 1, 2, 3), (0,)
# Where each kind of state leaf sits in the checkpoint: its path ends so (or holds it).
PARTS = {"basis": ".basis", "mu": ".mu", "nu": ".nu"}


def dtypes(layout: dict) -> dict[str, list[str]]:
  """The dtypes of a checkpoint's parameters, its low-rank bases and moments (``.basis``,
  ``.mu``, ``.nu``) and its anchor, as ``Checkpointer.layout`` lists them."""
  state = layout["opt_state"]["leaves"]
  found = {"params": {leaf["dtype"] for leaf in layout["params"]["leaves"]}}
  for part, ending in PARTS.items():
    found[part] = {leaf["dtype"] for leaf in state if leaf["path"].endswith(ending)}
  found["anchor"] = {leaf["dtype"] for leaf in state if ".anchor" in leaf["path"]}
  return {part: sorted(kinds) for part, kinds in found.items()}


def pair(config: train.TrainConfig, seed: int, cache: pathlib.Path) -> dict:
  """The float32 and the bfloat16 run of ``config`` from ``seed``: each one's validation
  losses and the dtypes of its last checkpoint; the gap of the final losses. Read from
  ``cache`` if there, else trained and stored."""
  settings = json.dumps(dataclasses.asdict(config), sort_keys=True)
  path = cache / f"seed{seed}_{hashlib.sha1(settings.encode()).hexdigest()[:10]}.json"
  if path.exists():
    return json.loads(path.read_text())
  preset = model.PRESETS[PRESET]
  corpus = lm_runs.dataset(config.num_workers, preset.seq_len, config.batch_size)
  runs = {}
  for dtype in DTYPES:
    with tempfile.TemporaryDirectory() as directory:
      run = dataclasses.replace(config, seed=seed, param_dtype=dtype, checkpoint_dir=directory)
      result = train.train("lordo", run, preset, corpus, progress=False)
      with checkpoint.Checkpointer(directory) as ckpt:
        layout = ckpt.layout(config.steps)
    runs[dtype] = {
      "final_val_loss": result.final_val_loss,
      "first_val_loss": result.evals[0]["val_loss"],
      "wall_time_s": result.wall_time_s,
      "checkpoint_dtypes": dtypes(layout),
    }
    print(f"seed {seed} {dtype}: val {result.final_val_loss:.4f}", flush=True)
  f32, bf16 = (runs[d]["final_val_loss"] for d in DTYPES)
  record = {"seed": seed, "runs": runs, "gap": (bf16 - f32) / f32}
  cache.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(record))
  return record


def report(pairs: list[dict]) -> list[str]:
  rows = [
    [
      p["seed"],
      f"{p['runs']['float32']['final_val_loss']:.4f}",
      f"{p['runs']['bfloat16']['final_val_loss']:.4f}",
      f"{100 * p['gap']:+.2f}%",
    ]
    for p in pairs
  ]
  gaps = [p["gap"] for p in pairs]
  lines = studies.table(["seed", "float32", "bfloat16", "bfloat16 vs float32"], rows)
  lines += [
    "",
    f"- Gap between {100 * min(gaps):+.2f}% and {100 * max(gaps):+.2f}% "
    f"(mean {100 * statistics.mean(gaps):+.2f}%); the claim: within 2%.",
  ]
  return lines


def main(argv=None) -> int:
  def extra(parser):
    parser.add_argument("--seeds", help="comma-separated seeds (default 0,1,2,3; quick: 0)")

  args = studies.parse_args(__doc__, "48 steps of 4 windows, seed 0", argv, extra)
  config, seeds = (QUICK, QUICK_SEEDS) if args.quick else (FULL, SEEDS)
  if args.seeds:
    seeds = tuple(int(s) for s in args.seeds.split(","))
    args.flags = [f"--seeds {args.seeds}"]
  pairs = [pair(config, seed, studies.runs(args.out, NAME)) for seed in seeds]
  preset = model.PRESETS[PRESET]
  corpus = lm_runs.dataset(config.num_workers, preset.seq_len, config.batch_size)
  notes = [
    f"LoRDO, {PRESET} preset, {config.num_workers} workers, {config.steps} steps of "
    f"{config.batch_size} windows per worker, K = {config.sync_every}, rank {config.rank}, "
    f"peak rate {config.learning_rate:g}; final validation loss over {config.eval_windows} "
    "windows, in nats per byte.",
    f"The text's unigram entropy: {corpus.unigram_entropy:.4f} nats per byte.",
    "The bfloat16 run's checkpoint: parameters "
    + ", ".join(pairs[0]["runs"]["bfloat16"]["checkpoint_dtypes"]["params"])
    + "; bases, moments: "
    + ", ".join(pairs[0]["runs"]["bfloat16"]["checkpoint_dtypes"]["mu"])
    + ".",
  ]
  record = {
    "config": {**dataclasses.asdict(config), "preset": PRESET},
    "seeds": list(seeds),
    "unigram_entropy": corpus.unigram_entropy,
    "pairs": pairs,
  }
  studies.write(
    NAME, args, record, "bfloat16 parameters against float32 (the example LM)", report(pairs), notes
  )
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
