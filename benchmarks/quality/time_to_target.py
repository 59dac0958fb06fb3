r"""Simulated wall-clock time to a target validation loss, at 1, 10 and 100 Gbit/s.

    python benchmarks/quality/time_to_target.py          # from benchmarks/results (the full study)
    python benchmarks/quality/time_to_target.py --quick  # from runs/benchmarks_quick

Nothing is trained: the inputs are the quality study's runs at each method's best
learning rate (``quality.json`` and the cached run files it names), all seeds.

The model, per method, at eval step t (every K steps):

    time(t) = compute(t) + comm(t)
    compute(t) = scale * sum_{s=1..t} c[s mod P]
    comm(t) = 2 (M - 1) / M * 8 * bytes(t) / bandwidth + alpha * all_reduces(t)

* ``c[i]``: the measured wall time of the steps s >= 2 with s mod P = i, over all
  seeds (``RunResult.step_time_s``; step 1 includes compilation), its lower decile.
  P = lcm(K, T), so sync steps (s mod K = 0, with their SVD) and low-rank DDP's
  refresh steps (s mod T = 1) are timed apart from the local steps. The lower decile,
  not the median: the machine is shared, other processes slowed whole runs 2-3x
  (methods computing the same step differed that much in their medians), and load
  only ever adds time. The medians are in the JSON too.
* ``scale`` = cores / M: the measured step runs all M simulated workers on this
  machine's cores, so one worker's share of it, on a core of its own, is about
  ``cores / M`` of it. The raw medians are in the JSON.
* ``bytes(t)``, ``all_reduces(t)``: what each worker all-reduced by step t, from the
  optimizer's ledger (``evals[i]["bytes"]``, ``["all_reduces"]``), i.e. the payload;
  a ring all-reduce of B bytes among M workers sends and receives
  ``2 (M - 1) / M * B`` per worker, at ``bandwidth`` bits per second each.
* ``alpha`` = 50 microseconds per all-reduce call (one counted ``pmean`` of a tree):
  the latency of one inter-node collective.
* No overlap of communication with computation (DDP can overlap its gradient
  all-reduce with the backward pass; this model does not credit it).

Two targets by default: the worst final validation loss of all methods (mean over
seeds), which every method reaches, and the higher of DDP's and LoRDO's, which both
reach; ``--target`` (repeatable) sets others. A method reaches a target at the first
eval step where its seed-mean validation loss is at or below it. For each method the
table also gives the bandwidths at which it would reach the target before DDP (see
:func:`against_ddp`).
"""

import argparse
import json
import math
import pathlib
import statistics

BANDWIDTHS_GBIT = (1, 10, 100)
ALPHA_S = 50e-6
RING = 16  # Bits per byte (8) x the ring's 2 messages of B (M - 1) / M.
ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
QUICK_RESULTS = ROOT / "runs" / "benchmarks_quick"
JSON_NAME = "time_to_target.json"
MD_NAME = "time_to_target.md"
PLOT = "time_to_target.png"


def step_costs(records: list[dict], period: int) -> dict[str, list[float]]:
  """Per position s mod ``period``: the lower decile and the median of the step times.

  Steps s >= 2 of every seed; step 1 includes compilation.
  """
  by_position = [[] for _ in range(period)]
  for record in records:
    for step, seconds in enumerate(record["result"]["step_time_s"], start=1):
      if step > 1:
        by_position[step % period].append(seconds)
  return {
    "lower_decile_s": [statistics.quantiles(times, n=10)[0] for times in by_position],
    "median_s": [statistics.median(times) for times in by_position],
  }


def comm_seconds(nbytes: int, all_reduces: int, workers: int, gbit: float) -> float:
  """Ring all-reduce time of ``nbytes`` payload in ``all_reduces`` calls."""
  return RING * (workers - 1) / workers * nbytes / (gbit * 1e9) + ALPHA_S * all_reduces


def method_times(row: dict, records: list[dict], study: dict, scale: float) -> dict:
  """Eval steps, mean validation loss, compute and ledger at each, for one method."""
  period = math.lcm(study["sync_every"], study["refresh_every"])
  costs = step_costs(records, period)
  c = costs["lower_decile_s"]
  evals = records[0]["result"]["evals"]
  steps = [e["step"] for e in evals]
  return {
    "variant": row["variant"],
    "period": period,
    "step_cost_s": c,
    "step_median_s": costs["median_s"],
    "typical_step_s": statistics.median(c),
    "slowest_step_s": max(c),
    "steps": steps,
    "val_loss_mean": [
      statistics.fmean(r["result"]["evals"][i]["val_loss"] for r in records)
      for i in range(len(steps))
    ],
    "bytes": [e["bytes"] for e in evals],
    "all_reduces": [e["all_reduces"] for e in evals],
    "compute_s": [scale * sum(c[s % period] for s in range(1, t + 1)) for t in steps],
  }


def reach(method: dict, target: float, workers: int) -> dict:
  """Where ``method`` first reaches ``target``: eval index, step, simulated seconds."""
  hits = [i for i, loss in enumerate(method["val_loss_mean"]) if loss <= target]
  if not hits:
    return {"variant": method["variant"], "index": None, "step": None, "time_s": None}
  i = hits[0]
  return {
    "variant": method["variant"],
    "index": i,
    "step": method["steps"][i],
    "time_s": {
      str(g): method["compute_s"][i]
      + comm_seconds(method["bytes"][i], method["all_reduces"][i], workers, g)
      for g in BANDWIDTHS_GBIT
    },
  }


def against_ddp(method: dict, ddp: dict, i: int, j: int, workers: int) -> dict:
  """The bandwidths at which ``method`` (at eval i) reaches the target before DDP (at j).

  With ``C`` the compute plus latency and ``B`` the bytes at the step reached, a
  method is faster than DDP at bandwidth ``bw`` when ``C_m - C_d < R (B_d - B_m) / bw``
  (``R = 16 (M - 1) / M``): below a break-even bandwidth if it sends less and
  computes more, at every bandwidth if it does both less, never if both more.
  """
  fixed = lambda m, k: m["compute_s"][k] + ALPHA_S * m["all_reduces"][k]  # noqa: E731
  d_compute = fixed(method, i) - fixed(ddp, j)
  d_bytes = ddp["bytes"][j] - method["bytes"][i]
  ring = RING * (workers - 1) / workers
  if d_compute <= 0 and d_bytes >= 0:
    return {"when": "always", "gbit": None}
  if d_compute >= 0 and d_bytes <= 0:
    return {"when": "never", "gbit": None}
  return {"when": "below" if d_bytes > 0 else "above", "gbit": ring * d_bytes / d_compute / 1e9}


def default_targets(methods: list[dict]) -> list[float]:
  """The worst final loss (every method reaches it), then the higher of DDP's and LoRDO's."""
  final = {m["variant"]: m["val_loss_mean"][-1] for m in methods}
  return sorted({max(final.values()), max(final["ddp"], final["lordo"])}, reverse=True)


def analyse(quality: dict, cache: pathlib.Path, targets: list[float] | None) -> dict:
  """The time-to-target tables of every method of ``quality``."""
  workers = 8
  cores = int(quality["measured"]["cores"][0])
  scale = cores / workers
  methods = []
  for row in quality["methods"]:
    records = [json.loads((cache / name).read_text()) for name in row["run_files"]]
    methods.append(method_times(row, records, quality["study"], scale))
  ddp = next(m for m in methods if m["variant"] == "ddp")
  tables = []
  for target in targets or default_targets(methods):
    reached, baseline = [reach(m, target, workers) for m in methods], reach(ddp, target, workers)
    for m, r in zip(methods, reached, strict=True):
      if m is not ddp and r["index"] is not None and baseline["index"] is not None:
        r["vs_ddp"] = against_ddp(m, ddp, r["index"], baseline["index"], workers)
    tables.append({"val_loss": target, "methods": reached})
  return {
    "targets": tables,
    "workers": workers,
    "cores": cores,
    "compute_scale": scale,
    "alpha_s": ALPHA_S,
    "bandwidths_gbit": list(BANDWIDTHS_GBIT),
    "model": "time(t) = scale * sum c[s mod P] + 2(M-1)/M * 8 bytes(t) / bandwidth "
    "+ alpha * all_reduces(t)",
    "quality_command": quality["command"],
    "measured": quality["measured"],
    "methods": methods,
  }


def fmt_time(seconds: float | None) -> str:
  return "not reached" if seconds is None else f"{seconds:.3g}"


def fmt_against(against: dict | None) -> str:
  """``"below 0.41 Gbit/s"``, ``"always"``, ``"never"``."""
  if against is None:
    return "-"
  if against["gbit"] is None:
    return against["when"]
  return f"{against['when']} {against['gbit']:.3g} Gbit/s"


def target_table(result: dict, table: dict) -> list[str]:
  """One target: per method, step reached and simulated seconds at each bandwidth."""
  gbits = result["bandwidths_gbit"]
  ddp = next(r for r in table["methods"] if r["variant"] == "ddp")
  lines = [
    f"Target validation loss {table['val_loss']:.4f} nats:",
    "",
    "| method | step reached | "
    + " | ".join(f"{g} Gbit/s: s (DDP / this)" for g in gbits)
    + " | reaches it before DDP |",
    "|---|---:|" + "---:|" * len(gbits) + "---|",
  ]
  for r in table["methods"]:
    cells = []
    for g in gbits:
      seconds = r["time_s"] and r["time_s"][str(g)]
      reference = ddp["time_s"] and ddp["time_s"][str(g)]
      ratio = f" ({reference / seconds:.2f}x)" if seconds and reference else ""
      cells.append(fmt_time(seconds) + ratio)
    lines.append(
      f"| {r['variant']} | {r['step'] or '-'} | "
      + " | ".join(cells)
      + f" | {fmt_against(r.get('vs_ddp'))} |"
    )
  return [*lines, ""]


def markdown(result: dict, command: str) -> str:
  """The step costs, then a table per target."""
  lines = [
    "## Time to target under a bandwidth model",
    "",
    f"Ring all-reduce among M = {result['workers']} workers: 2(M-1)/M x bytes / bandwidth "
    f"+ alpha = {result['alpha_s'] * 1e6:.0f} us per all-reduce call. Compute per step: the "
    f"measured step time at each position of the period (sync and refresh steps apart), "
    f"x {result['compute_scale']:g} (cores / M: one worker's share). No overlap of compute "
    f"and communication. Command: `{command}` (from the runs of "
    f"`{result['quality_command']}`).",
    "",
    "Step cost of the 8 simulated workers on this machine (ms; the lower decile of each "
    "position over all seeds: other processes slowed some runs 2-3x, and load only adds "
    "time; medians are in the JSON):",
    "",
    "| method | typical step | slowest step of the period (sync or refresh) |",
    "|---|---:|---:|",
  ]
  for m in result["methods"]:
    lines.append(
      f"| {m['variant']} | {1e3 * m['typical_step_s']:.1f} | {1e3 * m['slowest_step_s']:.1f} |"
    )
  lines.append("")
  for table in result["targets"]:
    lines += target_table(result, table)
  lines += [f"![validation loss against simulated time]({PLOT})", ""]
  return "\n".join(lines)


def plot(result: dict, path: pathlib.Path) -> None:
  """Validation loss against simulated time, one panel per bandwidth."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  gbits = result["bandwidths_gbit"]
  fig, axes = plt.subplots(1, len(gbits), figsize=(4.2 * len(gbits), 4.0), sharey=True)
  for ax, g in zip(axes, gbits, strict=True):
    for m in result["methods"]:
      times = [
        c + comm_seconds(b, n, result["workers"], g)
        for c, b, n in zip(m["compute_s"], m["bytes"], m["all_reduces"], strict=True)
      ]
      ax.plot(times[1:], m["val_loss_mean"][1:], label=m["variant"])
    for table in result["targets"]:
      ax.axhline(table["val_loss"], color="gray", linestyle="--", linewidth=0.8)
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_title(f"{g} Gbit/s per worker", fontsize=10)
    ax.set_xlabel("simulated time (s, log scale)")
    ax.grid(alpha=0.3)
  axes[0].set_ylabel("validation loss (nats), mean over seeds")
  finals = [m["val_loss_mean"][-1] for m in result["methods"]]
  axes[0].set_ylim(min(finals) - 0.05, max(finals) + 0.8)
  axes[-1].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--quick", action="store_true", help="read the quick study's results")
  parser.add_argument("--out", type=pathlib.Path, default=None, help="the quality study's out")
  parser.add_argument("--cache", type=pathlib.Path, default=None, help="default: <out>/runs/lm")
  parser.add_argument(
    "--target", type=float, action="append", help="a target validation loss (repeatable)"
  )
  args = parser.parse_args(argv)
  out = args.out or (QUICK_RESULTS if args.quick else RESULTS)
  quality = json.loads((out / "quality.json").read_text())
  result = analyse(quality, args.cache or out / "runs" / "lm", args.target)
  command = "python benchmarks/quality/time_to_target.py" + (" --quick" if args.quick else "")
  (out / JSON_NAME).write_text(json.dumps(result, indent=1))
  (out / MD_NAME).write_text(markdown(result, command))
  plot(result, out / PLOT)
  print("\n".join(["wrote", *(str(out / n) for n in (JSON_NAME, MD_NAME, PLOT))]))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
