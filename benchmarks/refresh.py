r"""Which basis refresh to use: its time on GPT-2 small's matrices, and LoRDO's quality with it.

    python benchmarks/refresh.py          # timing; the LM at the quality settings, 3 seeds
    python benchmarks/refresh.py --quick  # timing at r = 32, the LM's tiny preset, 1 seed

Timing: one refresh (``compute(matrix, previous, key)`` of the projection's
:class:`lordo_jax.local.bases.BasisStrategy`, jitted) of each GPT-2 small matrix shape
(768 x 2304, 768 x 768, 768 x 3072, 3072 x 768) at r = 192, on a matrix with a
decaying spectrum (singular values :math:`1/\sqrt{i}`, like a pseudo-gradient's), for
every projection: one-sided ``svd`` (the default), ``subspace_iteration`` (2
iterations from the previous basis), ``randomized_svd`` (8 extra columns, 1 power
iteration), ``dct``, and two-sided ``svd`` and ``randomized_svd``. The candidates run
in turn, round after round (``studies.interleave``), so a loaded machine slows them
alike; the table reports medians and the ratio to ``svd`` measured in the same run.

Quality: LoRDO trains the quality study's model and data (:mod:`quality`'s settings:
the ``small`` preset, 256 steps, r = 32, K = 16) at the learning rate the quality study
found best for LoRDO, with each one-sided projection, over its seeds; the ``svd`` row
is the quality study's own LoRDO runs (read from its cache).
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # Before NumPy loads: see quality.py.

import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import quality  # noqa: E402
from harness import lm_runs  # noqa: E402
from harness import quality_report  # noqa: E402
from harness import studies  # noqa: E402
from harness.variants import Variant  # noqa: E402

from lordo_jax.local import bases  # noqa: E402

SHAPES = ((768, 2304), (768, 768), (768, 3072), (3072, 768))
PROJECTIONS = (  # (name, projection, two_sided)
  ("svd", "svd", False),
  ("subspace_iteration", "subspace_iteration", False),
  ("randomized_svd", "randomized_svd", False),
  ("dct", "dct", False),
  ("two-sided svd", "svd", True),
  ("two-sided randomized_svd", "randomized_svd", True),
)
QUALITY = ("svd", "subspace_iteration", "randomized_svd", "dct")


def decaying(p: int, q: int, seed: int) -> jax.Array:
  """A ``p x q`` float32 matrix with singular values ``1 / sqrt(i)``."""
  rng = np.random.default_rng(seed)
  u, _ = np.linalg.qr(rng.standard_normal((p, min(p, q))))
  v, _ = np.linalg.qr(rng.standard_normal((q, min(p, q))))
  s = 1 / np.sqrt(np.arange(1, min(p, q) + 1))
  return jnp.asarray((u * s) @ v.T, jnp.float32)


def timed_refresh(projection: str, two_sided: bool, rank: int, repeats: int) -> studies.Timed:
  """One refresh of every GPT-2 shape per call, from the previous step's basis."""
  method = bases.method(projection, two_sided=two_sided, options=bases.Options(rank=rank))
  strategies = [method.strategy(p, q) for p, q in SHAPES]
  matrices = [decaying(p, q, i) for i, (p, q) in enumerate(SHAPES)]
  key = jax.random.key(0)
  previous = [s.exact(x, s.init(key), key)[0] if s.exact else s.compute(x, s.init(key), key)[0]
              for s, x in zip(strategies, matrices, strict=True)]  # fmt: skip
  refresh = jax.jit(
    lambda xs, ps: [s.compute(x, p, key)[0] for s, x, p in zip(strategies, xs, ps, strict=True)]
  )
  return studies.Timed(lambda: refresh(matrices, previous), calls=1)


def timing(rank: int, repeats: int) -> list[dict]:
  candidates = {name: timed_refresh(p, two, rank, repeats) for name, p, two in PROJECTIONS}
  studies.interleave(list(candidates.values()), repeats)
  svd = candidates["svd"].ms()
  return [
    {"projection": name, "ms": t.ms(), "vs_svd": t.ms() / svd, "samples": len(t.seconds["local"])}
    for name, t in candidates.items()
  ]


def variant(projection: str) -> Variant:
  """LoRDO with ``projection``; the ``svd`` row is the quality study's own LoRDO."""
  if projection == "svd":
    return Variant("lordo", "lordo", description="pseudo-gradient + r x q moments every K")
  return Variant(f"lordo_{projection}", "lordo", (("projection", projection),))


def lm_quality(study: quality.Study, out) -> list[dict]:
  learning_rate = json.loads((out / quality_report.JSON_NAME).read_text())["best_lr"]["lordo"]
  rows = []
  for projection in QUALITY:
    records = [
      lm_runs.run(study.spec(variant(projection), learning_rate, seed), out / "runs")
      for seed in study.seeds
    ]
    losses = [r["result"]["final_val_loss"] for r in records]
    rows.append(
      {
        "projection": projection,
        "learning_rate": learning_rate,
        "losses": losses,
        "mean": statistics.mean(losses),
        "spread": statistics.stdev(losses) if len(losses) > 1 else 0.0,
      }
    )
  return rows


def markdown(result: dict) -> list[str]:
  lines = studies.table(
    ["projection", "ms per refresh of the 4 shapes", "vs svd"],
    [[r["projection"], f"{r['ms']:.1f}", f"{r['vs_svd']:.2f}"] for r in result["timing"]],
    align="lrr",
  )
  svd = result["quality"][0]["mean"]
  lines += ["", "LoRDO on the LM with each one-sided refresh:", ""]
  lines += studies.table(
    ["projection", "LR", "final val loss (mean +- sd)", "vs svd", "seeds"],
    [
      [
        r["projection"],
        f"{r['learning_rate']:g}",
        f"{r['mean']:.4f} +- {r['spread']:.4f}",
        f"{100 * (r['mean'] - svd) / svd:+.2f}%",
        len(r["losses"]),
      ]
      for r in result["quality"]
    ],
    align="lrrrr",
  )
  return lines


def main(argv=None) -> int:
  args = studies.parse_args(__doc__, "timing at r = 32, the LM's tiny preset, 1 seed", argv)
  start = time.perf_counter()
  study = quality.QUICK if args.quick else quality.FULL
  rank, repeats = (32, 3) if args.quick else (192, 7)
  result = {"rank": rank, "timing": timing(rank, repeats)}
  result["quality"] = lm_quality(study, args.out)
  notes = [
    f"Timing: one jitted refresh of each of the 4 GPT-2 small matrix shapes at r = {rank}, "
    f"median of {repeats} interleaved rounds after a warm-up; ratios measured in the same run.",
    f"Quality: the {study.preset} preset, {study.steps} steps, r = {study.rank}, "
    f"K = {study.sync_every}, seeds {list(study.seeds)}, LoRDO at the quality study's best "
    "learning rate; the svd row is the quality study's LoRDO.",
  ]
  studies.write(
    "refresh",
    args,
    {**result, "wall_time_s": time.perf_counter() - start},
    "The basis refresh: time on GPT-2 small shapes and LoRDO's quality on the LM",
    markdown(result),
    notes,
  )
  return 0


if __name__ == "__main__":
  lm_runs.simulate_devices()
  raise SystemExit(main())
