r"""How long a step takes to compile: LoRDO against AdamW and DDP (and DiLoCo), on this CPU.

    python benchmarks/speed/compile_time.py          # GPT-2 small shapes, the LM small preset
    python benchmarks/speed/compile_time.py --quick  # tiny shapes, the LM's tiny preset: a minute

Two programs per method, each compiled for 8 simulated workers (``jax.shard_map`` over a
``workers`` axis of 8 CPU devices, one copy of the parameters and state per worker):

* ``optimizer``: ``step(params, state, grads) -> (apply_updates(params, update), state)``
  on GPT-2 small's parameters (``communication_table.gpt2_small_shapes``, 124M), as
  abstract arrays (``jax.ShapeDtypeStruct``: nothing is allocated), r = 192, K = 16,
  LoRDO's low-rank matrices the paper's (every 2-D leaf but the embeddings);
* ``lm``: the training step of ``examples/lm`` (``train.make_step``: forward, backward,
  ``tx.update``, ``apply_updates``) at the example's default ``small`` preset, the methods
  as ``optimizers.get_optimizer`` builds them (rank d / 4).

The methods: ``optax.adamw`` (each worker alone, nothing sent), ``lordo_jax.ddp`` (AdamW
on the averaged gradient), ``lordo_jax.diloco``, ``lordo_jax.lordo`` (one program: the
round's sync decided on the device) and LoRDO's local program (``round_phase="local"``:
the local step alone, which is what the round's ``lax.cond`` adds to).

Each program is traced (``jax.jit(...).trace``), lowered and compiled by XLA, each stage
timed with ``time.perf_counter``; the persistent compilation cache is off and every round
builds its functions anew, so each compile is a real one. The rounds take the programs
in turn (``--repeats``, default 3); a compile is the same work every time and another
process's load only adds to it, so the table gives each program's fastest compile (the
split into stages of that one) and its ratio to AdamW's in the same run; the JSON keeps
every compile's time. It also counts the
compiled program's HLO instructions and conditionals, which is what compile time grows
with.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # Before NumPy loads; see step_speed.py.

import pathlib  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks.*

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_enable_compilation_cache", False)  # Every compile a real one.

import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import lordo_jax  # noqa: E402
from benchmarks.communication import communication_table as table  # noqa: E402
from benchmarks.harness import studies  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))

from lm import model  # noqa: E402
from lm import optimizers  # noqa: E402
from lm import train  # noqa: E402

WORKERS = 8
AXIS = train.AXIS
LEARNING_RATE = 1e-3
METHODS = ("adamw", "ddp", "diloco", "lordo", "lordo, local program")
FULL = dict(shapes=table.gpt2_small_shapes(), rank=table.RANK, period=table.K, lm="small")
QUICK = dict(shapes=table.gpt2_shapes(2, 64, vocab=512, context=128), rank=16, period=4, lm="tiny")


def optimizer_of(method: str, rank: int, period: int, labels=None):
  """``(transformation, extra update keywords)`` of ``method`` on the worker axis."""
  low_rank = dict(rank=rank, sync_every=period, axis_name=AXIS, low_rank_labels=labels)
  if method == "adamw":
    return optax.adamw(LEARNING_RATE), {}
  if method == "ddp":
    return lordo_jax.ddp(LEARNING_RATE, axis_name=AXIS), {}
  if method == "diloco":
    return lordo_jax.diloco(LEARNING_RATE, sync_every=period, axis_name=AXIS), {}
  phase = {"round_phase": "local"} if method == "lordo, local program" else {}
  return lordo_jax.lordo(LEARNING_RATE, **low_rank), phase


def stacked(tree, mesh):
  """Abstract arrays of ``tree`` with a leading worker axis, split over the workers."""
  split = jax.sharding.NamedSharding(mesh, P(AXIS))
  return jax.tree.map(
    lambda x: jax.ShapeDtypeStruct((WORKERS, *x.shape), x.dtype, sharding=split), tree
  )


def optimizer_program(method: str, config: dict):
  """``(jitted step, abstract arguments)`` of ``method``'s optimizer step."""
  shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.float32), config["shapes"])
  tx, extra = optimizer_of(method, config["rank"], config["period"], table.no_embeddings)
  state = jax.eval_shape(tx.init, shapes)
  mesh = jax.make_mesh((WORKERS,), (AXIS,))

  def worker(params, state, grads):
    params, state, grads = jax.tree.map(lambda x: x[0], (params, state, grads))
    updates, state = tx.update(grads, state, params, **extra)
    return jax.tree.map(lambda x: x[None], (optax.apply_updates(params, updates), state))

  step = jax.jit(jax.shard_map(worker, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS)))
  return step, (stacked(shapes, mesh), stacked(state, mesh), stacked(shapes, mesh))


def lm_program(method: str, config: dict):
  """``(jitted step, abstract arguments)`` of ``method``'s LM training step."""
  model_config = model.PRESETS[config["lm"]]
  apply, _ = model.init(model_config, 0)
  params = model.param_shapes(model_config)
  name = {"adamw": "ddp", "lordo, local program": "lordo"}.get(method, method)
  tx = optimizers.get_optimizer(
    name,
    learning_rate=LEARNING_RATE,
    axis_name=AXIS,
    rank=model_config.d_model // 4,
    sync_every=config["period"],
    refresh_every=config["period"],
  )
  tx = optax.adamw(LEARNING_RATE) if method == "adamw" else tx
  phase = ("round_phase", "local") if method == "lordo, local program" else None
  mesh = train.make_mesh(WORKERS)
  state = jax.eval_shape(tx.init, params)
  step = train.make_step(apply, tx, mesh, jax.tree.map(lambda _: P(AXIS), state), phase=phase)
  batch = jax.ShapeDtypeStruct(
    (WORKERS, 16, model_config.seq_len + 1),
    jnp.int32,
    sharding=jax.sharding.NamedSharding(mesh, P(AXIS, train.DATA_AXIS)),
  )
  return step, (stacked(params, mesh), stacked(state, mesh), batch)


PROGRAMS = {"optimizer": optimizer_program, "lm": lm_program}


def instructions(hlo_text: str) -> dict[str, int]:
  """The compiled program's HLO instructions and its conditionals (``lax.cond``)."""
  lines = [line for line in hlo_text.splitlines() if " = " in line and "ENTRY" not in line]
  return {
    "instructions": len(lines),
    "conditionals": sum(bool(re.search(r"\bconditional\(", line)) for line in lines),
  }


def compiled_once(section: str, method: str, config: dict) -> dict:
  """Seconds to trace, lower and compile ``method``'s ``section`` program, built anew.

  The program is never run (its arguments are abstract, :func:`stacked`): no collective
  executes, so jaxlib 0.10's CPU deadlock of several multi-device executions in flight
  at once cannot arise, and there is nothing to wait on with ``jax.block_until_ready``.
  """
  jax.clear_caches()
  step, args = PROGRAMS[section](method, config)
  tic = time.perf_counter()
  traced = step.trace(*args)
  traced_at = time.perf_counter()
  lowered = traced.lower()
  lowered_at = time.perf_counter()
  compiled = lowered.compile()
  done = time.perf_counter()
  seconds = dict(trace=traced_at - tic, lower=lowered_at - traced_at, compile=done - lowered_at)
  return {"seconds": seconds, **instructions(compiled.as_text())}


def measure(config: dict, repeats: int) -> dict:
  """Every section's programs, compiled ``repeats`` times, the methods taking turns."""
  runs = {(s, m): [] for s in PROGRAMS for m in METHODS}
  order = list(runs)
  for i in range(repeats):
    shift = i % len(order)
    for section, method in order[shift:] + order[:shift]:
      run = compiled_once(section, method, config)
      print(f"{section}, {method}: {sum(run['seconds'].values()):.1f} s", flush=True)
      runs[section, method].append(run)
  rows = {}
  for (section, method), done in runs.items():
    fastest = min(done, key=lambda r: sum(r["seconds"].values()))
    seconds = dict(fastest["seconds"], total=sum(fastest["seconds"].values()))
    rows[f"{section}: {method}"] = {
      "section": section,
      "method": method,
      "seconds": seconds,
      "median_total": statistics.median(sum(r["seconds"].values()) for r in done),
      "each_total": [sum(r["seconds"].values()) for r in done],
      "instructions": done[0]["instructions"],
      "conditionals": done[0]["conditionals"],
    }
  return rows


def report(rows: dict) -> list[str]:
  header = [
    "program",
    "method",
    "trace s",
    "lower s",
    "XLA compile s",
    "total s",
    "vs AdamW",
    "HLO instructions",
    "conditionals",
  ]
  lines = []
  for row in rows.values():
    adamw = rows[f"{row['section']}: adamw"]["seconds"]["total"]
    s = row["seconds"]
    lines.append(
      [
        row["section"],
        row["method"],
        f"{s['trace']:.2f}",
        f"{s['lower']:.2f}",
        f"{s['compile']:.2f}",
        f"{s['total']:.2f}",
        f"**{s['total'] / adamw:.2f}**",
        f"{row['instructions']:,}",
        row["conditionals"],
      ]
    )
  return studies.table(header, lines, "ll" + "r" * 7)


def main(argv=None) -> int:
  def extra(parser):
    parser.add_argument("--repeats", type=int, default=None, help="rounds (default 3; quick 1)")

  args = studies.parse_args(__doc__, "tiny shapes, the LM's tiny preset, one round", argv, extra)
  config = QUICK if args.quick else FULL
  repeats = args.repeats or (1 if args.quick else 3)
  args.flags = [f"--repeats {args.repeats}"] if args.repeats else []
  rows = measure(config, repeats)
  shapes = "tiny shapes" if args.quick else "GPT-2 small's shapes (124M parameters)"
  notes = [
    f"Each program compiled {repeats} time(s), the methods in turn; the fastest. 8 workers "
    "(jax.shard_map over 8 simulated CPU devices); persistent compilation cache off.",
    f"optimizer: the update and apply_updates alone on {shapes}, r = {config['rank']}, "
    f"K = {config['period']}; lm: examples/lm's whole training step at the {config['lm']} "
    f"preset, rank d / 4, K = {config['period']}.",
    "trace: jax.jit(...).trace (Python, tracing the step into a jaxpr); lower: to StableHLO; "
    "XLA compile: the optimized executable. HLO instructions and conditionals: of the "
    "compiled program.",
    "'lordo, local program': LoRDO's update given round_phase='local' (its local steps' "
    "program, without the round's conditional); 'lordo' is the one program of every step.",
  ]
  studies.write(
    "compile_time",
    args,
    {"config": {k: v for k, v in config.items() if k != "shapes"}, "rows": rows},
    "Compile time of a step: LoRDO against AdamW, DDP and DiLoCo",
    report(rows),
    notes,
  )
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
