r"""Beyond the paper: compressed, streamed, two-sided and adaptive synchronisation.

    python benchmarks/quality/extensions.py          # the quality study's settings, 3 seeds
    python benchmarks/quality/extensions.py --quick  # tiny preset, 1 seed, 7 rows: about 1 min

Every row of :data:`ROWS` trains the quality study's model and data (same steps,
batch, rank, K, seeds: :mod:`quality`) at the best learning rate the quality study
found for the method it extends (``quality.json`` in ``--out``: run
``quality.py`` first; ``run_all.py`` does). Runs already in the quality study
(LoRDO, low-rank DDP) are read from its cache. Reported per row: final validation
loss (mean and spread over seeds), bytes all-reduced per worker, the largest
per-step traffic (the most bytes any one step all-reduces: the peak message a link
must carry), and both against low-rank DDP. The headline check: LoRDO with int8
messages and 4 streamed fragments within 2% of low-rank DDP's loss at 40x or more
fewer bytes.

``--quick`` trains the rows of :data:`QUICK_ROWS`: every option once, bfloat16, int8 and
streaming only together in the headline row (their messages alone are checked against
the plain run by ``tests/comm/test_compression.py`` and ``tests/round/test_streaming.py``).
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # Before NumPy loads: see quality.py.

import argparse  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks.*

from benchmarks.harness import lm_runs  # noqa: E402
from benchmarks.harness import quality_report  # noqa: E402
from benchmarks.harness import quality_summary  # noqa: E402
from benchmarks.harness import studies  # noqa: E402
from benchmarks.harness.variants import Variant  # noqa: E402
from benchmarks.quality import quality  # noqa: E402

LOSS_GAP = 0.02
BYTE_RATIO = 40.0
HEADLINE = "lordo_int8_stream4"
REFERENCE = "low_rank_ddp"
JSON_NAME = "extensions.json"
MD_NAME = "extensions.md"
PLOT = "extensions.png"

# (variant, the quality-study row whose best learning rate it takes).
ROWS = (
  (Variant(REFERENCE, "low_rank_ddp", description="full gradient every step"), REFERENCE),
  (
    Variant(
      "low_rank_ddp_projected",
      "low_rank_ddp",
      (("communicate", "projected"),),
      description="r x q coordinates every step, gradient every T",
    ),
    REFERENCE,
  ),
  (
    Variant(
      "tsr_adam_projected",
      "low_rank_ddp",
      (("communicate", "projected"), ("two_sided", True), ("projection", "randomized_svd")),
      description="TSR-Adam: r x r cores every step, randomized-SVD sketches every T",
    ),
    REFERENCE,
  ),
  (Variant("lordo", "lordo", description="float32 messages every K"), "lordo"),
  (
    Variant("lordo_bf16", "lordo", (("compression", "bfloat16"),), description="bf16 messages"),
    "lordo",
  ),
  (
    Variant("lordo_int8", "lordo", (("compression", "int8"),), description="int8 messages"),
    "lordo",
  ),
  (
    Variant("lordo_stream4", "lordo", (("fragments", 4),), description="4 staggered fragments"),
    "lordo",
  ),
  (
    Variant(
      HEADLINE,
      "lordo",
      (("compression", "int8"), ("fragments", 4)),
      description="int8 messages, 4 staggered fragments",
    ),
    "lordo",
  ),
  (
    Variant(
      "lordo_two_sided",
      "lordo",
      (("two_sided", True), ("projection", "randomized_svd")),
      description="two-sided: r x r moments, randomized-SVD refresh",
    ),
    "lordo",
  ),
  (
    Variant(
      "lordo_qsr",
      "lordo",
      (("quadratic_sync_alpha", 0.03),),
      description="QSR: K_t = max(K, (0.03 / lr_t)^2) after warmup",
    ),
    "lordo",
  ),
)


QUICK_ROWS = (
  REFERENCE, "low_rank_ddp_projected", "tsr_adam_projected", "lordo", HEADLINE,
  "lordo_two_sided", "lordo_qsr",
)  # fmt: skip


def peak_step_bytes(record: dict) -> int:
  """The most bytes one step all-reduced (``bytes_sent`` is cumulative)."""
  sent = [0, *record["result"]["bytes_sent"]]
  return max(b - a for a, b in zip(sent, sent[1:], strict=False))


def row(variant: Variant, records: list[dict], learning_rate: float) -> dict:
  """The quality study's row of ``variant``, plus its largest step and mean curve."""
  evals = [r["result"]["evals"] for r in records]
  return quality_summary.method_row(variant, records, learning_rate) | {
    "peak_step_bytes": peak_step_bytes(records[0]),
    "curve": {
      "bytes": [e["bytes"] for e in evals[0]],
      "val_loss": [statistics.fmean(e[i]["val_loss"] for e in evals) for i in range(len(evals[0]))],
    },
  }


def headline(rows: dict) -> dict:
  ours, reference = rows[HEADLINE], rows[REFERENCE]
  gap = (ours["mean"] - reference["mean"]) / reference["mean"]
  ratio = reference["bytes"] / ours["bytes"]
  return {
    "goal": f"{HEADLINE} within 2% of {REFERENCE}'s loss at 40x or more fewer bytes",
    "holds": gap <= LOSS_GAP and ratio >= BYTE_RATIO,
    "loss_gap": gap,
    "bytes_ratio": ratio,
    "peak_ratio": reference["peak_step_bytes"] / ours["peak_step_bytes"],
    "gap_to_lordo": (ours["mean"] - rows["lordo"]["mean"]) / rows["lordo"]["mean"],
  }


def markdown(summary: dict) -> str:
  rows = {r["variant"]: r for r in summary["rows"]}
  ref = rows[REFERENCE]
  lines = [
    "## Beyond the paper: compressed, streamed, two-sided, adaptive",
    "",
    f"Settings as the quality study (`{summary['study']['preset']}` preset, "
    f"{summary['study']['steps']} steps, r={summary['study']['rank']}, "
    f"K={summary['study']['sync_every']}, seeds {summary['study']['seeds']}); each row at "
    f"the best learning rate of the method it extends. Command: `{summary['command']}`. "
    f"Measured {summary['provenance']['date'][:10]}, {summary['provenance']['cpu']}, "
    f"jax {summary['provenance']['jax']}.",
    "",
    "| method | what is sent | LR | final val loss (mean +- sd) | vs low-rank DDP "
    "| MiB per worker | low-rank DDP / this | largest step (KiB) | low-rank DDP / this |",
    "|---|---|---:|---:|---:|---:|---:|---:|---:|",
  ]
  for r in summary["rows"]:
    lines.append(
      f"| {r['variant']} | {r['description']} | {r['learning_rate']:g} | "
      f"{r['mean']:.4f} +- {r['spread']:.4f} | "
      f"{100 * (r['mean'] - ref['mean']) / ref['mean']:+.2f}% | {r['bytes'] / 2**20:,.2f} | "
      f"{ref['bytes'] / r['bytes']:.1f} | {r['peak_step_bytes'] / 2**10:,.1f} | "
      f"{ref['peak_step_bytes'] / r['peak_step_bytes']:.1f} |"
    )
  h = summary["headline"]
  lines += [
    "",
    f"Headline goal ({h['goal']}): **{'holds' if h['holds'] else 'does not hold'}** here: "
    f"loss gap {100 * h['loss_gap']:+.2f}%, {h['bytes_ratio']:.1f}x fewer bytes, "
    f"{h['peak_ratio']:.1f}x smaller largest step; against plain LoRDO its loss differs "
    f"by {100 * h['gap_to_lordo']:+.2f}%.",
    "",
    f"![validation loss against bytes and against the largest step]({PLOT})",
  ]
  return "\n".join(lines) + "\n"


def plot(summary: dict, path: pathlib.Path) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
  for r in summary["rows"]:
    curve = r["curve"]
    mib = [b / 2**20 for b in curve["bytes"]]
    left.plot(mib, curve["val_loss"], marker=".", label=r["variant"])
    right.errorbar(r["peak_step_bytes"] / 2**10, r["mean"], yerr=r["spread"], fmt="o")
    right.annotate(r["variant"], (r["peak_step_bytes"] / 2**10, r["mean"]), fontsize=7)
  left.set(xscale="log", xlabel="MiB all-reduced per worker", ylabel="validation loss (nats)")
  right.set(xscale="log", xlabel="largest per-step traffic (KiB)", ylabel="final validation loss")
  left.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--quick", action="store_true", help="tiny preset, 1 seed, QUICK_ROWS")
  parser.add_argument("--out", type=pathlib.Path, default=None, help="where results go")
  args = parser.parse_args(argv)
  study = quality.QUICK if args.quick else quality.FULL
  out = args.out or (quality.QUICK_RESULTS if args.quick else quality.RESULTS)
  best_lr = json.loads((out / quality_report.JSON_NAME).read_text())["best_lr"]
  lm_runs.simulate_devices()
  rows = []
  chosen = [(v, tuned_as) for v, tuned_as in ROWS if not args.quick or v.name in QUICK_ROWS]
  for variant, tuned_as in chosen:
    lr = best_lr[tuned_as]
    records = [
      lm_runs.run(study.spec(variant, lr, seed), studies.runs(out, "lm")) for seed in study.seeds
    ]
    rows.append(row(variant, records, lr))
  summary = {
    "study": {
      "preset": study.preset,
      "steps": study.steps,
      "rank": study.rank,
      "sync_every": study.sync_every,
      "seeds": list(study.seeds),
    },
    "command": "python benchmarks/quality/extensions.py" + (" --quick" if args.quick else ""),
    "provenance": lm_runs.provenance(),
    "rows": rows,
  }
  summary["headline"] = headline({r["variant"]: r for r in rows})
  (out / JSON_NAME).write_text(json.dumps(summary, indent=1))
  (out / MD_NAME).write_text(markdown(summary))
  plot(summary, out / PLOT)
  print(markdown(summary))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
