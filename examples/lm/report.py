"""The results of a comparison: a table on the terminal, a JSON file, two plots."""

import dataclasses
import json
import math
import pathlib
from collections.abc import Sequence
from typing import Any

from . import train as train_lib

JSON_NAME = "results.json"
LOSS_VS_STEP = "val_loss_vs_step.png"
LOSS_VS_BYTES = "val_loss_vs_bytes.png"


def human_bytes(n: float) -> str:
  """``1536`` -> ``"1.5 KiB"``."""
  for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
    if abs(n) < 1024 or unit == "TiB":
      return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
    n /= 1024
  raise AssertionError


def gbit(x: float | None) -> str:
  """``52.47`` -> ``"52 Gbit/s"``, ``0.734`` -> ``"0.73 Gbit/s"``; None -> ``"never"``."""
  return "never" if x is None else f"{x:.2g} Gbit/s" if x < 10 else f"{x:.0f} Gbit/s"


def table(
  results: Sequence[train_lib.RunResult],
  unigram_entropy: float,
  learning_rates: dict[str, float] | None = None,
  bandwidth: dict[str, Any] | None = None,
  overlaps: dict[str, Any] | None = None,
) -> str:
  """The comparison table.

  "lr" is the run's peak learning rate (``learning_rates``). "sent per worker" is the
  payload each worker all-reduced over the whole run, from the optimizer state's
  ledger. "90% busy at" is the bandwidth per worker at which the method keeps 90% of
  an accelerator's compute busy on GPT-2 small (``bandwidth``: the table of
  ``tuned.bandwidth_table``), the other side of the trade; for a run with a whole round
  in flight (``overlaps``, each method's ``overlap``) the overlapped method's row of it
  (:func:`bandwidth_key`). The optimizer state is one
  worker's, split by where its arrays are (``lordo_jax.state_bytes``): in device
  memory, and in host memory (0 unless the method offloads its anchor).
  """
  reference = next((r for r in results if r.method == "ddp"), None)
  learning_rates = learning_rates or {}
  gbit_for = (bandwidth or {}).get("gbit_for", {})
  header = (
    "method",
    "lr",
    "val loss (nats)",
    "bits/byte",
    "sent per worker",
    "vs ddp",
    "90% busy at",
    "opt. state: device",
    "host",
    "wall time",
  )
  rows = []
  for r in results:
    ratio = "-"
    if reference is not None and r.communicated_bytes:
      ratio = f"{reference.communicated_bytes / r.communicated_bytes:.1f}x less"
      if r.method == "ddp":
        ratio = "1x"
    lr = learning_rates.get(r.method)
    rows.append(
      (
        r.method,
        "-" if lr is None else f"{lr:g}",
        f"{r.final_val_loss:.3f}",
        f"{r.final_val_loss / math.log(2):.3f}",
        human_bytes(r.communicated_bytes),
        ratio,
        busy(gbit_for, bandwidth_key(r.method, (overlaps or {}).get(r.method))),
        human_bytes(r.state_bytes["device"]),
        human_bytes(r.state_bytes["host"]),
        f"{r.wall_time_s:.0f} s",
      )
    )
  widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
  line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))  # noqa: E731
  lines = [line(header), line(["-" * w for w in widths]), *map(line, rows)]
  lines.append(
    f"unigram entropy of the text: {unigram_entropy:.3f} nats "
    f"({unigram_entropy / math.log(2):.3f} bits) per byte"
  )
  if gbit_for:
    lines.append(
      f"90% busy at: the bandwidth per worker at which the method keeps 90% of the compute "
      f"busy training {bandwidth['model']}: {bandwidth['assumptions']} "
      f"({bandwidth['generated_by']}; BENCHMARKS.md)"
    )
  return "\n".join(lines)


def bandwidth_key(method: str, overlap: Any) -> str | None:
  """The row of the bandwidth table for ``method`` run with ``overlap``: its own without
  overlap, ``<method>_overlap`` with a whole round in flight (a variant so named is its
  own), none with an int overlap (the table models only ``"round"``)."""
  if overlap is None:
    return method
  if overlap != "round":
    return None
  return method if method.endswith("_overlap") else f"{method}_overlap"


def busy(gbit_for: dict, key: str | None) -> str:
  """The 90% bandwidth of row ``key``, or "-" where the table has none."""
  return gbit(gbit_for[key]["0.9"]) if key in gbit_for else "-"


def write_json(path: pathlib.Path, results, meta: dict[str, Any]) -> None:
  """``meta`` (config, data) and every run's curves and final numbers."""
  payload = dict(meta, results=[dataclasses.asdict(r) for r in results])
  path.write_text(json.dumps(payload, indent=1))


def plot(
  out_dir: pathlib.Path, results, unigram_entropy: float, title: str = ""
) -> list[pathlib.Path]:
  """Validation loss against step and against bytes sent; returns the PNG paths."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  paths = []
  for name, key, xlabel in (
    (LOSS_VS_STEP, "step", "step"),
    (LOSS_VS_BYTES, "bytes", "bytes all-reduced per worker (log scale)"),
  ):
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for r in results:
      points = [(e[key], e["val_loss"]) for e in r.evals if key == "step" or e[key] > 0]
      if points:
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, marker="o", markersize=3, label=r.method)
    ax.axhline(unigram_entropy, color="gray", linestyle="--", label="unigram entropy")
    if key == "bytes":
      ax.set_xscale("log")
    # Room for the interesting part: the first points (about ln 256 = 5.5) sit above.
    finals = [r.final_val_loss for r in results if math.isfinite(r.final_val_loss)]
    ax.set_ylim(top=max([unigram_entropy, *finals]) + 0.75)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("validation loss (nats per byte)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    paths.append(out_dir / name)
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
  return paths
