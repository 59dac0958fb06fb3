r"""Speed of one optimizer step on CPU: LoRDO against AdamW, GaLore and its own floor.

    python benchmarks/speed/step_speed.py           # 768 x 768 and 768 x 3072, r = 64 and 128
    python benchmarks/speed/step_speed.py --quick   # 256 x 256, r = 32, K = 4, 1 round: seconds

What is timed, for each GPT-2 small layer shape (768 x 768, the attention output
projection, projected on the left; 768 x 3072, the MLP's first matrix, projected on
the right), each rank r and each projection method: one jitted
``step(params, state, grads) -> (apply_updates(params, update), new state)`` per
optimizer, params and state donated as in a training loop, one worker
(``axis_name=None``, so no collective runs), float32:

* ``optax.adamw``;
* ``optax.contrib.galore`` at rank r with ``update_proj_gap = K``: its SVD refresh
  runs on the first step of every period of K;
* ``lordo_jax.lordo(rank=r, sync_every=K, projection=...)``: K - 1 local steps
  (MATH.md §3), then a sync step (pseudo-gradient, outer step, moment averaging,
  projection refresh, moment rotation: MATH.md §4);
* the low-rank step alone: ``lordo_jax.scale_by_low_rank_adam`` (omega = 0.7, the
  same local step) chained with weight decay and the learning rate, without the
  ``synchronize`` wrapper around it, to show what the wrapper costs a local step;
* the products alone, the floor's second half: plain ``jnp`` ``Q^T G`` and ``Q X``
  (on the right ``G Q`` and ``X Q^T``) of LoRDO's shapes, one jitted call;
* the refresh alone: ``lordo_jax.compute_projection`` of the oriented matrix, to
  show how much of the sync step the projection method is.

How: each candidate runs a round of K consecutive calls (K = 16; 4 with ``--quick``),
each followed by ``jax.block_until_ready`` and timed with ``time.perf_counter``; the step
count says which kind a step is (LoRDO syncs at t = K, 2K, ...; GaLore refreshes at
t = 1, K + 1, ...). The first round of every candidate is warm-up (compilation,
LoRDO's initial projection) and is not counted. Then ``repeats`` rounds, the
candidates interleaved round by round in a rotating order, so that the load of other
processes on the machine falls on all of them alike. Each kind's time is its median
over all its timed steps (K - 1 local steps and 1 sync step per round), and

.. math::
  t_\text{amortised} = \frac{(K - 1)\, t_\text{local} + t_\text{sync}}{K}, \qquad
  t_\text{floor} = t_\text{adamw} + t_\text{products},

GaLore's amortised step the same with its refresh step. Issue 6's goals:
:math:`t_\text{amortised} \le 1.2\, t_\text{floor}`, and LoRDO's amortised step no
slower than GaLore's at the same rank and period. The floor adds two separately
dispatched calls, so it carries one dispatch (tens of microseconds) more than a step.

OpenBLAS (the LAPACK behind the SVD and QR) is held to one thread: on a shared
2-core machine its spinning threads made the SVD up to 10x slower.

XLA on CPU allocates a program's scratch memory (its largest live set over all
branches, the sync branch included) on every call. glibc's malloc serves an
allocation above its mmap threshold (dynamic, at most 32 MB) with fresh pages, and
gives free memory at the top of its heap back to the kernel above its trim
threshold; each 4 KiB page a step touches then costs a page fault. So a local step
is slower whenever its program's sync branch needs more scratch than that, though
that branch does not run: a "LoRDO local" well above "low-rank step alone" (svd at 768 x 3072,
whose sync branch holds the SVD's and the round's full-size arrays). Without it:

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=4294967296 \
      python benchmarks/speed/step_speed.py --out DIR

(the command and the setting are recorded with the results).
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # Before NumPy loads; see above.

import pathlib  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks.*

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

import lordo_jax  # noqa: E402
from benchmarks.harness import studies  # noqa: E402
from benchmarks.harness.studies import Timed  # noqa: E402

SHAPES = ((768, 768), (768, 3072))
RANKS = (64, 128)
METHODS = ("svd", "subspace_iteration", "dct")
K = 16  # LoRDO's sync_every and GaLore's update_proj_gap.
LEARNING_RATE = 1e-3
WEIGHT_DECAY = 1e-4  # optax.adamw's default, given to all three optimizers.
FULL_REPEATS = 9
# Quick mode checks the wiring: one square (left-projected) shape, rounds of 4 steps.
QUICK = dict(shapes=((256, 256),), ranks=(32,), repeats=1, period=4)
GOAL_FLOOR = 1.2


def lordo_kind(period: int = K) -> Callable[[int], str]:
  """LoRDO's step t (from 1) syncs at t = K, 2K, ...."""
  return lambda t: "sync" if t % period == 0 else "local"


def galore_kind(period: int = K) -> Callable[[int], str]:
  """GaLore's step t (from 1) refreshes at t = 1, K + 1, ...."""
  return lambda t: "sync" if t % period == 1 else "local"


def training_step(tx, shape) -> Callable:
  """A callable running one donated step of ``tx`` on a ``shape`` matrix, in place."""
  params = {"w": 0.02 * jax.random.normal(jax.random.key(0), shape)}
  grads = {"w": jax.random.normal(jax.random.key(1), shape)}
  # Own buffers: lordo's state holds params itself (the anchor), and a buffer can be
  # donated only once per call.
  carry = [params, jax.tree.map(jnp.copy, tx.init(params))]

  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  step = jax.jit(step, donate_argnums=(0, 1))

  def call():
    carry[:] = step(*carry, grads)
    return carry

  return call


def oriented(shape) -> tuple[int, int, bool]:
  """(n, m, left): Q is n x r, the coordinates r x m (MATH.md §2, side auto)."""
  p, q = shape
  return (p, q, True) if p >= q else (q, p, False)


def products(shape, rank) -> Callable:
  """The bare products of one LoRDO step: ``(Q^T G, Q X)``, or ``(G Q, X Q^T)``."""
  n, _, left = oriented(shape)
  keys = jax.random.split(jax.random.key(2), 3)
  basis = jax.random.normal(keys[0], (n, rank))
  gradient = jax.random.normal(keys[1], shape)
  if left:
    coordinates = jax.random.normal(keys[2], (rank, shape[1]))
    fn = jax.jit(lambda b, g, x: (b.T @ g, b @ x))
  else:
    coordinates = jax.random.normal(keys[2], (shape[0], rank))
    fn = jax.jit(lambda b, g, x: (g @ b, x @ b.T))
  return lambda: fn(basis, gradient, coordinates)


def refresh(shape, rank, method) -> Callable:
  """``lordo_jax.compute_projection`` of a ``shape`` matrix, oriented, alone."""
  n, m, _ = oriented(shape)
  x = jax.random.normal(jax.random.key(3), (n, m))
  previous, _ = lordo_jax.compute_projection(x, jnp.zeros((n, rank)), "svd", rank)
  if method == "dct":
    previous = lordo_jax.DCTBasis(jnp.arange(rank, dtype=jnp.int32), n)
  fn = jax.jit(lambda x, prev: lordo_jax.compute_projection(x, prev, method, rank))
  return lambda: fn(x, previous)


def low_rank_step(rank, method) -> optax.GradientTransformation:
  """LoRDO's local step without ``synchronize``: low-rank Adam, QH mix, AdamW's tail."""
  return optax.chain(
    lordo_jax.scale_by_low_rank_adam(rank, omega=0.7, projection=method, init_projection="random"),
    optax.add_decayed_weights(WEIGHT_DECAY),
    optax.scale_by_learning_rate(LEARNING_RATE),
  )


def candidates(shapes, ranks, period: int = K) -> dict[tuple, Timed]:
  """Every timed function, keyed by (what, shape, rank, method); rounds of ``period``
  calls (LoRDO's sync_every, GaLore's update_proj_gap)."""
  out = {}
  for shape in shapes:
    adamw = optax.adamw(LEARNING_RATE, weight_decay=WEIGHT_DECAY)
    out["adamw", shape, None, None] = Timed(training_step(adamw, shape), period)
    for rank in ranks:
      galore = optax.contrib.galore(
        LEARNING_RATE, rank=rank, update_proj_gap=period, weight_decay=WEIGHT_DECAY
      )
      galore_step = training_step(galore, shape)
      out["galore", shape, rank, None] = Timed(galore_step, period, galore_kind(period))
      out["products", shape, rank, None] = Timed(products(shape, rank), period)
      for method in METHODS:
        lordo = lordo_jax.lordo(
          LEARNING_RATE,
          rank=rank,
          sync_every=period,
          projection=method,
          weight_decay=WEIGHT_DECAY,
        )
        lordo_step = training_step(lordo, shape)
        out["lordo", shape, rank, method] = Timed(lordo_step, period, lordo_kind(period))
        out["low_rank", shape, rank, method] = Timed(
          training_step(low_rank_step(rank, method), shape), period
        )
        out["refresh", shape, rank, method] = Timed(refresh(shape, rank, method), 1)
  return out


def measure(shapes, ranks, repeats: int, period: int = K) -> list[dict]:
  """Runs every candidate (warm-up, then ``repeats`` interleaved rounds of ``period``
  calls); one row per (shape, rank, method)."""
  timed = candidates(shapes, ranks, period)
  studies.interleave(list(timed.values()), repeats)
  rows = []
  for shape in shapes:
    adamw = timed["adamw", shape, None, None].ms()
    for rank in ranks:
      galore = timed["galore", shape, rank, None]
      floor = adamw + timed["products", shape, rank, None].ms()
      galore_ms = {"local": galore.ms(), "refresh": galore.ms("sync")}
      galore_ms["amortised"] = studies.amortised(galore_ms["local"], galore_ms["refresh"], period)
      for method in METHODS:
        lordo = timed["lordo", shape, rank, method]
        ms = {
          "adamw": adamw,
          "products": timed["products", shape, rank, None].ms(),
          "floor": floor,
          "galore_local": galore_ms["local"],
          "galore_refresh": galore_ms["refresh"],
          "galore_amortised": galore_ms["amortised"],
          "lordo_local": lordo.ms(),
          "lordo_sync": lordo.ms("sync"),
          "low_rank_alone": timed["low_rank", shape, rank, method].ms(),
          "refresh_alone": timed["refresh", shape, rank, method].ms(),
        }
        ms["lordo_amortised"] = studies.amortised(ms["lordo_local"], ms["lordo_sync"], period)
        ratios = {
          "amortised_vs_floor": ms["lordo_amortised"] / floor,
          "amortised_vs_galore": ms["lordo_amortised"] / ms["galore_amortised"],
          "local_vs_floor": ms["lordo_local"] / floor,
          "local_vs_galore_local": ms["lordo_local"] / ms["galore_local"],
          "amortised_vs_adamw": ms["lordo_amortised"] / adamw,
        }
        rows.append(
          {
            "shape": list(shape),
            "rank": rank,
            "projection": method,
            "side": "left" if oriented(shape)[2] else "right",
            "ms": ms,
            "ratios": ratios,
            "goals": {
              "within_1.2x_of_floor": ratios["amortised_vs_floor"] <= GOAL_FLOOR,
              "no_slower_than_galore": ratios["amortised_vs_galore"] <= 1.0,
            },
            "samples": {
              "lordo_local": len(lordo.seconds["local"]),
              "lordo_sync": len(lordo.seconds["sync"]),
            },
          }
        )
  return rows


def markdown(rows: list[dict]) -> list[str]:
  header = [
    "shape (side)",
    "r",
    "projection",
    "AdamW",
    "products",
    "floor",
    "GaLore local / refresh",
    "GaLore amortised",
    "LoRDO local",
    "low-rank step alone",
    "LoRDO sync",
    "refresh alone",
    "LoRDO amortised",
    "amortised / floor",
    "amortised / GaLore",
  ]
  body = []
  for row in rows:
    ms, ratios = row["ms"], row["ratios"]
    body.append(
      [
        f"{row['shape'][0]} x {row['shape'][1]} ({row['side']})",
        row["rank"],
        row["projection"],
        f"{ms['adamw']:.2f}",
        f"{ms['products']:.2f}",
        f"{ms['floor']:.2f}",
        f"{ms['galore_local']:.2f} / {ms['galore_refresh']:.1f}",
        f"{ms['galore_amortised']:.2f}",
        f"{ms['lordo_local']:.2f}",
        f"{ms['low_rank_alone']:.2f}",
        f"{ms['lordo_sync']:.1f}",
        f"{ms['refresh_alone']:.1f}",
        f"{ms['lordo_amortised']:.2f}",
        f"**{ratios['amortised_vs_floor']:.2f}**",
        f"**{ratios['amortised_vs_galore']:.2f}**",
      ]
    )
  return studies.table(header, body, align="lrl" + "r" * (len(header) - 3))


def main(argv=None) -> int:
  quick_help = "256 x 256 at r = 32 only, K = 4, 1 round (seconds)"
  args = studies.parse_args(__doc__, quick_help, argv)
  full = dict(shapes=SHAPES, ranks=RANKS, repeats=FULL_REPEATS, period=K)
  settings = QUICK if args.quick else full
  k = settings["period"]
  start = time.perf_counter()
  rows = measure(**settings)
  held = {goal: sum(r["goals"][goal] for r in rows) for goal in rows[0]["goals"]}
  notes = [
    f"Milliseconds per step, medians over {settings['repeats']} interleaved rounds of "
    f"K = {k} steps (K - 1 local steps and 1 sync step per round), after one warm-up "
    "round; float32, one worker (axis_name=None), params and state donated.",
    "floor = AdamW step + the bare products Q^T G and Q X of the same shapes "
    "(plain jnp, same run). amortised = ((K - 1) local + sync) / K; GaLore's with "
    f"its refresh step (update_proj_gap = K = {k}). 'low-rank step alone' is "
    "scale_by_low_rank_adam + weight decay + learning rate without synchronize (the "
    "same local step); 'refresh alone' is lordo_jax.compute_projection of the "
    "oriented matrix.",
    f"Speed goals: amortised within {GOAL_FLOOR}x of the floor held in "
    f"{held['within_1.2x_of_floor']} of {len(rows)} rows; no slower than GaLore's "
    f"amortised step held in {held['no_slower_than_galore']} of {len(rows)} rows.",
  ]
  if studies.malloc_settings():
    notes.append(
      f"Run with {studies.malloc_settings()}: glibc keeps and reuses the programs' "
      "scratch memory instead of mapping fresh pages for it on every call."
    )
  else:
    notes.append(
      "glibc's malloc (default mmap threshold, at most 32 MB) maps a program's scratch "
      "memory afresh on every call once it exceeds the threshold, and every 4 KiB page "
      "the step touches then faults. A program whose sync branch needs that much "
      "scratch pays it on every local step, so a 'LoRDO local' well above 'low-rank "
      "step alone' is this effect; run with MALLOC_MMAP_THRESHOLD_=4294967296 "
      "MALLOC_TRIM_THRESHOLD_=4294967296 to remove it."
    )
  record = {
    "settings": {
      "shapes": [list(s) for s in settings["shapes"]],
      "ranks": list(settings["ranks"]),
      "methods": list(METHODS),
      "sync_every": k,
      "repeats": settings["repeats"],
      "learning_rate": LEARNING_RATE,
      "weight_decay": WEIGHT_DECAY,
      "goal_floor_ratio": GOAL_FLOOR,
    },
    "rows": rows,
    "wall_time_s": time.perf_counter() - start,
  }
  studies.write(
    "step_speed",
    args,
    record,
    "Optimizer step time on CPU: LoRDO vs AdamW, GaLore and the floor (ms)",
    markdown(rows),
    notes,
  )
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
