"""The quality study written out: ``quality.json``, ``quality.md`` and three plots."""

import json
import math
import pathlib

JSON_NAME = "quality.json"
MD_NAME = "quality.md"
LOSS_VS_BYTES = "quality_loss_vs_bytes.png"
SIMILARITY = "quality_similarity.png"
RANK_BATCH = "quality_rank_batch.png"


def mib(n: float) -> str:
  """Bytes as MiB with two decimals."""
  return f"{n / 2**20:,.2f}"


def settings_line(summary: dict) -> str:
  """What was trained, where and when, in one paragraph."""
  s, m, measured = summary["study"], summary["model"], summary["measured"]
  rates = ", ".join(f"{x:g}" for x in s["learning_rates"])
  return (
    f"Model: `{m['preset']}` byte-level transformer ({m['parameters']:,} parameters, "
    f"d={m['d_model']}, {m['num_layers']} layers, context {m['seq_len']}), 8 simulated "
    f"workers, {s['steps']} steps x {s['batch_size']} windows per worker "
    f"({summary['tokens_per_run']:,} tokens per run), rank r={s['rank']}, K={s['sync_every']}, "
    f"low-rank DDP refresh T={s['refresh_every']}, warmup {s['warmup_steps']} then cosine "
    f"decay. Learning rates tried for every method: {rates} "
    f"(seed {s['seeds'][0]}); best of each with seeds {', '.join(map(str, s['seeds']))}. "
    f"Command: `{summary['command']}`. Measured on {', '.join(measured['cpu'])} "
    f"({', '.join(measured['cores'])} cores), jax {', '.join(measured['jax'])}, "
    f"{measured['first'][:10]} to {measured['last'][:10]} (commit "
    f"{', '.join(measured['git_commit'])}); {summary['runs']} runs, "
    f"{summary['training_time_s'] / 60:.0f} min of training."
  )


def methods_table(summary: dict) -> list[str]:
  """The main table: loss, spread, bytes and ratios, per method."""
  rows = {r["variant"]: r for r in summary["methods"]}
  ddp, low_rank = rows["ddp"]["bytes"], rows["low_rank_ddp"]["bytes"]
  reference = rows["low_rank_ddp"]["mean"]
  lines = [
    "| method | what is all-reduced | best LR | final val loss (mean +- sd, nats) "
    "| vs low-rank DDP | MiB sent per worker | DDP / this | low-rank DDP (full) / this |",
    "|---|---|---:|---:|---:|---:|---:|---:|",
  ]
  for r in summary["methods"]:
    lines.append(
      f"| {r['variant']} | {r['description']} | {r['learning_rate']:g} | "
      f"{r['mean']:.4f} +- {r['spread']:.4f} (n={len(r['seeds'])}) | "
      f"{100 * (r['mean'] - reference) / reference:+.2f}% | {mib(r['bytes'])} | "
      f"{ddp / r['bytes']:.1f} | {low_rank / r['bytes']:.1f} |"
    )
  return lines


def sweep_table(summary: dict) -> list[str]:
  """Final validation loss of every method at every learning rate of the sweep."""
  rates = [f"{x:g}" for x in summary["study"]["learning_rates"]]
  lines = ["| method | " + " | ".join(f"lr {x}" for x in rates) + " |"]
  lines.append("|---|" + "---:|" * len(rates))
  for name, losses in summary["sweep"].items():
    best = f"{summary['best_lr'][name]:g}"
    cells = [f"**{losses[x]:.4f}**" if x == best else f"{losses[x]:.4f}" for x in rates]
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  return lines


def rank_batch_table(summary: dict) -> list[str]:
  """LoRDO against its local-projection ablation at every rank and batch."""
  lines = [
    "| rank | batch per worker | lordo (LR) | lordo_local_projection (LR) "
    "| advantage (local - lordo) | relative |",
    "|---:|---:|---:|---:|---:|---:|",
  ]
  mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
  for r in summary["rank_batch"]:
    cells = [
      f"{mean(r[name]):.4f} ({r['learning_rate'][name]:g})"
      for name in ("lordo", "lordo_local_projection")
    ]
    lines.append(
      f"| {r['rank']} | {r['batch_size']} | {cells[0]} | {cells[1]} | "
      f"{r['advantage_mean']:+.4f} +- "
      f"{r['advantage_spread']:.4f} | {100 * r['relative_advantage_mean']:+.2f}% |"
    )
  return lines


def claims_list(summary: dict) -> list[str]:
  """One line per claim: holds or not, and the numbers."""
  return [
    f"- ({key}) {c['claim']}: **{'holds' if c['holds'] else 'does not hold'}** here. {c['detail']}."
    for key, c in summary["claims"].items()
  ]


def markdown(summary: dict) -> str:
  """``quality.md``: settings, the three tables, the claims, the plots."""
  parts = [
    "## Quality against communication",
    "",
    settings_line(summary),
    "",
    *methods_table(summary),
    "",
    "Learning-rate sweep (final validation loss, one seed; the best of each in bold):",
    "",
    *sweep_table(summary),
    "",
    "Rank x per-worker batch: each method ran every cell at both methods' best learning "
    "rates above and keeps its better one there (mean over seeds); the advantage is paired "
    "by seed:",
    "",
    *rank_batch_table(summary),
    "",
    "Claims of the paper, checked here:",
    "",
    *claims_list(summary),
    "",
    f"![validation loss against bytes sent]({LOSS_VS_BYTES})",
    f"![similarity of successive projections]({SIMILARITY})",
    f"![LoRDO's advantage against rank and batch]({RANK_BATCH})",
    "",
  ]
  return "\n".join(parts)


def plot_loss_vs_bytes(summary: dict, ax) -> None:
  """Mean validation curve of each method against the bytes it had sent."""
  for name, curve in summary["curves"].items():
    points = [(b, v) for b, v in zip(curve["bytes"], curve["val_loss"], strict=True) if b > 0]
    xs, ys = zip(*points, strict=True)
    line = ax.plot(xs, ys, marker=".", markersize=3, label=name)[0]
    row = next(r for r in summary["methods"] if r["variant"] == name)
    ax.errorbar(xs[-1], row["mean"], yerr=row["spread"], color=line.get_color(), capsize=3)
  finals = [r["mean"] for r in summary["methods"] if math.isfinite(r["mean"])]
  ax.set_ylim(min(finals) - 0.05, max(finals) + 0.6)
  ax.set_xscale("log")
  ax.set_xlabel("bytes all-reduced per worker (log scale)")
  ax.set_ylabel("validation loss (nats per byte), mean over seeds")
  ax.legend(fontsize=7)


def plot_similarity(summary: dict, ax) -> None:
  """Principal-angle similarity of successive bases, per tracked method."""
  for name, curve in summary["similarity"].items():
    ax.plot(curve["steps"], curve["projection_similarity"], marker=".", label=name)
  ax.set_xlabel("step")
  ax.set_ylabel("mean cos(principal angles), successive bases")
  ax.legend(fontsize=7)


def plot_rank_batch(summary: dict, ax) -> None:
  """LoRDO's advantage over local projection against rank, one line per batch."""
  for batch in sorted({r["batch_size"] for r in summary["rank_batch"]}):
    rows = sorted(
      (r for r in summary["rank_batch"] if r["batch_size"] == batch), key=lambda r: r["rank"]
    )
    ax.errorbar(
      [r["rank"] for r in rows],
      [r["advantage_mean"] for r in rows],
      yerr=[r["advantage_spread"] for r in rows],
      marker="o",
      capsize=3,
      label=f"batch {batch} per worker",
    )
  ax.axhline(0, color="gray", linewidth=0.8)
  ax.set_xscale("log", base=2)
  ax.set_xlabel("rank r")
  ax.set_ylabel("val loss: local projection - LoRDO (nats)")
  ax.legend(fontsize=7)


def plots(summary: dict, out: pathlib.Path) -> list[pathlib.Path]:
  """The three PNGs."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  paths = []
  for name, draw in (
    (LOSS_VS_BYTES, plot_loss_vs_bytes),
    (SIMILARITY, plot_similarity),
    (RANK_BATCH, plot_rank_batch),
  ):
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    draw(summary, ax)
    ax.set_title(f"{summary['model']['preset']} byte LM, 8 workers", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    paths.append(out / name)
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
  return paths


def write(summary: dict, out: pathlib.Path) -> list[pathlib.Path]:
  """Writes the JSON, the markdown and the plots into ``out``; returns their paths."""
  out.mkdir(parents=True, exist_ok=True)
  (out / JSON_NAME).write_text(json.dumps(summary, indent=1))
  (out / MD_NAME).write_text(markdown(summary))
  return [out / JSON_NAME, out / MD_NAME, *plots(summary, out)]
