"""The quality study's runs as numbers: per-method table, curves, rank x batch sweep.

Everything here reads the cached run records (see :mod:`lm_runs`) and returns plain
JSON-ready values; :mod:`quality_claims` checks the paper's claims on them and
:mod:`quality_report` writes them out. Spread over seeds is the sample standard
deviation (0 with one seed).
"""

import dataclasses
import statistics

from benchmarks.harness import lm_runs
from benchmarks.harness import quality_claims
from benchmarks.harness import variants

# Rows whose low-rank bases are tracked in the similarity plot.
TRACKED = ("lordo", "lordo_global_projection_only", "lordo_local_projection", "low_rank_ddp")


def spread(values: list[float]) -> float:
  """Sample standard deviation; 0 for fewer than two values."""
  return statistics.stdev(values) if len(values) > 1 else 0.0


def mean_curve(records: list[dict], key: str) -> dict:
  """``{"steps": [...], key: [mean over seeds]}`` of one eval metric (None kept out)."""
  steps = [e["step"] for e in records[0]["result"]["evals"]]
  rows = []
  for i, step in enumerate(steps):
    values = [r["result"]["evals"][i][key] for r in records]
    if all(v is not None for v in values):
      rows.append((step, statistics.fmean(values)))
  return {"steps": [s for s, _ in rows], key: [v for _, v in rows]}


def method_row(variant: variants.Variant, records: list[dict], learning_rate: float) -> dict:
  """One row of the main table: losses per seed, mean, spread, bytes."""
  losses = [r["result"]["final_val_loss"] for r in records]
  sent = [r["result"]["communicated_bytes"] for r in records]
  return {
    "variant": variant.name,
    "method": variant.method,
    "options": [list(o) for o in variant.options],
    "description": variant.description,
    "learning_rate": learning_rate,
    "seeds": [r["spec"]["seed"] for r in records],
    "final_val_loss": losses,
    "mean": statistics.fmean(losses),
    "spread": spread(losses),
    "bytes": sent[0],
    "bytes_same_every_seed": len(set(sent)) == 1,
    "all_reduces": records[0]["result"]["evals"][-1]["all_reduces"],
    "state_bytes": records[0]["result"]["state_bytes"],
    "run_files": [lm_runs.file_name(r["spec"]) for r in records],
    "wall_time_s": [r["result"]["wall_time_s"] for r in records],
  }


def finals(records: list[dict]) -> list[float]:
  """Final validation loss of each run."""
  return [r["result"]["final_val_loss"] for r in records]


def best_rate(by_lr: dict) -> float:
  """The learning rate whose runs have the lowest mean final loss."""
  return min(by_lr, key=lambda lr: statistics.fmean(finals(by_lr[lr])))


def rank_batch_rows(rank_batch: dict) -> list[dict]:
  """Per rank and batch: both variants at their better rate, and LoRDO's advantage.

  The advantage is paired by seed (same initialisation and data order).
  """
  lordo, local = variants.RANK_BATCH
  rows = []
  for rank, batch in rank_batch[lordo]:
    cell = {name: rank_batch[name][rank, batch] for name in (lordo, local)}
    rates = {name: best_rate(by_lr) for name, by_lr in cell.items()}
    ours, theirs = finals(cell[lordo][rates[lordo]]), finals(cell[local][rates[local]])
    advantage = [b - a for a, b in zip(ours, theirs, strict=True)]
    rows.append(
      {
        "rank": rank,
        "batch_size": batch,
        "learning_rate": rates,
        "mean_by_learning_rate": {
          name: {f"{lr:g}": statistics.fmean(finals(rs)) for lr, rs in by_lr.items()}
          for name, by_lr in cell.items()
        },
        lordo: ours,
        local: theirs,
        "advantage": advantage,
        "advantage_mean": statistics.fmean(advantage),
        "advantage_spread": spread(advantage),
        "relative_advantage_mean": statistics.fmean(
          (b - a) / b for a, b in zip(ours, theirs, strict=True)
        ),
      }
    )
  return rows


def measured_at(records: list[dict]) -> dict:
  """The distinct machines, jax versions, commits and the date range of the runs."""
  provenance = [r["provenance"] for r in records]
  dates = sorted(p["date"] for p in provenance)
  distinct = lambda key: sorted({str(p[key]) for p in provenance})  # noqa: E731
  return {
    "first": dates[0],
    "last": dates[-1],
    "cpu": distinct("cpu"),
    "cores": distinct("cores"),
    "jax": distinct("jax"),
    "git_commit": distinct("git_commit"),
  }


def summarize(study, runs: dict) -> dict:
  """All tables, curves and claim checks of the study, JSON-ready."""
  model_config = lm_runs.model.PRESETS[study.preset]
  shapes = lm_runs.model.param_shapes(model_config)
  rows = [method_row(v, runs["seeds"][v.name], runs["best_lr"][v.name]) for v in variants.QUALITY]
  every = [r for per_lr in runs["sweep"].values() for r in per_lr.values()]
  every += [r for records in runs["seeds"].values() for r in records]
  every += [
    r
    for grid in runs["rank_batch"].values()
    for by_lr in grid.values()
    for rs in by_lr.values()
    for r in rs
  ]
  unique = {lm_runs.file_name(r["spec"]): r for r in every}
  summary = {
    "study": dataclasses.asdict(study),
    "model": {
      "preset": study.preset,
      **dataclasses.asdict(model_config),
      "parameters": lm_runs.model.num_params(shapes),
      "low_rank_shapes": [list(s) for _, s in lm_runs.model.low_rank_shapes(model_config)],
    },
    "tokens_per_run": study.steps * 8 * study.batch_size * model_config.seq_len,
    "provenance": lm_runs.provenance(),
    "measured": measured_at(list(unique.values())),
    "training_time_s": sum(r["result"]["wall_time_s"] for r in unique.values()),
    "runs": len(unique),
    "sweep": {
      name: {f"{lr:g}": r["result"]["final_val_loss"] for lr, r in per_lr.items()}
      for name, per_lr in runs["sweep"].items()
    },
    "best_lr": runs["best_lr"],
    "methods": rows,
    "curves": {
      v.name: mean_curve(runs["seeds"][v.name], "val_loss")
      | {"bytes": [e["bytes"] for e in runs["seeds"][v.name][0]["result"]["evals"]]}
      for v in variants.QUALITY
    },
    "similarity": {
      name: mean_curve(runs["seeds"][name], "projection_similarity") for name in TRACKED
    },
    "rank_batch": rank_batch_rows(runs["rank_batch"]),
  }
  summary["claims"] = quality_claims.check(summary)
  return summary
