r"""LoRDO's learning rate against AdamW's: the README's example over a grid of rates.

    python benchmarks/quality/learning_rate.py          # 9 rates x 3 seeds x 2 horizons: minutes
    python benchmarks/quality/learning_rate.py --quick  # 3 rates, 1 seed, the README's 64 steps

The README's first example (one worker): an MLP 32 -> 128 -> 32 with GELU (Flax NNX),
mean squared error against ``x @ target``, ``target`` standard normal / 6, batches of 16
standard normal inputs, trained by ``optax.adamw(lr)`` and by ``lordo_jax.lordo(lr,
rank=8, sync_every=16)`` (``axis_name=None``). Each run's loss is measured on 1,024
held-out inputs after 64 steps (the README's run) and after 256; seed s initialises the
model with ``nnx.Rngs(s)`` and draws step t's batch from ``fold_in(key(s), t)``. The
rate is an ``optax.inject_hyperparams`` array, so each method and horizon compiles once
and every rate and seed runs the same program.

The table gives each method's mean loss at every rate, its best rate, and the ratio of
LoRDO's best rate to AdamW's.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # Before NumPy loads; see step_speed.py.

import pathlib  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks.*

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

import lordo_jax  # noqa: E402
from benchmarks.harness import studies  # noqa: E402

RATES = (1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 1e-1, 2e-1, 5e-1)
QUICK_RATES = (3e-3, 1e-2, 3e-2)
HORIZONS = (64, 256)
SEEDS = (0, 1, 2)
METHODS = {
  "adamw": optax.inject_hyperparams(optax.adamw),
  "lordo": optax.inject_hyperparams(lordo_jax.lordo, static_args=("rank", "sync_every")),
}
OPTIONS = {"adamw": {}, "lordo": {"rank": 8, "sync_every": 16}}
TARGET = jax.random.normal(jax.random.key(1), (32, 32)) / 6
HELD_OUT = jax.random.normal(jax.random.key(10_000), (1024, 32))


class MLP(nnx.Module):
  """The README's model."""

  def __init__(self, rngs: nnx.Rngs):
    self.up = nnx.Linear(32, 128, rngs=rngs)
    self.down = nnx.Linear(128, 32, rngs=rngs)

  def __call__(self, x):
    return self.down(nnx.gelu(self.up(x)))


def runner(method: str, steps: int):
  """A jitted ``run(lr, params, seed) -> held-out loss`` of ``method`` for ``steps``."""
  graphdef, _ = nnx.split(MLP(nnx.Rngs(0)), nnx.Param)
  tx = METHODS[method](learning_rate=0.0, **OPTIONS[method])

  def loss_fn(params, x):
    return jnp.mean((nnx.merge(graphdef, params)(x) - x @ TARGET) ** 2)

  @jax.jit
  def run(lr, params, seed):
    state = tx.init(params)
    state.hyperparams["learning_rate"] = lr

    def step(carry, t):
      params, state = carry
      x = jax.random.normal(jax.random.fold_in(jax.random.key(seed), t), (16, 32))
      updates, state = tx.update(jax.grad(loss_fn)(params, x), state, params)
      return (optax.apply_updates(params, updates), state), None

    (params, _), _ = jax.lax.scan(step, (params, state), jnp.arange(steps))
    return loss_fn(params, HELD_OUT)

  return run


def measure(rates, horizons, seeds) -> dict:
  """``{method: {steps: {rate: [held-out loss per seed]}}}``."""
  params = {s: nnx.to_pure_dict(nnx.state(MLP(nnx.Rngs(s)), nnx.Param)) for s in seeds}
  losses = {}
  for method in METHODS:
    for steps in horizons:
      run = runner(method, steps)
      by_rate = losses.setdefault(method, {}).setdefault(steps, {})
      for lr in rates:
        by_rate[lr] = [float(run(jnp.float32(lr), params[s], s)) for s in seeds]
      print(
        f"{method}, {steps} steps: "
        + ", ".join(f"{lr:g} {statistics.mean(v):.4f}" for lr, v in by_rate.items()),
        flush=True,
      )
  return losses


def best(by_rate: dict) -> float:
  """The rate of the lowest mean loss (a diverged run, NaN, never wins)."""
  finite = {lr: statistics.mean(v) for lr, v in by_rate.items() if all(x == x for x in v)}
  return min(finite, key=finite.get)


def report(losses: dict, rates) -> tuple[list[str], dict]:
  header = ["steps", "method", *(f"{lr:g}" for lr in rates), "best rate"]
  rows, summary = [], {}
  for steps in losses["adamw"]:
    for method in METHODS:
      by_rate = losses[method][steps]
      chosen = best(by_rate)
      cells = [
        f"**{statistics.mean(v):.4f}**" if lr == chosen else f"{statistics.mean(v):.4f}"
        for lr, v in by_rate.items()
      ]
      rows.append([steps, method, *cells, f"{chosen:g}"])
    ratio = best(losses["lordo"][steps]) / best(losses["adamw"][steps])
    summary[steps] = {
      "adamw": best(losses["adamw"][steps]),
      "lordo": best(losses["lordo"][steps]),
      "ratio": ratio,
      "lordo_at_adamws_best": statistics.mean(losses["lordo"][steps][best(losses["adamw"][steps])]),
      "adamw_best_loss": statistics.mean(losses["adamw"][steps][best(losses["adamw"][steps])]),
      "lordo_best_loss": statistics.mean(losses["lordo"][steps][best(losses["lordo"][steps])]),
    }
  lines = studies.table(header, rows, "rl" + "r" * (len(rates) + 1))
  lines.append("")
  for steps, s in summary.items():
    lines.append(
      f"- {steps} steps: AdamW's best rate {s['adamw']:g} (loss {s['adamw_best_loss']:.4f}), "
      f"LoRDO's {s['lordo']:g} (loss {s['lordo_best_loss']:.4f}): **{s['ratio']:g}x**; "
      f"LoRDO at AdamW's best rate: {s['lordo_at_adamws_best']:.4f}."
    )
  return lines, summary


def main(argv=None) -> int:
  args = studies.parse_args(__doc__, "3 rates, 1 seed, 64 steps", argv)
  rates, horizons, seeds = (QUICK_RATES, (64,), (0,)) if args.quick else (RATES, HORIZONS, SEEDS)
  losses = measure(rates, horizons, seeds)
  lines, summary = report(losses, rates)
  notes = [
    f"Held-out mean squared error after the run, mean over seeds {list(seeds)}; bold: each "
    "row's lowest (its best rate).",
    "adamw: optax.adamw(lr) (weight decay 1e-4, its default); lordo: lordo_jax.lordo(lr, "
    "rank=8, sync_every=16), one worker, every other option its default.",
  ]
  record = {
    "rates": list(rates),
    "seeds": list(seeds),
    "losses": {
      m: {str(k): {f"{lr:g}": v for lr, v in r.items()} for k, r in h.items()}
      for m, h in losses.items()
    },
    "best": {str(k): v for k, v in summary.items()},
  }
  studies.write(
    "learning_rate",
    args,
    record,
    "LoRDO's learning rate against AdamW's (the README's example)",
    lines,
    notes,
  )
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
