r"""Where a local step's time goes: each kernel of AdamW's, DDP's and LoRDO's step, profiled.

    python benchmarks/speed/step_profile.py --quick          # tiny shapes on this machine
    PYTHONPATH=. python benchmarks/speed/step_profile.py --sections optimizer,lm --out DIR  # a GPU

``device_speed.py`` times whole steps; this study says what is inside them. For each
candidate of ``device_speed.py``'s sections (the optimizer step alone on GPT-2 small's
shapes: ``optax.adamw``, ``lordo_jax.local_adam`` and ``lordo_jax.lordo`` at its default
projection, one program and with ``round_phase``; the LM's whole training step: DDP and
LoRDO, both ways; and LoRDO with ``round_phase`` grouped the other way: per matrix where
the platform batches its local step by shape (an accelerator), batched on a CPU), it
compiles the step, runs one
round of K steps, times a second, then records ``--steps`` local steps (at most
K - 1, none of them a sync; with ``--quick``, 2 layers of d = 64 and K = 4: the first
step, one timed local step and the next local step traced, no round's end) under
``jax.profiler.trace`` and reads the trace with ``jax.profiler.ProfileData``: every
event that carries an ``hlo_op`` (a GPU kernel, a CPU thunk) of the step's module.

Per candidate it reports: the untraced median wall time of a local step, the summed
kernel time and the number of kernels per step, the operations by kernel time (a
kernel inside a CUDA graph by its own name; each
with its HLO opcode, shape and the ``op_name`` JAX gave it, read from the compiled
HLO), the same time grouped by ``op_name`` and by kind (GEMM, fusion, copy,
conditional, ...); ``<out>/step_profile_<backend>.json`` and ``.md``, and each compiled
step's HLO text in ``<out>/hlo/``.

On a GPU kernels of one step run one after another on a stream, so kernel time per step
close to the wall time means the step is bound by its kernels; far below it, by launches
and the host.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # Before NumPy loads; see step_speed.py.

import collections  # noqa: E402
import contextlib  # noqa: E402
import datetime  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks.*

import jax  # noqa: E402
import optax  # noqa: E402

import lordo_jax  # noqa: E402
from benchmarks.harness import studies  # noqa: E402
from benchmarks.speed import device_speed as speed  # noqa: E402
from lordo_jax.local import _shape_groups as shape_groups  # noqa: E402

SECTIONS = ("optimizer", "lm")
STEPS = 8  # Local steps traced per candidate (K = 16: none of them a sync).
# Quick mode: device_speed.py's quick settings at 2 layers, so each of GPT-2's four matrix
# shapes has 2 matrices for a step batched by shape to group.
QUICK = dict(speed.QUICK, shapes=speed.table.gpt2_shapes(2, 64, vocab=512, context=128))
TOP = 25  # Operations listed per candidate.
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\S+(?: \S+)*?) ([\w\-]+)\(")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def parse_args(argv=None):
  def extra(parser):
    parser.add_argument("--sections", default="optimizer", help=",".join(SECTIONS))
    parser.add_argument("--dtype", default="float32", choices=speed.DTYPES)
    parser.add_argument("--lm", default=None, choices=["gpt2", "tiny", "small", "base"])
    parser.add_argument("--steps", type=int, default=STEPS, help="local steps traced")

  args = studies.parse_args(__doc__, "tiny shapes, the LM's tiny preset", argv, extra)
  args.sections = [s for s in args.sections.split(",") if s]
  unknown = sorted(set(args.sections) - set(SECTIONS))
  if unknown:
    raise SystemExit(f"--sections: unknown {unknown}; choose from {list(SECTIONS)}")
  accelerator = jax.default_backend() != "cpu"
  args.lm = args.lm or ("tiny" if args.quick else "gpt2" if accelerator else "small")
  args.flags = [f"--sections {','.join(args.sections)}", f"--dtype {args.dtype}"]
  args.flags += [f"--lm {args.lm}", f"--steps {args.steps}"]
  return args


def _batches_by_default() -> bool:
  """Whether the local step compiled for this platform (where the study runs it) is
  batched by shape group."""
  return jax.default_backend() not in shape_groups.PER_MATRIX_STEP_PLATFORMS


# LoRDO with round_phase, its local step grouped the other way from the platform's.
REGROUPED = f"{speed.PHASED}, {'per matrix' if _batches_by_default() else 'batched by shape'}"


@contextlib.contextmanager
def _other_grouping():
  """Traces made inside take the local step's other grouping, whatever they are compiled
  for (:data:`~lordo_jax.local._shape_groups.FORCED_STEP_GROUPING`, read when a step is
  traced)."""
  saved = shape_groups.FORCED_STEP_GROUPING
  shape_groups.FORCED_STEP_GROUPING = "per_matrix" if _batches_by_default() else "batched"
  try:
    yield
  finally:
    shape_groups.FORCED_STEP_GROUPING = saved


def regrouped(make, quick: bool = False) -> speed.Candidate:
  """The candidate ``make()`` builds, every program of it (those compiled at its first
  use too) traced with the other grouping. ``quick``: all but its first step's (the
  first basis, never profiled), which is then the program the ``round_phase``
  candidate's first step compiled (a hit in a persistent compilation cache)."""
  with _other_grouping():
    candidate = make()
  timed = candidate.timed
  call, calls = timed.call, [0]

  def call_regrouped(*args):
    calls[0] += 1
    if quick and calls[0] == 1:
      return call(*args)
    with _other_grouping():
      return call(*args)

  timed.call = call_regrouped
  return candidate


def optimizer_candidates(args, settings) -> dict[str, speed.Candidate]:
  """AdamW, Local Adam (LoRDO's round, full rank) and LoRDO's optimizer step alone, one
  program and with ``round_phase``."""
  rank, period = settings["rank"], settings["period"]
  params = speed.random_tree(settings["shapes"], args.dtype, 0.02, seed=0)
  grads = speed.random_tree(settings["shapes"], args.dtype, 1.0, seed=1)
  common = dict(axis_name=None, sync_every=period, weight_decay=speed.WEIGHT_DECAY)
  txs = {
    "adamw": (optax.adamw(speed.LEARNING_RATE, weight_decay=speed.WEIGHT_DECAY), None),
    "local_adam": (
      lordo_jax.local_adam(speed.LEARNING_RATE, **common),
      speed.lordo_kind(period),
    ),
    "lordo": (
      lordo_jax.lordo(
        speed.LEARNING_RATE, rank=rank, low_rank_labels=speed.table.no_embeddings, **common
      ),
      speed.lordo_kind(period),
    ),
  }
  txs[speed.PHASED] = txs[REGROUPED] = txs["lordo"]
  candidates = {}
  for name, (tx, kind) in txs.items():
    phased = name in (speed.PHASED, REGROUPED)
    make = lambda tx=tx, kind=kind, phased=phased: speed.optimizer_step(  # noqa: E731
      tx, params, grads, period, kind, phased=phased
    )
    candidates[name] = regrouped(make, args.quick) if name == REGROUPED else make()
  return candidates


def lm_candidates(args, settings) -> dict[str, speed.Candidate]:
  """The LM's whole step: DDP and LoRDO at its default projection, one program and with
  ``round_phase``."""
  config = speed.lm_config(args.lm)
  apply, params = speed.model.init(config, seed=0)
  params = speed.model.cast(params, args.dtype)
  raw, name = speed.data.load_text()
  dataset = speed.data.split(
    raw, num_workers=1, seq_len=config.seq_len, batch_size=speed.LM_BATCH, name=name
  )
  period = settings["period"]
  step = lambda method: speed.lm_step(method, None, config, apply, params, dataset, period)  # noqa: E731
  candidates = {f"lm {method}": step(method) for method in ("ddp", "lordo", speed.PHASED)}
  candidates[f"lm {REGROUPED}"] = regrouped(lambda: step(speed.PHASED), args.quick)
  return candidates


def kind_of(opcode: str, line: str) -> str:
  """A coarse class of an HLO instruction for the per-kind totals."""
  if opcode == "custom-call":
    target = re.search(r'custom_call_target="([^"]*)"', line)
    name = target.group(1) if target else ""
    return "gemm" if "gemm" in name or "matmul" in name else f"custom-call {name}"
  if opcode == "fusion":
    if "__triton_gemm" in line or "kind=kCustom" in line:
      return "gemm"
    return "fusion"
  return opcode


def instructions(hlo_text: str) -> dict[str, dict]:
  """Every instruction of a compiled HLO text: name -> opcode, shape, kind, op_name and
  source line."""
  found = {}
  for line in hlo_text.splitlines():
    match = _INSTRUCTION.match(line)
    if not match:
      continue
    name, shape, opcode = match.groups()
    op_name = _OP_NAME.search(line)
    found[name] = {
      "opcode": opcode,
      "shape": shape[:80],
      "kind": kind_of(opcode, line),
      "op_name": op_name.group(1)[-160:] if op_name else "",
    }
  return found


def traced_events(run, steps: int) -> list[tuple[str, str, float, str]]:
  """``(hlo_module, hlo_op, nanoseconds, kernel)`` of every kernel or thunk event while
  ``run`` makes ``steps`` steps under the profiler."""
  directory = tempfile.mkdtemp(prefix="step_profile_")
  with jax.profiler.trace(directory):
    for _ in range(steps):
      run()
  (path,) = glob.glob(f"{directory}/**/*.xplane.pb", recursive=True)
  profile = jax.profiler.ProfileData.from_file(path)
  device_planes = [p for p in profile.planes if p.name.startswith("/device:")]
  planes = device_planes or [p for p in profile.planes if p.name.startswith("/host:CPU")]
  events = []
  for plane in planes:
    for line in plane.lines:
      for event in line.events:
        stats = dict(event.stats)
        if "hlo_op" in stats:
          module, op = str(stats.get("hlo_module", "")), str(stats["hlo_op"])
          events.append((module, op, event.duration_ns, event.name[:120]))
  return events


def profile_of(
  name: str, candidate: speed.Candidate, steps: int, hlo_dir, quick: bool = False
) -> dict:
  """One candidate: a warm-up round, untraced local steps timed, then ``steps`` traced
  (at most K - 1: the local steps after a sync). ``quick``: the first step (the first
  basis) untimed, the second (a local step) timed, then the local steps before the
  round's end traced (at most K - 3): no round's end runs, so a candidate compiled
  with ``round_phase`` never compiles its boundary program."""
  timed = candidate.timed
  if quick:
    steps = min(steps, timed.calls - 3)
    calls, timed.calls = timed.calls, 1
    timed.round(record=False)  # Step 1: the first basis.
    timed.round(record=True)  # Step 2: a timed local step.
    timed.calls = calls
    assert steps > 0 and set(timed.seconds) == {"local"}, (name, set(timed.seconds))
  else:
    steps = min(steps, timed.calls - 1)
    timed.round(record=False)  # Steps 1..K: the first basis and the first sync.
    timed.round(record=True)  # Steps K+1..2K: the timed local steps.
  wall = timed.ms("local")
  # The next steps are local while steps < K - 2 (quick) or K (2K+1, ...).
  prepare, call = timed.prepare, timed.call
  run = lambda: jax.block_until_ready(call(*jax.block_until_ready(prepare())))  # noqa: E731
  events = traced_events(run, steps)
  hlo = candidate.compiled.as_text()
  (hlo_dir / f"{name.replace(' ', '_')}.hlo.txt").write_text(hlo)
  table = instructions(hlo)
  modules = collections.Counter(m for m, *_ in events)
  module = next((m for m, _ in modules.most_common() if m.startswith("jit_step")), None)
  module = module or (modules.most_common(1)[0][0] if modules else None)
  ops = collections.defaultdict(lambda: [0.0, 0, ""])
  for m, op, ns, kernel in events:
    if m == module:
      op = kernel if op.startswith("command_buffer") else op  # A kernel in a CUDA graph.
      ops[op][0] += ns / 1e6 / steps
      ops[op][1] += 1
      ops[op][2] = kernel
  rows = []
  for op, (ms, count, kernel) in sorted(ops.items(), key=lambda kv: -kv[1][0]):
    info = table.get(op, {"opcode": "?", "shape": "", "kind": "?", "op_name": ""})
    rows.append({"op": op, "ms": ms, "per_step": count / steps, "kernel": kernel, **info})

  def by(key):  # [(value, ms per step, kernels per step)] of rows grouped by ``key``.
    groups = collections.defaultdict(lambda: [0.0, 0.0])
    for r in rows:
      groups[r[key]][0] += r["ms"]
      groups[r[key]][1] += r["per_step"]
    return sorted(((k, ms, n) for k, (ms, n) in groups.items()), key=lambda g: -g[1])

  return {
    "name": name,
    "wall_ms": wall,
    "kernel_ms": sum(r["ms"] for r in rows),
    "kernels_per_step": sum(r["per_step"] for r in rows),
    "module": module,
    "ops": rows,
    "by_kind": by("kind"),
    "by_op_name": by("op_name"),
    "hlo_instructions": len(table),
  }


def markdown(record: dict) -> list[str]:
  lines = [f"### Where a local step's time goes ({record['device']['kind']})", ""]
  lines += [f"Command: `{record['command']}`. Date: {record['date']}.", ""]
  summary = [
    [p["name"], f"{p['wall_ms']:.3g}", f"{p['kernel_ms']:.3g}", f"{p['kernels_per_step']:.0f}"]
    for p in record["profiles"]
  ]
  lines += studies.table(["step", "wall ms", "kernel ms", "kernels per step"], summary, "lrrr")
  for p in record["profiles"]:
    lines += ["", f"#### {p['name']}: kernel ms per step by kind and by op_name", ""]
    kinds = [[k, f"{ms:.3f}", f"{n:.0f}"] for k, ms, n in p["by_kind"][:8]]
    lines += studies.table(["kind", "ms", "kernels"], kinds, "lrr")
    lines += [""]
    names = [[s or "(none)", f"{ms:.3f}", f"{n:.0f}"] for s, ms, n in p["by_op_name"][:12]]
    lines += studies.table(["op_name", "ms", "kernels"], names, "lrr")
    lines += ["", f"Top {TOP} operations:", ""]
    top = [
      [r["op"], r["kind"], f"{r['ms']:.3f}", f"{r['per_step']:.0f}", r["shape"], r["op_name"]]
      for r in p["ops"][:TOP]
    ]
    lines += studies.table(["op", "kind", "ms", "calls", "shape", "op_name"], top, "llrrll")
  return lines


def main(argv=None) -> int:
  args = parse_args(argv)
  settings = QUICK if args.quick else speed.FULL
  (args.out / "hlo").mkdir(parents=True, exist_ok=True)
  build = {"optimizer": optimizer_candidates, "lm": lm_candidates}
  profiles = []
  for section in args.sections:
    for name, candidate in build[section](args, settings).items():
      start = time.perf_counter()
      profiles.append(profile_of(name, candidate, args.steps, args.out / "hlo", args.quick))
      profiles[-1]["seconds"] = time.perf_counter() - start
      print(
        f"{name}: wall {profiles[-1]['wall_ms']:.3f} ms, kernels {profiles[-1]['kernel_ms']:.3f} "
        f"ms ({profiles[-1]['kernels_per_step']:.0f} per step)",
        flush=True,
      )
      del candidate
  record = {
    "command": studies.command("step_profile.py", args),
    "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    "machine": studies.machine(),
    "device": speed.device(),
    "dtype": args.dtype,
    "profiles": profiles,
  }
  name = f"step_profile_{jax.default_backend()}"
  (args.out / f"{name}.json").write_text(json.dumps(record, indent=1))
  text = "\n".join(markdown(record)) + "\n"
  (args.out / f"{name}.md").write_text(text)
  print(text)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
