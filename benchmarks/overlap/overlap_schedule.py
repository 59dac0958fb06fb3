r"""Whether the overlapped sync's collective is scheduled under the step's GEMMs on a GPU.

    # A CUDA GPU (jax[cuda]): 8 mock GPUs on the one GPU, the LM's small preset
    PYTHONPATH=. python benchmarks/overlap/overlap_schedule.py --out runs/overlap_schedule
    PYTHONPATH=. python benchmarks/overlap/overlap_schedule.py --preset base --save-hlo  # + the HLO
    python benchmarks/overlap/overlap_schedule.py --quick  # CPU: 8 simulated devices, tiny preset

Compiles (never runs) the example LM's training step (``examples/lm``: its own
``train.make_optimizer``, ``train.make_mesh`` and ``train.make_step``, one worker per
device; rank 32, 8 at the tiny preset) for 8 workers, for LoRDO and DiLoCo, four
programs each: no overlap (the blocking sync, the control), ``overlap="round"`` (its
one step program), and ``overlap=1``'s ``"send"`` program (the steps that send a chunk)
and ``"local"`` program (the control). Inputs are ``jax.ShapeDtypeStruct``\ s with the run's
``NamedSharding``\ s (``jax.eval_shape`` of the init), so nothing is allocated.

Each program's optimised HLO (``compiled.as_text()``, a scheduled module: every
computation is printed in its schedule's order) is read for every collective in the
entry computation and in the computations it calls (conditional branches, loop
bodies, command buffers): its op, its position, whether it is asynchronous (a
``-start``/``-done`` pair, or an ``async-start`` around it), the forward/backward
GEMMs (a GEMM whose ``op_name`` holds ``jvp(``) of its computation scheduled before
its start, between start and done, and after its done, and whether it is in flight
across all of them (started before the first, done after the last). A GEMM is a
``dot`` or ``convolution``, a custom call to cuBLAS (``__cublas$gemm``,
``__cublas$lt$matmul``...), or a fusion around a dot (Triton's ``__triton_gemm``, or
the CPU's dot fusions); an instruction that calls computations (a command buffer, a
loop) counts the GEMMs in them. A collective over groups of one device sends nothing
and is only counted.

On a GPU, flags are read when the backend starts, so each flag setting compiles in a
child process of its own (with ``--timeout`` seconds): XLA's default schedule, and
``--xla_gpu_enable_latency_hiding_scheduler=true``. Each child mocks 8 GPU processes of
one GPU each on the machine's first GPU, in one slice:
``jax.config.update("jax_mock_gpu_topology", "1x8x1")`` (slices x hosts per slice x
GPUs per host) with ``jax_cuda_visible_devices="0"``, so that ``jax.devices()`` lists 8
GPUs. (``mock_num_gpu_processes=8`` mocks the same 8 processes but puts each in a slice
of its own, and ``jax.make_mesh`` refuses a mesh over several slices.) Mock collectives
never run, so the child compiles with ``--xla_gpu_shard_autotuning=false``: sharded
autotuning waits forever on the other mock processes (openxla/xla#28959). This script
appends that flag to ``XLA_FLAGS`` before JAX loads, after any flags already set there.
The GPU child partitions with GSPMD (``jax_use_shardy_partitioner=False``): with jaxlib
0.11.2, Shardy crashes (a segmentation fault in its ``ManualComputationUnusedInputsPattern``)
compiling LoRDO's step for 8 devices, GPU or CPU; the step is manual over every mesh
axis, so its collectives are its own either way.

``--save-hlo`` writes every program's HLO to ``<out>/overlap_schedule_hlo.tar.gz``.
``--quick`` compiles the same programs on 8 simulated CPU devices at the ``tiny``
preset, in one child: the CPU's collectives are synchronous, so it reports where they
sit among the dots.
"""

import os
import sys

SHARD_AUTOTUNING_OFF = "--xla_gpu_shard_autotuning=false"
if __name__ == "__main__" and "--quick" not in sys.argv:  # Before JAX loads.
  flags = os.environ.get("XLA_FLAGS", "").split()
  os.environ["XLA_FLAGS"] = " ".join(
    flags + [SHARD_AUTOTUNING_OFF] * (SHARD_AUTOTUNING_OFF not in flags)
  )

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import pathlib  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import tarfile  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import NamedTuple  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks.*

import jax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import lordo_jax  # noqa: E402
from benchmarks.harness import studies  # noqa: E402

sys.path.insert(0, str(studies.ROOT / "examples"))
from lm import model  # noqa: E402
from lm import train  # noqa: E402

WORKERS = 8
# Flag settings, each compiled in a process of its own: name -> XLA flags added.
SETTINGS = {
  "default": (),
  "latency hiding": ("--xla_gpu_enable_latency_hiding_scheduler=true",),
}
PROGRAMS = (  # (name, overlap, the step's overlap_phase)
  ("no overlap", None, None),
  ('overlap="round"', "round", None),
  ("overlap=1, send", 1, "send"),
  ("overlap=1, local", 1, "local"),
)
COLLECTIVES = (
  "all-reduce",
  "all-gather",
  "all-to-all",
  "reduce-scatter",
  "collective-permute",
  "collective-broadcast",
  "ragged-all-to-all",
)

# -- Reading a scheduled HLO module ------------------------------------------------------

_COMPUTATION = re.compile(r"^(ENTRY )?%?([\w.\-]+) .*\{$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = .*?\b([a-z][\w\-]*)\((.*)$")
_CALLED = re.compile(
  r"\b(?:calls|to_apply|body|condition|true_computation|false_computation)=%?([\w.\-]+)"
)
_CALLED_LIST = re.compile(r"\b(?:branch_computations|called_computations)=\{([^}]*)\}")
_GEMM_TARGET = re.compile(r'custom_call_target="[^"]*(?:gemm|matmul)[^"]*"', re.IGNORECASE)
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_EXPLICIT_GROUP = re.compile(r"replica_groups=\{\{([\d,]*)\}")
_IOTA_GROUPS = re.compile(r"replica_groups=\[\d+,(\d+)\]<=")
_MESH_GROUPS = re.compile(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}")
_MESH_AXIS = re.compile(r"'([^']+)'=(\d+)")


class Instruction(NamedTuple):
  """One HLO instruction: its name, opcode, operand names, the computations it calls."""

  name: str
  opcode: str
  operands: tuple[str, ...]
  called: tuple[str, ...]
  line: str


class Module(NamedTuple):
  """A module's entry computation and every computation's instructions, in the order
  printed: in a scheduled module (``is_scheduled=true``), the schedule's."""

  entry: str
  computations: dict[str, list[Instruction]]


def _operands(call_text: str) -> tuple[str, ...]:
  """The operand names in the list that opens ``call_text`` (up to its ``)``): the last
  word of each top-level item, written with or without ``%`` and with or without its
  type before it."""
  depth, items, item = 1, [], ""
  for char in call_text:
    depth += {"(": 1, ")": -1}.get(char, 0)
    if depth == 0:
      break
    if char == "," and depth == 1:
      items.append(item)
      item = ""
    else:
      item += char
  items.append(item)
  return tuple(words[-1].lstrip("%") for words in (i.split() for i in items) if words)


def parse(hlo_text: str) -> Module:
  """The :class:`Module` of ``hlo_text`` (``compiled.as_text()``)."""
  computations: dict[str, list[Instruction]] = {}
  entry = current = None
  for line in hlo_text.splitlines():
    header = _COMPUTATION.match(line)
    if header and not line.startswith("HloModule"):
      current = header.group(2)
      computations[current] = []
      entry = current if header.group(1) else entry
      continue
    match = _INSTRUCTION.match(line) if current is not None else None
    if match:
      name, opcode, rest = match.groups()
      called = _CALLED.findall(line)
      for names in _CALLED_LIST.findall(line):
        called += [n.strip().lstrip("%") for n in names.split(",") if n.strip()]
      computations[current].append(Instruction(name, opcode, _operands(rest), tuple(called), line))
  if entry is None:
    raise ValueError("no ENTRY computation in the HLO text")
  return Module(entry, computations)


def _is_model(line: str) -> bool:
  """Whether ``line`` is an op of the forward or backward pass (its ``op_name`` holds
  ``jvp(``: JAX's name for the differentiated function)."""
  match = _OP_NAME.search(line)
  return bool(match) and "jvp(" in match.group(1)


def _dot_lines(module: Module, computation: str) -> list[str]:
  """The lines of the dots, convolutions and GEMM custom calls in ``computation`` and
  in the fusions it holds."""
  found = []
  for i in module.computations.get(computation, ()):
    if i.opcode in ("dot", "convolution") or (
      i.opcode == "custom-call" and _GEMM_TARGET.search(i.line)
    ):
      found.append(i.line)
    elif i.opcode == "fusion":
      found += [line for c in i.called for line in _dot_lines(module, c)]
  return found


def gemms(module: Module, instruction: Instruction) -> list[bool]:
  """One entry per GEMM that ``instruction`` runs, True for a forward/backward one.

  The instruction itself is one GEMM if it is a dot, a convolution, a GEMM custom call
  (cuBLAS) or a fusion around a dot (a Triton GEMM, a CPU dot fusion); a fusion without
  one is none; any other instruction runs the GEMMs of the computations it calls (a
  command buffer, a loop body, a conditional's branches), an asynchronous one none.
  """
  own = _dot_lines(module, instruction.called[0]) if instruction.opcode == "fusion" else []
  if own or instruction.opcode in ("dot", "convolution"):
    return [_is_model(instruction.line) or any(map(_is_model, own))]
  if instruction.opcode == "custom-call" and _GEMM_TARGET.search(instruction.line):
    return [_is_model(instruction.line)]
  if instruction.opcode == "fusion" or instruction.opcode.startswith("async-"):
    return []
  return [
    g for c in instruction.called for i in module.computations.get(c, ()) for g in gemms(module, i)
  ]


def group_size(line: str) -> int | None:
  """Devices per replica group of a collective's line (explicit ``{{0,1},{2,3}}``, iota
  ``[2,2]<=[4]``, or, from jax 0.12, a mesh and its reduced axes
  ``mesh['workers'=8,'data'=1] {'workers'}``); None where it prints none."""
  if match := _EXPLICIT_GROUP.search(line):
    return len([d for d in match.group(1).split(",") if d])
  if match := _IOTA_GROUPS.search(line):
    return int(match.group(1))
  if match := _MESH_GROUPS.search(line):
    sizes = {axis: int(size) for axis, size in _MESH_AXIS.findall(match.group(1))}
    return math.prod(sizes[axis] for axis in re.findall(r"'([^']+)'", match.group(2)))
  return None


class Collective(NamedTuple):
  """One collective of a program, placed in its computation's schedule.

  ``start`` and ``done`` are positions in that computation (equal for a synchronous
  one); the GEMM counts are of the forward/backward GEMMs of that computation (those of
  the computations its instructions call included). ``entry_position``: the position
  of the entry instruction it runs under (its own start in the entry computation).
  """

  op: str
  asynchronous: bool
  is_sync: bool  # XLA marked the pair synchronous ("is_sync":true): nothing overlaps it.
  computation: str
  nested: bool  # Not in the entry computation.
  entry_position: int
  start: int
  done: int
  group_size: int | None
  op_name: str
  gemms_before: int
  gemms_between: int
  gemms_after: int
  first_gemm: int | None  # Positions of the first and last forward/backward GEMM.
  last_gemm: int | None

  @property
  def in_flight(self) -> bool:
    """Started before its computation's first forward/backward GEMM and done after its
    last: it may run under all of them."""
    return self.asynchronous and self.gemms_before == self.gemms_after == 0 < self.gemms_between


def _wrapped_collective(module: Module, start: Instruction) -> Instruction | None:
  """The collective that an ``async-start`` runs, if it runs one."""
  for c in start.called:
    for i in module.computations.get(c, ()):
      if i.opcode in COLLECTIVES:
        return i
  return None


def _placed(module: Module, computation: str) -> list[tuple[Instruction, int, int]]:
  """``(collective, start, done)`` of every collective in ``computation``."""
  schedule = module.computations[computation]
  found, started = [], {}  # started: the name of a start (or update) -> its position
  for k, i in enumerate(schedule):
    if i.opcode in COLLECTIVES:
      found.append((i, k, k))
    elif i.opcode in (*(f"{c}-start" for c in COLLECTIVES), "async-start"):
      if i.opcode != "async-start" or _wrapped_collective(module, i) is not None:
        started[i.name] = k
    elif i.opcode == "async-update" and i.operands and i.operands[0] in started:
      started[i.name] = started[i.operands[0]]
    elif i.opcode.endswith("-done") and i.operands and i.operands[0] in started:
      first = started[i.operands[0]]
      found.append((schedule[first], first, k))
  return found


def collective_windows(module: Module) -> list[Collective]:
  """Every collective in the entry computation and in the computations it calls (not
  the insides of fusions or of asynchronous ops), in schedule order, each computation
  after its caller's."""
  windows = []

  def visit(computation: str, entry_position: int | None):
    schedule = module.computations[computation]
    counts = [gemms(module, i) for i in schedule]
    model = [sum(c) for c in counts]
    positions = [k for k, m in enumerate(model) if m]
    for i, start, done in _placed(module, computation):
      wrapped = _wrapped_collective(module, i) if i.opcode == "async-start" else i
      name = _OP_NAME.search(wrapped.line)
      windows.append(
        Collective(
          op=wrapped.opcode.removesuffix("-start"),
          asynchronous=i.opcode not in COLLECTIVES,
          is_sync='"is_sync":true' in i.line,
          computation=computation,
          nested=entry_position is not None,
          entry_position=start if entry_position is None else entry_position,
          start=start,
          done=done,
          group_size=group_size(wrapped.line),
          op_name=name.group(1) if name else "",
          gemms_before=sum(model[:start]),
          gemms_between=sum(model[start + 1 : done]),
          gemms_after=sum(model[done + 1 :]),
          first_gemm=positions[0] if positions else None,
          last_gemm=positions[-1] if positions else None,
        )
      )
    for k, i in enumerate(schedule):
      if i.opcode != "fusion" and not i.opcode.startswith("async-"):
        for c in i.called:
          if c in module.computations:
            visit(c, k if entry_position is None else entry_position)

  visit(module.entry, None)
  return windows


def schedule_summary(hlo_text: str) -> dict:
  """A program's GEMMs and collectives (:func:`collective_windows`), JSON-ready.

  ``gemms``/``model_gemms``: all GEMMs the entry computation runs and the
  forward/backward ones; ``asynchronous``, ``in_flight``, ``marked_sync`` and
  ``synchronous`` count the collectives that send (over groups of more than one
  device), ``trivial`` those that do not.
  """
  module = parse(hlo_text)
  counts = [g for i in module.computations[module.entry] for g in gemms(module, i)]
  windows = collective_windows(module)
  sending = [w for w in windows if w.group_size != 1]
  return {
    "gemms": len(counts),
    "model_gemms": sum(counts),
    "asynchronous": sum(w.asynchronous for w in sending),
    "in_flight": sum(w.in_flight for w in sending),
    "marked_sync": sum(w.asynchronous and w.is_sync for w in sending),
    "synchronous": sum(not w.asynchronous for w in sending),
    "trivial": len(windows) - len(sending),
    "collectives": [w._asdict() | {"in_flight": w.in_flight} for w in sending],
  }


# -- Compiling the example LM's step (in a child process) ---------------------------------


def lm_step(
  method: str,
  overlap,
  phase: tuple[str, str] | None,
  model_config: model.ModelConfig,
  mesh: jax.sharding.Mesh,
  workers: int,
  fsdp: int = 1,
  batch_size: int | None = None,
  rank: int | None = None,
):
  """The example LM's jitted step for ``method`` with ``overlap`` (``phase``: the step's
  static phase as ``(keyword, value)``, ``train.make_step``'s) on ``mesh`` (``train.make_mesh``'s
  axes: ``workers`` x ``data``, x ``fsdp`` when ``fsdp > 1``), and its arguments as
  ``jax.ShapeDtypeStruct`` objects with the run's shardings: ``(step, args)``; nothing is
  allocated, and ``mesh`` may be a topology's (a GPU compiled for on a CPU host).
  ``rank`` (``None``: d/4 up to 32) and ``batch_size`` windows per worker (``None``: the
  example's) as ``train.TrainConfig`` takes them."""
  rank = min(32, model_config.d_model // 4) if rank is None else rank
  batch = {} if batch_size is None else {"batch_size": batch_size}
  config = train.TrainConfig(num_workers=workers, rank=rank, overlap=overlap, fsdp=fsdp, **batch)
  tx = train.make_optimizer(method, config)
  apply, _ = model.init(model_config, 0)
  one = model.param_shapes(model_config)

  def placed(shapes, shardings):
    return jax.tree.map(
      lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
      shapes,
      shardings,
    )

  stacked = jax.eval_shape(lambda p: train.stack(p, workers), one)
  params = placed(stacked, train.param_shardings(mesh, stacked, fsdp))
  state_shardings = lordo_jax.state_sharding(tx, params, worker_axis=train.AXIS)
  state = placed(jax.eval_shape(lambda p: train.stack(tx.init(p), workers), one), state_shardings)
  batch = jax.ShapeDtypeStruct(
    (workers, config.batch_size, model_config.seq_len + 1),
    "int32",
    sharding=NamedSharding(mesh, P(train.AXIS, train.DATA_AXIS)),
  )
  layout = (
    jax.tree.map(lambda x: x.sharding, params),
    state_shardings,
    NamedSharding(mesh, P(train.AXIS)),
  )
  state_spec = jax.tree.map(lambda _: P(train.AXIS), state)
  step = train.make_step(apply, tx, mesh, state_spec, out_shardings=layout, phase=phase)
  return step, (params, state, batch)


def compiled_text(method: str, overlap, phase: str | None, preset: str) -> str:
  """The optimised HLO of the LM's step for ``method`` with ``overlap``, compiled for
  :data:`WORKERS` workers on abstract inputs (nothing is allocated)."""
  static = None if phase is None else ("overlap_phase", phase)
  step, args = lm_step(
    method, overlap, static, model.PRESETS[preset], train.make_mesh(WORKERS), WORKERS
  )
  return step.lower(*args).compile().as_text()


def compile_all(args: argparse.Namespace) -> dict:
  """The child: sets up the devices, compiles every program, reads each schedule."""
  if args.quick:
    jax.config.update("jax_num_cpu_devices", WORKERS)
  else:
    jax.config.update("jax_mock_gpu_topology", f"1x{WORKERS}x1")
    jax.config.update("jax_cuda_visible_devices", "0")
    # GSPMD: jaxlib 0.11.2's Shardy pass crashes on LoRDO's step (in
    # ManualComputationUnusedInputsPattern); the collectives are the shard_map's own.
    jax.config.update("jax_use_shardy_partitioner", False)
    if jax.default_backend() != "gpu":
      raise SystemExit(
        f"overlap_schedule.py needs a GPU (JAX with CUDA) without --quick; JAX sees "
        f"{jax.default_backend()}. Run it with --quick on a CPU."
      )
  programs = []
  for method in args.methods.split(","):
    for name, overlap, phase in PROGRAMS:
      tic = time.perf_counter()
      text = compiled_text(method, overlap, phase, args.preset)
      seconds = time.perf_counter() - tic
      if args.hlo_dir is not None:
        slug = re.sub(r"\W+", "_", f"{args.child} {method} {name}").strip("_")
        (args.hlo_dir / f"{slug}.hlo.txt").write_text(text)
      summary = schedule_summary(text)
      programs.append({"method": method, "program": name, "compile_s": seconds, **summary})
  device = jax.devices()[0]
  return {
    "setting": args.child,
    "xla_flags": os.environ.get("XLA_FLAGS", ""),
    "jax": jax.__version__,
    "backend": jax.default_backend(),
    "device_kind": device.device_kind,
    "devices": jax.device_count(),
    "processes": jax.process_count(),
    "programs": programs,
  }


# -- The parent: one child per flag setting ----------------------------------------------


def run_child(args: argparse.Namespace, setting: str, hlo_dir: pathlib.Path | None) -> dict:
  """Runs :func:`compile_all` in a process with ``setting``'s flags; its record, or the
  error it ended with."""
  flags = os.environ.get("XLA_FLAGS", "").split() + list(SETTINGS[setting])
  with tempfile.TemporaryDirectory() as scratch:
    record = pathlib.Path(scratch) / "record.json"
    argv = [sys.executable, __file__, "--child", setting, "--child-out", str(record)]
    argv += ["--preset", args.preset, "--methods", args.methods] + ["--quick"] * args.quick
    argv += ["--hlo-dir", str(hlo_dir)] if hlo_dir is not None else []
    env = dict(os.environ, XLA_FLAGS=" ".join(flags))
    tic = time.perf_counter()
    try:
      done = subprocess.run(
        argv, capture_output=True, text=True, env=env, cwd=studies.ROOT, timeout=args.timeout
      )
    except subprocess.TimeoutExpired:
      return {"setting": setting, "error": f"timed out after {args.timeout} s"}
    if done.returncode != 0:
      output = (done.stdout + done.stderr)[-3000:]
      return {"setting": setting, "error": f"exit status {done.returncode}: {output}"}
    return json.loads(record.read_text()) | {"wall_s": time.perf_counter() - tic}


def _dash(position: int | None) -> str:
  return "-" if position is None else str(position)


def _where(c: dict) -> str:
  if not c["nested"]:
    return "entry"
  return f"`{c['computation']}` (under entry {c['entry_position']})"


def markdown(runs: list[dict]) -> list[str]:
  """A summary table (a row per program and setting), then every collective."""
  header = ["method", "program", "XLA flags", "GEMMs (fwd/bwd)", "async", "in flight"]
  header += ["marked sync", "sync", "compile s"]
  rows, collectives, lines = [], [], []
  for run in runs:
    if "error" in run:
      lines.append(
        f"- {run['setting']}: failed: `{(run['error'].strip().splitlines() or [''])[-1][:300]}`"
      )
      continue
    for p in run["programs"]:
      rows.append(
        [p["method"], p["program"], run["setting"], f"{p['gemms']} ({p['model_gemms']})"]
        + [p["asynchronous"], p["in_flight"], p["marked_sync"], p["synchronous"]]
        + [f"{p['compile_s']:.1f}"]
      )
      for c in p["collectives"]:
        kind = (
          "sync" if not c["asynchronous"] else "async, marked sync" if c["is_sync"] else "async"
        )
        collectives.append(
          [p["method"], p["program"], run["setting"], c["op"], kind, _where(c)]
          + [f"{c['start']}-{c['done']}", *(_dash(c[k]) for k in ("first_gemm", "last_gemm"))]
          + [f"{c['gemms_before']} / {c['gemms_between']} / {c['gemms_after']}"]
          + ["yes" if c["in_flight"] else "no"]
        )
  kinds = sorted(
    {
      f"{r['device_kind']} ({r['backend']}, {r['devices']} devices)"
      for r in runs
      if "error" not in r
    }
  )
  table = studies.table(header, rows, align="lll" + "r" * 6)
  detail = ["method", "program", "XLA flags", "op", "kind", "where", "start-done"]
  detail += ["first GEMM", "last GEMM", "GEMMs before / between / after", "in flight"]
  lines += [""] * bool(lines)
  return [f"Device: {', '.join(kinds) or 'none'}.", "", *lines, *table, ""] + studies.table(
    detail, collectives, align="llllll" + "r" * 4 + "l"
  )


def options(parser: argparse.ArgumentParser) -> None:
  parser.add_argument(
    "--preset", default=None, help="the LM's preset (default: small; tiny with --quick)"
  )
  parser.add_argument("--methods", default="lordo,diloco", help="comma-separated methods")
  parser.add_argument(
    "--save-hlo", action="store_true", help="also <out>/overlap_schedule_hlo.tar.gz"
  )
  parser.add_argument("--timeout", type=int, default=300, help="seconds for each flag setting")
  parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
  parser.add_argument("--child-out", type=pathlib.Path, default=None, help=argparse.SUPPRESS)
  parser.add_argument("--hlo-dir", type=pathlib.Path, default=None, help=argparse.SUPPRESS)


def main(argv=None) -> int:
  args = studies.parse_args(__doc__, "8 CPU devices, the tiny preset (seconds)", argv, options)
  args.preset = args.preset or ("tiny" if args.quick else "small")
  if args.child is not None:
    args.child_out.write_text(json.dumps(compile_all(args)))
    return 0
  args.flags = [f"--preset {args.preset}"] * (args.preset != ("tiny" if args.quick else "small"))
  args.flags += [f"--methods {args.methods}"] * (args.methods != "lordo,diloco")
  args.flags += ["--save-hlo"] * args.save_hlo
  settings = ["default"] if args.quick else list(SETTINGS)
  start = time.perf_counter()
  with tempfile.TemporaryDirectory() as scratch:
    hlo_dir = pathlib.Path(scratch) if args.save_hlo else None
    runs = [run_child(args, setting, hlo_dir) for setting in settings]
    if hlo_dir is not None:
      args.out.mkdir(parents=True, exist_ok=True)
      with tarfile.open(args.out / "overlap_schedule_hlo.tar.gz", "w:gz") as archive:
        for path in sorted(hlo_dir.iterdir()):
          archive.add(path, arcname=path.name)
  record = {
    "preset": args.preset,
    "methods": args.methods.split(","),
    "workers": WORKERS,
    "runs": runs,
    "wall_time_s": time.perf_counter() - start,
  }
  notes = [
    f"The example LM's step at the {args.preset} preset for {WORKERS} workers (one per "
    + ("simulated CPU device" if args.quick else "mock GPU process")
    + "), compiled only; each program's optimised HLO read in schedule order.",
    "GEMMs: dots, convolutions, cuBLAS custom calls and fusions around a dot (Triton "
    "GEMMs), counted where they run (in a command buffer or a branch: at its call); "
    "fwd/bwd: those whose op_name holds jvp(. A collective is 'in flight' when it is "
    "asynchronous, starts before its computation's first fwd/bwd GEMM and is done after "
    "its last. 'marked sync': an async pair XLA made synchronous. Collectives over "
    "groups of one device send nothing and are left out.",
  ]
  studies.write(
    "overlap_schedule",
    args,
    record,
    "Where the sync's collectives sit in the compiled step's schedule",
    markdown(runs),
    notes,
  )
  return 1 if any("error" in run for run in runs) else 0


if __name__ == "__main__":
  raise SystemExit(main())
