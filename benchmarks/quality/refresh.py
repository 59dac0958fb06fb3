r"""Which basis refresh LoRDO takes: its loss with each, and its distance to the exact subspace.

    python benchmarks/quality/refresh.py          # the LM at 256, 1,024 and 2,048 steps, 3 seeds
    python benchmarks/quality/refresh.py --cached # the report from the runs already cached
    python benchmarks/quality/refresh.py --quick  # the LM's tiny preset, 96 steps, 1 seed

Quality: LoRDO trains the quality study's model and data (:mod:`quality`'s settings:
the ``small`` preset, r = 32, K = 16, 8 workers) at the learning rate the quality study
found best for LoRDO, with the SVD and with subspace iteration at 16, 64 and 128 rounds
(256, 1,024 and 2,048 steps; warmup 32, then cosine over the run), and with the other
one-sided refreshes (``randomized_svd``, ``dct``) at 16, over its seeds. The SVD's
runs are the quality and long-horizon studies' own LoRDO runs (read from their cache:
the SVD was LoRDO's default then). The speed of each refresh is
``device_speed.py``'s (section ``refresh``).

Distance: one LoRDO run of 16 rounds (seed 0) per refresh; after every sync, the
principal angles between each matrix's basis and the exact top-r singular subspace of
the round's averaged pseudo-gradient :math:`\bar\Delta` (on the basis's side), which
every worker holds (the anchor moves by :math:`-\bar\Delta` under the default outer
step), and the share of that subspace's energy the basis keeps. The table gives, over
the syncs and matrices, the median and the extreme of each.

The paper's protocol with each refresh is ``paper_protocol.py``'s (its arms ``paper``
and ``paper_subspace_iteration``); this report repeats their rows when that study's
results are in ``--out``.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # Before NumPy loads: see quality.py.

import dataclasses  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks.*

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import lordo_jax  # noqa: E402
from benchmarks.harness import lm_runs  # noqa: E402
from benchmarks.harness import quality_report  # noqa: E402
from benchmarks.harness import studies  # noqa: E402
from benchmarks.harness.variants import Variant  # noqa: E402
from benchmarks.quality import quality  # noqa: E402

sys.path.insert(0, str(studies.ROOT / "examples"))  # As lm_runs does.
from lm import data  # noqa: E402
from lm import model  # noqa: E402
from lm import train  # noqa: E402

HORIZONS = (256, 1024, 2048)  # 16, 64 and 128 rounds of K = 16.
COMPARED = ("svd", "subspace_iteration")  # At every horizon.
OTHERS = ("randomized_svd", "dct")  # At the first horizon only.
QUICK_HORIZONS = (96,)


def variant(projection: str) -> Variant:
  """LoRDO with ``projection``; the ``svd`` row is the quality study's own LoRDO (the
  SVD was LoRDO's default when it ran: its runs keep their names)."""
  name = "lordo" if projection == "svd" else f"lordo_{projection}"
  return Variant(name, "lordo", (("projection", projection),))


def spec(study: quality.Study, projection: str, rate: float, seed: int, steps: int):
  return dataclasses.replace(study.spec(variant(projection), rate, seed), steps=steps)


def quality_rows(study: quality.Study, rate: float, horizons, cache, train_runs: bool) -> list:
  """Per projection and horizon: the final validation losses over the seeds (None for a
  run not cached, with ``train_runs`` off)."""

  def loss(run) -> float | None:
    path = cache / run.file_name()
    if train_runs:
      return lm_runs.run(run, cache)["result"]["final_val_loss"]
    return json.loads(path.read_text())["result"]["final_val_loss"] if path.exists() else None

  rows = []
  for steps in horizons:
    for projection in COMPARED + (OTHERS if steps == horizons[0] else ()):
      losses = [loss(spec(study, projection, rate, s, steps)) for s in study.seeds]
      done = [x for x in losses if x is not None]
      rows.append(
        {
          "projection": projection,
          "steps": steps,
          "rounds": steps // study.sync_every,
          "losses": losses,
          "mean": statistics.fmean(done) if done else None,
          "spread": statistics.stdev(done) if len(done) > 1 else 0.0,
        }
      )
  return rows


def _exact_basis(delta: np.ndarray, basis: np.ndarray) -> np.ndarray:
  """The top-r singular vectors of ``delta`` on the side of ``basis`` (``n x r``)."""
  u, _, vh = np.linalg.svd(delta, full_matrices=False)
  left = basis.shape[0] == delta.shape[0] and (delta.shape[0] >= delta.shape[1])
  return (u if left else vh.T)[:, : basis.shape[1]]


def _distance(delta: np.ndarray, basis: np.ndarray) -> tuple[np.ndarray, float]:
  r"""The principal angles (degrees) between ``span(basis)`` and the exact top-r
  subspace of ``delta``, and the share of the exact subspace's energy the basis keeps:
  :math:`\lVert Q^\top \Delta \rVert_F^2 / \sum_{i \le r} \sigma_i^2` (1 for the SVD)."""
  exact = _exact_basis(delta, basis)
  cosines = np.linalg.svd(basis.T @ exact, compute_uv=False)
  oriented = delta if basis.shape[0] == delta.shape[0] else delta.T
  kept = np.sum((basis.T @ oriented) ** 2) / np.sum((exact.T @ oriented) ** 2)
  return np.degrees(np.arccos(np.clip(cosines, 0.0, 1.0))), float(kept)


def _synchronize_state(state):
  is_round = lambda x: isinstance(x, lordo_jax.SynchronizeState)  # noqa: E731
  return next(x for x in jax.tree.leaves(state, is_leaf=is_round) if is_round(x))


def distances(study: quality.Study, projection: str, rate: float, steps: int) -> dict:
  """Principal angles to the exact subspace after every sync of one LoRDO run (seed 0)."""
  run = spec(study, projection, rate, study.seeds[0], steps)
  config, model_config = run.config(), model.PRESETS[study.preset]
  apply, params = model.init(model_config, seed=run.seed)
  raw, name = data.load_text()
  workers = run.num_workers
  dataset = data.split(
    raw, num_workers=workers, seq_len=model_config.seq_len, batch_size=run.batch_size, name=name
  )
  tx = train.make_optimizer("lordo", config)
  mesh = train.make_mesh(workers)
  sharded = NamedSharding(mesh, P(train.AXIS))
  state = jax.device_put(train.stack(tx.init(params), workers), sharded)
  params = jax.device_put(train.stack(params, workers), sharded)
  step = train.make_step(apply, tx, mesh, jax.tree.map(lambda _: P(train.AXIS), state))
  batches = data.Batches(dataset, seq_len=model_config.seq_len, batch_size=run.batch_size, seed=0)
  batch_sharding = NamedSharding(mesh, P(train.AXIS, train.DATA_AXIS))
  first_worker = lambda tree: jax.tree.map(lambda x: np.asarray(x, np.float64)[0], tree)  # noqa: E731
  anchor = first_worker(_synchronize_state(state).anchor)
  found = []  # (angles, energy kept) per matrix and sync.
  for t in range(1, steps + 1):
    params, state, _ = step(params, state, jax.device_put(batches(), batch_sharding))
    jax.block_until_ready(state)
    if t % study.sync_every:
      continue
    new_anchor = first_worker(_synchronize_state(state).anchor)
    bases = first_worker(lordo_jax.projections(state))  # None where a leaf is not low-rank.
    is_none = lambda x: x is None  # noqa: E731
    measured = jax.tree.map(
      lambda basis, old, new: None if basis is None else _distance(old - new, basis),
      bases,
      anchor,
      new_anchor,
      is_leaf=is_none,
    )
    entries = jax.tree.leaves(measured, is_leaf=lambda x: x is None or isinstance(x, tuple))
    found += [d for d in entries if d is not None]
    anchor = new_anchor
  angles = np.concatenate([a for a, _ in found])
  kept = np.asarray([k for _, k in found])
  return {
    "projection": projection,
    "syncs": steps // study.sync_every,
    "median_degrees": float(np.median(angles)),
    "largest_degrees": float(angles.max()),
    "energy_kept_median": float(np.median(kept)),
    "energy_kept_least": float(kept.min()),
  }


def paper_rows(out) -> list[dict]:
  """The paper's protocol's arms with each refresh, where that study's results are."""
  path = out / "paper_protocol.json"
  if not path.exists():
    return []
  arms = ("paper", "paper_subspace_iteration")
  return [r for r in json.loads(path.read_text())["rows"] if r["arm"] in arms]


def _loss(row) -> str:
  if row["mean"] is None:
    return "not run"
  return f"{row['mean']:.4f} +- {row['spread']:.4f}"


def markdown(result: dict) -> list[str]:
  svd = {r["steps"]: r["mean"] for r in result["quality"] if r["projection"] == "svd"}

  def versus(row) -> str:
    if row["mean"] is None or svd.get(row["steps"]) is None:
      return "-"
    return f"{100 * (row['mean'] - svd[row['steps']]) / svd[row['steps']]:+.2f}%"

  lines = studies.table(
    ["projection", "rounds", "final val loss (mean +- sd)", "vs svd", "per seed"],
    [
      [
        r["projection"],
        r["rounds"],
        _loss(r),
        versus(r),
        ", ".join("-" if x is None else f"{x:.4f}" for x in r["losses"]),
      ]
      for r in result["quality"]
    ],
    align="lrrrr",
  )
  lines += ["", "Distance to the exact subspace of each round's averaged pseudo-gradient:", ""]
  lines += studies.table(
    ["projection", "syncs", "median angle", "largest angle", "energy kept: median", "least"],
    [
      [
        d["projection"],
        d["syncs"],
        f"{d['median_degrees']:.2f} deg",
        f"{d['largest_degrees']:.1f} deg",
        f"{d['energy_kept_median']:.4f}",
        f"{d['energy_kept_least']:.4f}",
      ]
      for d in result["distances"]
    ],
    align="lrrrrr",
  )
  if result["paper"]:
    lines += ["", "The paper's protocol (paper_protocol.py) with each refresh:", ""]
    lines += studies.table(
      ["arm", "LoRDO", "low-rank DDP", "LoRDO vs low-rank DDP"],
      [
        [
          r["arm"],
          f"{statistics.fmean(r['lordo']):.4f} +- {statistics.stdev(r['lordo']):.4f}",
          f"{statistics.fmean(r['low_rank_ddp']):.4f}",
          f"{100 * r['gap_mean']:+.2f}%",
        ]
        for r in result["paper"]
      ],
      align="lrrr",
    )
  return lines


def main(argv=None) -> int:
  def extra(parser):
    parser.add_argument("--cached", action="store_true", help="train nothing: report the cache")

  args = studies.parse_args(__doc__, "the tiny preset, 96 steps, 1 seed", argv, extra)
  start = time.perf_counter()
  study = quality.QUICK if args.quick else quality.FULL
  horizons = QUICK_HORIZONS if args.quick else HORIZONS
  rate = json.loads((args.out / quality_report.JSON_NAME).read_text())["best_lr"]["lordo"]
  cache = studies.runs(args.out, "lm")
  result = {
    "learning_rate": rate,
    "quality": quality_rows(study, rate, horizons, cache, train_runs=not args.cached),
    "distances": [
      distances(study, p, rate, study.steps) for p in COMPARED + OTHERS if not args.cached
    ],
    "paper": paper_rows(args.out),
  }
  if args.cached:  # The distances take no cache: keep the last report's.
    previous = args.out / "refresh.json"
    if previous.exists():
      result["distances"] = json.loads(previous.read_text())["distances"]
  notes = [
    f"Quality: the {study.preset} preset, r = {study.rank}, K = {study.sync_every}, "
    f"{lm_runs.DEVICES} workers, seeds {list(study.seeds)}, LoRDO at the quality study's best "
    f"learning rate ({rate:g}); the svd rows are the quality and long-horizon studies' LoRDO.",
    f"Distance: principal angles after each of the {study.steps // study.sync_every} syncs of "
    "seed 0's run, between every low-rank matrix's basis and the top-r singular vectors "
    "of the round's averaged pseudo-gradient on the same side; energy kept: the share of "
    "the top-r singular values' squared sum that the basis's projection keeps.",
  ]
  studies.write(
    "refresh",
    args,
    {**result, "wall_time_s": time.perf_counter() - start},
    "The basis refresh: LoRDO's quality with each, and its distance to the exact subspace",
    markdown(result),
    notes,
  )
  return 0


if __name__ == "__main__":
  lm_runs.simulate_devices()
  raise SystemExit(main())
