r"""Whole training-step time of LoRDO against DDP-AdamW on the example LM (CPU).

    python benchmarks/speed/step_overhead.py           # the tiny and small presets
    python benchmarks/speed/step_overhead.py --quick   # tiny preset, K = 4, 1 round: seconds

What is timed: the jitted training step of ``examples/lm`` (``train.make_step``:
forward, backward, ``tx.update``, ``optax.apply_updates`` under ``jax.shard_map``,
params and state donated) of the byte-level transformer, on 8 simulated CPU devices
forming 8 workers, each with the same batch of windows per step, for three optimizers
configured as ``examples/lm`` configures them (``optimizers.get_optimizer``; rank
d/4; embeddings and head on the full-rank path):

* ``ddp``: AdamW on the gradient all-reduced every step;
* ``low_rank_ddp``: GaLore on the all-reduced gradient, SVD refresh every
  T = K steps (the paper's baseline);
* ``lordo``: K - 1 local steps (no message), then a sync step (pseudo-gradient and
  moments all-reduced, SVD refresh of every basis).

How: each method runs rounds of K = 16 (4 with ``--quick``) consecutive steps on fresh
batches, each step followed by ``jax.block_until_ready`` and timed with ``time.perf_counter``
(the batch is made and placed on the devices before the timer starts: it is the
same for all methods). The first round is warm-up (compilation, LoRDO's initial
projection). Then the methods take turns round by round, so that the load of other
processes falls on all of them alike, and each kind of step (local, sync) is the
median over all its timed steps. LoRDO's amortised step is
:math:`((K - 1)\, t_\text{local} + t_\text{sync}) / K`, low-rank DDP's the same with
its refresh step, and every ratio is against DDP's median step in the same run.

The simulated workers share the machine's cores, so a collective costs memory
copies here, not network time: these ratios measure computation, and the bandwidth
cost of DDP's every-step all-reduce is left to the time-to-target study.
"""

import os

# Before NumPy loads: eight simulated devices each running a multi-threaded OpenBLAS
# SVD on a few cores run about 100x slower (see examples/main.py).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pathlib  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402

DEVICES = 8
jax.config.update("jax_num_cpu_devices", DEVICES)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks.*

from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from benchmarks.harness import studies  # noqa: E402
from benchmarks.harness.studies import Timed  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))

from lm import data  # noqa: E402
from lm import model  # noqa: E402
from lm import optimizers  # noqa: E402
from lm import train  # noqa: E402

K = 16  # LoRDO's sync_every and low-rank DDP's refresh_every; QUICK's is 4.
METHODS = ("ddp", "low_rank_ddp", "lordo")
WORKERS = 8
BATCH = 8  # Windows per worker per step.
LEARNING_RATE = 2e-3
FULL = dict(presets=("tiny", "small"), repeats=6, period=K)
# Quick mode checks the wiring: rounds of 4 steps (3 local, 1 sync), one timed.
QUICK = dict(presets=("tiny",), repeats=1, period=4)


def kind_of(method: str, period: int = K):
  """Which steps of ``method`` communicate (or refresh): its 'sync' steps."""
  if method == "lordo":
    return lambda t: "sync" if t % period == 0 else "local"
  if method == "low_rank_ddp":
    return lambda t: "sync" if t % period == 1 else "local"
  return lambda t: "local"


def training_step(method: str, preset: str, dataset: data.Dataset, period: int = K) -> Timed:
  """``method``'s training step on ``preset``, as ``examples/lm`` runs it, its rounds
  ``period`` (LoRDO's sync_every, low-rank DDP's refresh_every) steps long."""
  config = model.PRESETS[preset]
  apply, params = model.init(config, seed=0)
  tx = optimizers.get_optimizer(
    method,
    learning_rate=LEARNING_RATE,
    axis_name=train.AXIS,
    rank=config.d_model // 4,
    sync_every=period,
    refresh_every=period,
  )
  mesh = train.make_mesh(WORKERS)
  workers = NamedSharding(mesh, P(train.AXIS))
  state = jax.device_put(train.stack(tx.init(params), WORKERS), workers)
  carry = [jax.device_put(train.stack(params, WORKERS), workers), state]
  step = train.make_step(apply, tx, mesh, jax.tree.map(lambda _: P(train.AXIS), state))
  batches = data.Batches(dataset, seq_len=config.seq_len, batch_size=BATCH, seed=0)
  batch_sharding = NamedSharding(mesh, P(train.AXIS, train.DATA_AXIS))

  def call(batch):
    carry[0], carry[1], loss = step(carry[0], carry[1], batch)
    return carry, loss

  def prepare():  # The next batch, on the devices before the timer starts.
    return (jax.device_put(batches(), batch_sharding),)

  return Timed(call, period, kind_of(method, period), prepare)


def measure(presets, repeats: int, period: int = K) -> list[dict]:
  raw, name = data.load_text()
  timed = {}
  for preset in presets:
    config = model.PRESETS[preset]
    dataset = data.split(
      raw, num_workers=WORKERS, seq_len=config.seq_len, batch_size=BATCH, name=name
    )
    for method in METHODS:
      timed[preset, method] = training_step(method, preset, dataset, period)
  studies.interleave(list(timed.values()), repeats)
  rows = []
  for preset in presets:
    ddp = timed[preset, "ddp"].ms()
    for method in METHODS:
      t = timed[preset, method]
      local = t.ms()
      sync = t.ms("sync") if t.seconds["sync"] else local
      ms = {"local": local, "sync": sync, "amortised": studies.amortised(local, sync, period)}
      rows.append(
        {
          "preset": preset,
          "method": method,
          "ms": ms,
          "vs_ddp": {k: v / ddp for k, v in ms.items()},
          "ddp_ms": ddp,
          "samples": {k: len(v) for k, v in t.seconds.items()},
        }
      )
  return rows


def markdown(rows: list[dict]) -> list[str]:
  header = ["preset", "method", "local step", "sync step", "amortised", "vs DDP: local"]
  header += ["sync", "amortised"]
  body = []
  for row in rows:
    ms, ratio = row["ms"], row["vs_ddp"]
    body.append(
      [
        row["preset"],
        row["method"],
        f"{ms['local']:.1f}",
        f"{ms['sync']:.1f}",
        f"{ms['amortised']:.1f}",
        f"{ratio['local']:.2f}",
        f"{ratio['sync']:.2f}",
        f"**{ratio['amortised']:.2f}**",
      ]
    )
  return studies.table(header, body, align="ll" + "r" * (len(header) - 2))


def main(argv=None) -> int:
  args = studies.parse_args(__doc__, "the tiny preset only, K = 4, 1 round (seconds)", argv)
  settings = QUICK if args.quick else FULL
  start = time.perf_counter()
  rows = measure(**settings)
  shapes = {p: model.PRESETS[p] for p in settings["presets"]}
  notes = [
    f"Milliseconds per training step, medians over {settings['repeats']} interleaved "
    f"rounds of K = {settings['period']} steps after one warm-up round; {WORKERS} workers "
    f"on {DEVICES} simulated CPU devices, {BATCH} windows per worker per step, float32.",
    "Presets: "
    + "; ".join(
      f"{p} (d = {c.d_model}, {c.num_layers} layer(s), context {c.seq_len}, rank {c.d_model // 4})"
      for p, c in shapes.items()
    )
    + ".",
    "For DDP every step all-reduces the gradient, so its local and sync columns are "
    "the same step. low_rank_ddp's 'sync' step is its SVD refresh (every T = K steps). "
    "amortised = ((K - 1) local + sync) / K; ratios are against DDP's step in the same "
    "run.",
    "The workers are simulated on shared cores: collectives are memory copies, so "
    "these are computation ratios, not network time.",
  ]
  record = {
    "settings": {
      "presets": list(settings["presets"]),
      "methods": list(METHODS),
      "sync_every": settings["period"],
      "workers": WORKERS,
      "devices": DEVICES,
      "batch_per_worker": BATCH,
      "repeats": settings["repeats"],
    },
    "rows": rows,
    "wall_time_s": time.perf_counter() - start,
  }
  studies.write(
    "step_overhead",
    args,
    record,
    "Whole training step on the example LM: LoRDO and low-rank DDP vs DDP-AdamW (ms)",
    markdown(rows),
    notes,
  )
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
