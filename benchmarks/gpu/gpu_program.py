r"""The GPU program of each benchmark step, compiled for H100s or H200s on any machine.

    python benchmarks/gpu/gpu_program.py          # GPT-2 small's optimizer step, the LM on 8 GPUs
    python benchmarks/gpu/gpu_program.py --quick  # tiny shapes, the LM's tiny preset: ~1 minute
    python benchmarks/gpu/gpu_program.py --target h200 --lm small --sections lm

How: JAX's deviceless ahead-of-time compilation. With the ``jax-cuda12-plugin`` and
``jax-cuda12-pjrt`` wheels of the installed jax (the test extra's ``jax[cuda12-local]``:
no driver, no ``nvidia-*`` wheels) and ``JAX_PLATFORMS=cpu`` (without it the plugin's CUDA
check fails before it registers; this script sets it), ``jax.experimental.topologies``
describes N GPUs from a target description (``benchmarks/gpu/targets/<target>.txtpb``, a
``GpuTargetConfigProto``), and each step is lowered on abstract inputs sharded over a
mesh of them and compiled by XLA's GPU compiler, as it would be on the card. Nothing
runs and nothing is allocated. GEMMs get XLA's default tiles (no autotuning without a
GPU).

Programs: ``optimizer`` (one GPU, GPT-2 small's parameters as
``communication_table.gpt2_small_shapes`` gives them, every bias and norm included, r =
192, K = 16, float32; ``update`` + ``apply_updates``, params and state donated):
``optax.adamw``, ``optax.contrib.galore``, LoRDO's local step (``round_phase="local"``),
the same per matrix (the program the H100 runs timed), its boundary program
(``round_phase="boundary"``: the round with no conditional) and its one program (the
round and the first bases in conditionals: every step without a phase, the first
update's with one).
``lm`` (the example LM's step, ``examples/lm``, on ``--workers`` GPUs, one worker each):
DDP, LoRDO's local and boundary programs, and a whole round in flight
(``overlap="round"``) and ``overlap=1``'s send step for LoRDO and DiLoCo; with
``--fsdp`` N, the same overlap programs on ``workers / N`` workers of N GPUs each.
``calibration`` (one GPU): the programs of the timed rows of BENCHMARKS.md that the
present code still compiles, for the model's calibration.

Each program is compiled as the overlap guide's loop compiles it
(:func:`lordo_jax.compile_overlapped`: a message in flight is scheduled under the whole
step; any other program is compiled once, as ``jit`` does). Per program, read from what
the compiler wrote (``--xla_dump_to``: the
``*.thunk_metadata.txt`` of the module, one entry per thunk, and the optimised HLO):

* launches by kind: kernels (XLA's fusions, Triton GEMMs), GEMMs (among them: Triton
  GEMM fusions and cuBLAS calls), copies, solver calls (cuSOLVER custom calls,
  triangular solves), conditionals, loops, collectives, and the command buffers (CUDA
  graphs) that hold them; containers (a sequence, a command buffer) are not launches;
* temporaries and peak (``compiled.memory_analysis()``: arguments + outputs +
  temporaries - aliased);
* each collective's place among the forward/backward GEMMs of its computation
  (``overlap_schedule.schedule_summary``: started before the first, done after the
  last: in flight);
* a modelled time: every launch costs ``launch_us``, and every kernel
  ``max(bytes / bandwidth, flops / gemm_flops)``, its bytes the sizes of its operands
  and result and its flops ``2 * prod(result) * prod(contracting)`` of each dot it runs;
  a collective all-reduces its bytes over ``--link-gbps`` (``2 (N - 1) / N`` of them per
  GPU: a ring). ``bandwidth`` is the target's memory bandwidth times an efficiency; the
  efficiency, ``gemm_flops`` and ``launch_us`` are fitted (least squares of the log
  ratio) to the measured rows of :data:`CALIBRATION`, and the model's error on each of
  them is printed.

It writes ``<out>/gpu_program_<target>.json`` and ``.md``.
"""

import os
import sys
import tempfile

if __name__ == "__main__":  # Before JAX loads: the plugin's compiler, and where it writes.
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  DUMP = tempfile.mkdtemp(prefix="gpu_program_")
  os.environ["XLA_FLAGS"] = " ".join(
    os.environ.get("XLA_FLAGS", "").split() + [f"--xla_dump_to={DUMP}"]
  )

import collections  # noqa: E402
import contextlib  # noqa: E402
import itertools  # noqa: E402
import math  # noqa: E402
import pathlib  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402
from typing import NamedTuple  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks.*

import jax  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import lordo_jax  # noqa: E402
from benchmarks.communication import communication_table as table  # noqa: E402
from benchmarks.harness import studies  # noqa: E402
from benchmarks.overlap import overlap_schedule as schedule  # noqa: E402
from lordo_jax.local import _shape_groups as shape_groups  # noqa: E402

sys.path.insert(0, str(studies.ROOT / "examples"))
from lm import model  # noqa: E402

TARGETS = pathlib.Path(__file__).resolve().parent / "targets"
RANK, PERIOD, LEARNING_RATE, WEIGHT_DECAY = 192, 16, 1e-3, 1e-4
GPT2_LM = model.ModelConfig(d_model=768, num_layers=12, num_heads=12, seq_len=512)
LM_BATCH = 16  # Windows per worker per step (device_speed.py's).

# -- Reading what the compiler wrote ----------------------------------------------------

# Thunks that hold others (not launches themselves).
CONTAINERS = ("kSequential", "kCommandBuffer", "kWaitForStreams", "kHostSend", "kHostRecv")
LAUNCH_KINDS = ("kernels", "gemms", "copies", "solver", "conditionals", "loops", "collectives")
LAUNCH_KINDS += ("other",)
_THUNK = re.compile(r'profile_annotation: "([^"]*)"\s*(?:thunk_id: \d+\s*)?}\s*thunk_kind: "(\w+)"')
_GEMM_KERNEL = re.compile(r"gemm|matmul|cublas", re.IGNORECASE)


class Thunk(NamedTuple):
  """One thunk of a compiled GPU program: its HLO instruction and its kind."""

  name: str  # The instruction's name (profile annotation).
  kind: str  # XLA's thunk kind: kCustomKernel, kCopy, kCustomCall, kConditional...


def thunks(metadata_text: str) -> list[Thunk]:
  """Every thunk of a ``*.thunk_metadata.txt`` file, in order."""
  return [Thunk(name, kind) for name, kind in _THUNK.findall(metadata_text)]


def launch_kind(thunk: Thunk, instruction_line: str = "") -> str | None:
  """The launch kind of :data:`LAUNCH_KINDS` of ``thunk``; None for a container."""
  kind = thunk.kind
  if kind in CONTAINERS:
    return None
  if kind in ("kGemm", "kCublasLtMatmul") or (
    kind in ("kKernel", "kCustomKernel")
    and (_GEMM_KERNEL.search(thunk.name) or "__triton_gemm" in instruction_line)
  ):
    return "gemms"
  if kind in ("kKernel", "kCustomKernel"):
    return "kernels"
  if "Copy" in kind or "Memcpy" in kind or "Memset" in kind or "Memzero" in kind:
    return "copies"
  if kind in ("kCustomCall", "kTriangularSolve", "kCholesky") or "Solver" in kind:
    return "solver"
  if kind == "kConditional":
    return "conditionals"
  if kind == "kWhile":
    return "loops"
  if any(word in kind for word in ("Nccl", "AllReduce", "AllGather", "ReduceScatter", "AllToAll")):
    return "collectives" if not kind.endswith("Done") else None
  if "Collective" in kind:
    return "collectives" if not kind.endswith("Done") else None
  return "other"


_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2}
_DTYPE_BYTES |= {"s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8}
_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([\d,]*)\]")
_DEFINITION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.*?) ([a-z][\w\-]*)\((.*)$")
_CONTRACTING = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")
_CUBLAS_CONTRACTING = re.compile(r'"lhs_contracting_dimensions":\[([^\]]*)\]')


def _dims(text: str) -> tuple[int, ...]:
  return tuple(int(d) for d in text.split(",") if d)


def type_bytes(type_text: str) -> int:
  """Bytes of an HLO type (an array, or a tuple of them)."""
  total = 0
  for dtype, dims in _ARRAY.findall(type_text):
    size = _DTYPE_BYTES.get(dtype, 1 if dtype.startswith("f8") or dtype.startswith("f4") else 4)
    total += size * math.prod(_dims(dims))
  return total


class Instruction(NamedTuple):
  """An instruction of the optimised HLO, as the model reads it."""

  type_text: str  # Its result's type: an array or a tuple of them.
  opcode: str
  operands: tuple[str, ...]
  called: tuple[str, ...]  # The computations it calls (a fusion's body, a branch...).
  line: str


class Hlo(NamedTuple):
  """A compiled module's instructions by name (unique in a module) and each
  computation's instruction names."""

  instructions: dict[str, Instruction]
  computations: dict[str, list[str]]

  @classmethod
  def of(cls, hlo_text: str) -> "Hlo":
    module = schedule.parse(hlo_text)
    found, names = {}, {}
    for computation, instrs in module.computations.items():
      names[computation] = [i.name for i in instrs]
      for i in instrs:
        match = _DEFINITION.match(i.line)
        type_text = match.group(2) if match else ""
        found[i.name] = Instruction(type_text, i.opcode, i.operands, i.called, i.line)
    return cls(found, names)

  def _dot_flops(self, instruction: Instruction) -> float:
    """``2 * prod(result) * prod(lhs contracting)`` of a dot or a cuBLAS GEMM."""
    lhs = self.instructions.get(instruction.operands[0]) if instruction.operands else None
    result = _ARRAY.findall(instruction.type_text)
    match = _CONTRACTING.search(instruction.line) or _CUBLAS_CONTRACTING.search(instruction.line)
    if lhs is None or not result or match is None or not _ARRAY.findall(lhs.type_text):
      return 0.0
    lhs_shape = _dims(_ARRAY.findall(lhs.type_text)[0][1])
    contracting = [int(d.strip().strip('"')) for d in match.group(1).split(",") if d.strip()]
    return 2.0 * math.prod(_dims(result[0][1])) * math.prod(lhs_shape[d] for d in contracting)

  def flops(self, name: str) -> float:
    """The GEMM flops of the launch ``name``: its dot, or the dots of its fusion."""
    instruction = self.instructions.get(name)
    if instruction is None:
      return 0.0
    if instruction.opcode == "dot" or (
      instruction.opcode == "custom-call" and schedule._GEMM_TARGET.search(instruction.line)
    ):
      return self._dot_flops(instruction)
    if instruction.opcode != "fusion":
      return 0.0
    return sum(
      self.flops(inner)
      for computation in instruction.called
      for inner in self.computations.get(computation, ())
    )

  def collective_bytes(self) -> int:
    """Bytes the program's collectives send (their operands'), each counted once: a
    synchronous one, or the ``-start`` of an asynchronous pair (not the collective an
    ``async-start`` wraps, which jax 0.12 prints as well)."""
    wrapped = {c for i in self.instructions.values() if i.opcode == "async-start" for c in i.called}
    inside = {n for c in wrapped for n in self.computations.get(c, ())}
    kinds = set(schedule.COLLECTIVES) | {f"{c}-start" for c in schedule.COLLECTIVES}
    return sum(
      type_bytes(self.instructions[o].type_text)
      for name, i in self.instructions.items()
      if i.opcode in kinds and name not in inside
      for o in i.operands
      if o in self.instructions
    )

  def bytes(self, name: str) -> int:
    """Bytes the launch ``name`` moves: its operands' and its result's sizes."""
    instruction = self.instructions.get(name)
    if instruction is None:
      return 0
    operands = sum(
      type_bytes(self.instructions[o].type_text)
      for o in instruction.operands
      if o in self.instructions
    )
    return operands + type_bytes(instruction.type_text)


# -- The target and the programs ---------------------------------------------------------


def target_config(target: str) -> str:
  """The ``GpuTargetConfigProto`` text of ``benchmarks/gpu/targets/<target>.txtpb``."""
  path = TARGETS / f"{target}.txtpb"
  if not path.exists():
    known = sorted(p.stem for p in TARGETS.glob("*.txtpb"))
    raise SystemExit(f"--target {target}: no {path}; choose from {known}")
  return path.read_text()


def target_numbers(config: str) -> dict:
  """The description's memory bandwidth (bytes/s) and size, and its device name."""
  number = lambda key: float(re.search(rf"{key}: (\d+)", config).group(1))  # noqa: E731
  return {
    "device": re.search(r'device_description_str: "([^"]*)"', config).group(1),
    "memory_bandwidth": number("memory_bandwidth"),
    "device_memory_size": number("device_memory_size"),
  }


def gpu_mesh(config: str, shape: tuple[int, ...], names: tuple[str, ...], auto: bool = False):
  """A mesh of ``prod(shape)`` GPUs of one host, from the target description (no GPU
  needed): its devices are the topology's, compiled for, never run on. ``auto``: every
  axis ``Auto`` (as the example's FSDP mesh), else ``jax.make_mesh``'s default."""
  from jax.experimental import topologies

  try:
    topology = topologies.get_topology_desc(
      platform="cuda", target_config=config, topology=f"1x1x{math.prod(shape)}"
    )
  except Exception as error:  # The plugin missing, or not registered.
    raise SystemExit(
      f"gpu_program.py: no CUDA compiler here ({error}). Install the plugin of this jax "
      "(pip install -e '.[test]' brings jax[cuda12-local]) and run with JAX_PLATFORMS=cpu "
      "on a machine without a GPU."
    ) from error
  mesh = topologies.make_mesh(topology, shape, names)
  if not auto:
    return jax.make_mesh(shape, names, devices=mesh.devices.flatten().tolist())
  axis_types = (jax.sharding.AxisType.Auto,) * len(shape)
  return jax.sharding.Mesh(mesh.devices, names, axis_types=axis_types)


class Program(NamedTuple):
  """A step to compile: its name, the jitted function, its abstract arguments, and the
  local step's grouping forced while it is traced (``None``: the target's)."""

  name: str
  section: str
  step: object
  args: tuple
  grouping: str | None = None
  workers: int = 1  # The workers its collectives average over.


def _placed(tree, sharding):
  return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), tree)


def _optimizer_step(name, tx, shapes, sharding, grouping=None, **extra) -> Program:
  """``update`` + ``apply_updates`` of ``tx`` on ``shapes``, params and state donated."""
  state = jax.eval_shape(tx.init, shapes)

  def step(params, state, grads):
    updates, state = tx.update(grads, state, params, **extra)
    return optax.apply_updates(params, updates), state

  args = (_placed(shapes, sharding), _placed(state, sharding), _placed(shapes, sharding))
  return Program(name, "optimizer", jax.jit(step, donate_argnums=(0, 1)), args, grouping)


@contextlib.contextmanager
def _grouping(grouping: str | None):
  """Traces made inside take the local step's ``grouping`` (``"per_matrix"`` or
  ``"batched"``; ``None``: the target platform's), as ``shape_groups.FORCED_STEP_GROUPING``
  says."""
  saved = shape_groups.FORCED_STEP_GROUPING
  shape_groups.FORCED_STEP_GROUPING = grouping
  try:
    yield
  finally:
    shape_groups.FORCED_STEP_GROUPING = saved


def optimizer_programs(config: str, quick: bool, calibration: bool = False) -> list[Program]:
  """The optimizer step on one GPU (``quick``: two layers of d = 64, r = 8)."""
  sharding = NamedSharding(gpu_mesh(config, (1,), ("gpu",)), P())
  if quick:
    shapes, rank = table.gpt2_shapes(2, 64, 256, 64), 8
  else:
    shapes, rank = table.gpt2_small_shapes(), RANK
  lordo = lordo_jax.lordo(
    LEARNING_RATE,
    axis_name=None,
    rank=rank,
    sync_every=PERIOD,
    weight_decay=WEIGHT_DECAY,
    low_rank_labels=table.no_embeddings,
  )
  adamw = optax.adamw(LEARNING_RATE, weight_decay=WEIGHT_DECAY)
  adamw = _optimizer_step("adamw", adamw, shapes, sharding)
  per_matrix = _optimizer_step(
    "lordo local, per matrix", lordo, shapes, sharding, "per_matrix", round_phase="local"
  )
  if calibration:
    return [p._replace(section="calibration, one H100") for p in (adamw, per_matrix)]
  local = _optimizer_step("lordo local", lordo, shapes, sharding, round_phase="local")
  if quick:
    return [adamw, local, per_matrix]
  galore = optax.contrib.galore(
    LEARNING_RATE, rank=rank, update_proj_gap=PERIOD, weight_decay=WEIGHT_DECAY
  )
  return [
    adamw,
    _optimizer_step("galore", galore, shapes, sharding),
    local,
    per_matrix,
    _optimizer_step("lordo boundary", lordo, shapes, sharding, round_phase="boundary"),
    _optimizer_step("lordo one program", lordo, shapes, sharding),
  ]


LM_PROGRAMS = (  # (name, method, overlap, the step's static phase)
  ("ddp", "ddp", None, None),
  ("lordo local", "lordo", None, ("round_phase", "local")),
  ("lordo boundary", "lordo", None, ("round_phase", "boundary")),
  ('lordo overlap="round"', "lordo", "round", None),
  ('diloco overlap="round"', "diloco", "round", None),
  ("lordo overlap=1 send", "lordo", 1, ("overlap_phase", "send")),
  ("diloco overlap=1 send", "diloco", 1, ("overlap_phase", "send")),
)


def lm_programs(config: str, lm: str, workers: int, fsdp: int, quick: bool) -> list[Program]:
  """The example LM's step on ``workers`` GPUs (one worker each), and with ``fsdp`` > 1
  the overlap programs on ``workers / fsdp`` workers of ``fsdp`` GPUs each."""
  model_config = GPT2_LM if lm == "gpt2" else model.PRESETS[lm]
  rank = model_config.d_model // 4
  programs = []
  mesh = gpu_mesh(config, (workers, 1), (schedule.train.AXIS, schedule.train.DATA_AXIS))
  chosen = [LM_PROGRAMS[i] for i in (0, 1, 3)] if quick else LM_PROGRAMS
  for name, method, overlap, phase in chosen:
    step, args = schedule.lm_step(
      method, overlap, phase, model_config, mesh, workers, batch_size=LM_BATCH, rank=rank
    )
    programs.append(Program(f"lm {name}", f"lm, {workers} workers", step, args, workers=workers))
  if fsdp > 1:
    axes = (schedule.train.AXIS, schedule.train.DATA_AXIS, schedule.train.FSDP_AXIS)
    fsdp_mesh = gpu_mesh(config, (workers // fsdp, 1, fsdp), axes, auto=True)
    for name, method, overlap, phase in [p for p in chosen if p[2] is not None]:
      step, args = schedule.lm_step(
        method,
        overlap,
        phase,
        model_config,
        fsdp_mesh,
        workers // fsdp,
        fsdp=fsdp,
        batch_size=LM_BATCH,
        rank=rank,
      )
      section = f"lm, {workers // fsdp} workers x FSDP {fsdp}"
      programs.append(Program(f"lm fsdp {name}", section, step, args, workers=workers // fsdp))
  return programs


def calibration_programs(config: str) -> list[Program]:
  """The programs of :data:`CALIBRATION`, on one GPU."""
  programs = optimizer_programs(config, quick=False, calibration=True)
  mesh = gpu_mesh(config, (1, 1), (schedule.train.AXIS, schedule.train.DATA_AXIS))
  rank = GPT2_LM.d_model // 4
  lm = [("ddp", "ddp", None), ("lordo local, per matrix", "lordo", ("round_phase", "local"))]
  for name, method, phase in lm:
    step, args = schedule.lm_step(
      method, None, phase, GPT2_LM, mesh, 1, batch_size=LM_BATCH, rank=rank
    )
    section = "calibration, one H100"
    programs.append(Program(f"lm gpt2 {name}", section, step, args, "per_matrix"))
  return programs


# The timed rows of BENCHMARKS.md ("Speed on a GPU", H100, jax 0.11.2, 2026-11-26) whose
# program the present code still compiles: program name -> (target, ms per step, the row).
CALIBRATION = {
  "adamw": ("h100", 2.73, "AdamW's optimizer step, GPT-2 small"),
  "lordo local, per matrix": ("h100", 6.31, "LoRDO's local optimizer step, round_phase"),
  "lm gpt2 ddp": ("h100", 40.9, "the example LM's step (d = 768, 12 layers, T = 512), DDP"),
  "lm gpt2 lordo local, per matrix": ("h100", 47.1, "the same, LoRDO's local step"),
}


# -- Reading one compiled program -------------------------------------------------------


class Launch(NamedTuple):
  """One launch of a program: its kind, the bytes it moves and the GEMM flops it runs."""

  kind: str
  bytes: int
  flops: float
  collective: bool


def launches_of(metadata_text: str, hlo: Hlo) -> list[Launch]:
  """Every launch of a compiled program (containers left out)."""
  found = []
  for thunk in thunks(metadata_text):
    instruction = hlo.instructions.get(thunk.name)
    kind = launch_kind(thunk, instruction.line if instruction else "")
    if kind is None:
      continue
    found.append(Launch(kind, hlo.bytes(thunk.name), hlo.flops(thunk.name), kind == "collectives"))
  return found


def read(program: Program, dump: pathlib.Path) -> dict:
  """Compiles ``program`` as a user's loop would (:func:`lordo_jax.compile_overlapped`:
  a message in flight runs under the whole step) and reads its launches, memory and
  collectives."""
  before = set(dump.glob("*.thunk_metadata.txt"))
  tic = time.perf_counter()
  with _grouping(program.grouping):
    compiled = lordo_jax.compile_overlapped(program.step, *program.args)
  seconds = time.perf_counter() - tic
  # The module's number leads its files' names: the last compile's (compile_overlapped
  # compiles a program that sends a message in flight twice) is the highest.
  written = sorted(set(dump.glob("*.thunk_metadata.txt")) - before)
  if not written:
    raise RuntimeError(f"{program.name}: the compile wrote no thunk file under {dump}")
  written = written[-1:]
  text = compiled.as_text()
  hlo = Hlo.of(text)
  launches = launches_of(written[0].read_text(), hlo)
  memory = compiled.memory_analysis()
  peak = (
    memory.argument_size_in_bytes
    + memory.output_size_in_bytes
    + memory.temp_size_in_bytes
    - memory.alias_size_in_bytes
  )
  kinds = collections.Counter(launch.kind for launch in launches)
  metadata = written[0].read_text()
  command_buffers = len(re.findall(r'thunk_kind: "kCommandBuffer"', metadata))
  # Solver calls by operation (cholesky, triangular-solve, geqrf, svd...): their names
  # without the instruction's number.
  solver_calls = collections.Counter(
    re.sub(r"[.\d]+$", "", t.name) for t in thunks(metadata) if launch_kind(t) == "solver"
  )
  summary = schedule.schedule_summary(text)
  return {
    "name": program.name,
    "section": program.section,
    "workers": program.workers,
    "compile_s": seconds,
    "launches": len(launches),
    **{kind: kinds.get(kind, 0) for kind in LAUNCH_KINDS},
    "command_buffers": command_buffers,
    "solver_calls": dict(sorted(solver_calls.items())),
    "temp_bytes": memory.temp_size_in_bytes,
    "peak_bytes": peak,
    "kernel_bytes": sum(launch.bytes for launch in launches if not launch.collective),
    "gemm_flops": sum(launch.flops for launch in launches),
    "collective_bytes": hlo.collective_bytes(),
    "launch_costs": [[launch.bytes, launch.flops] for launch in launches if not launch.collective],
    "schedule": {k: summary[k] for k in ("gemms", "model_gemms", "asynchronous", "in_flight")}
    | {"collectives": summary["collectives"]},
  }


# -- The model ---------------------------------------------------------------------------


class Model(NamedTuple):
  """Launch-level roofline: ``efficiency`` of the target's memory bandwidth,
  ``gemm_tflops`` and ``launch_us`` per launch."""

  efficiency: float
  gemm_tflops: float
  launch_us: float

  def ms(self, record: dict, bandwidth: float, link_gbps: float, gpus: int) -> float:
    """The modelled milliseconds of one step of ``record``'s program."""
    memory = bandwidth * self.efficiency
    kernels = sum(
      max(nbytes / memory, flops / (self.gemm_tflops * 1e12))
      for nbytes, flops in record["launch_costs"]
    )
    ring = 2 * (gpus - 1) / gpus if gpus > 1 else 0.0
    collectives = ring * record["collective_bytes"] / (link_gbps * 1e9)
    return 1e3 * (kernels + collectives) + 1e-3 * self.launch_us * record["launches"]


GRID = {
  "efficiency": [0.4, 0.5, 0.6, 0.7, 0.8, 0.9],
  "gemm_tflops": [50, 100, 150, 200, 300, 400, 600],
  "launch_us": [2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14],
}


def fit(records: dict[str, dict], bandwidth: float, link_gbps: float) -> tuple[Model, list]:
  """The :class:`Model` of :data:`GRID` closest to the timed rows (least squares of
  ``log(modelled / measured)``), and each row's error."""
  rows = [(name, CALIBRATION[name][1]) for name in CALIBRATION if name in records]
  if not rows:
    raise RuntimeError("no calibration program compiled")

  def loss(candidate: Model) -> float:
    return sum(
      math.log(candidate.ms(records[name], bandwidth, link_gbps, 1) / measured) ** 2
      for name, measured in rows
    )

  best = min(itertools.starmap(Model, itertools.product(*GRID.values())), key=loss)
  errors = [
    {
      "program": name,
      "row": CALIBRATION[name][2],
      "measured_ms": measured,
      "modelled_ms": best.ms(records[name], bandwidth, link_gbps, 1),
    }
    for name, measured in rows
  ]
  return best, errors


# -- The study ---------------------------------------------------------------------------

SECTIONS = ("optimizer", "lm", "calibration")
DEFAULT_MODEL = Model(0.7, 200, 8)  # Used where no calibration program was compiled.


def options(parser) -> None:
  parser.add_argument("--target", default="h100", help="a description in benchmarks/gpu/targets/")
  parser.add_argument("--sections", default=None, help=",".join(SECTIONS))
  parser.add_argument("--workers", type=int, default=8, help="GPUs of the LM's step")
  parser.add_argument(
    "--fsdp",
    type=int,
    default=None,
    help="GPUs per worker of the FSDP programs (default 2; 1: none)",
  )
  parser.add_argument("--lm", default=None, choices=["gpt2", "tiny", "small", "base"])
  parser.add_argument(
    "--link-gbps", type=float, default=450.0, help="GB/s per GPU of the collectives' links"
  )


def _megabytes(n: int) -> str:
  return f"{n / 1e6:,.1f}"


def markdown(record: dict) -> list[str]:
  lines = []
  header = ["program", "launches", *LAUNCH_KINDS, "command buffers", "temporaries MB"]
  header += ["peak MB", "modelled ms", "compile s"]
  for section in dict.fromkeys(p["section"] for p in record["programs"]):
    rows = [
      [p["name"], p["launches"], *(p[k] for k in LAUNCH_KINDS), p["command_buffers"]]
      + [_megabytes(p["temp_bytes"]), _megabytes(p["peak_bytes"]), f"{p['modelled_ms']:.2f}"]
      + [f"{p['compile_s']:.1f}"]
      for p in record["programs"]
      if p["section"] == section
    ]
    lines += [f"#### {section}", "", *studies.table(header, rows, align="l" + "r" * 13), ""]
  collectives = [
    [p["name"], c["op"], c["group_size"] or "-"]
    + [f"{c['gemms_before']} / {c['gemms_between']} / {c['gemms_after']}"]
    + ["yes" if c["in_flight"] else "no"]
    for p in record["programs"]
    for c in p["schedule"]["collectives"]
    if c["group_size"] == p["workers"] > 1
  ]
  if collectives:
    head = ["program", "collective", "GPUs", "fwd/bwd GEMMs before / under / after", "in flight"]
    lines += ["#### The collectives between workers, among the forward/backward GEMMs", ""]
    lines += [*studies.table(head, collectives, align="lllrl"), ""]
  lines += _round_cost(record["programs"])
  m = record["model"]
  lines += [
    "#### The model",
    "",
    f"{m['efficiency']:.0%} of {record['target']['device']}'s memory bandwidth "
    f"({record['target']['memory_bandwidth'] / 1e12:.2f} TB/s), GEMMs at "
    f"{m['gemm_tflops']} TFLOP/s, {m['launch_us']} us per launch, collectives at "
    f"{record['link_gbps']:.0f} GB/s per GPU ({record['model_source']}).",
    "",
  ]
  if record["calibration"]:
    rows = [
      [e["row"], f"{e['measured_ms']:.2f}", f"{e['modelled_ms']:.2f}"]
      + [f"{100 * (e['modelled_ms'] / e['measured_ms'] - 1):+.0f}%"]
      for e in record["calibration"]
    ]
    head = ["timed row (H100)", "measured ms", "modelled ms", "error"]
    lines += studies.table(head, rows, align="lrrr")
  return lines


# (baseline, LoRDO's local step, its boundary) of a section, by program name.
ROUND_PROGRAMS = (
  ("adamw", "lordo local", "lordo boundary"),
  ("lm ddp", "lm lordo local", "lm lordo boundary"),
)


def _round_cost(programs: list[dict]) -> list[str]:
  """The modelled cost of LoRDO's round: its boundary beyond a local step (the
  refresh, the averages and the outer step: a bound on the refresh), and the step
  amortised over a round of K = :data:`PERIOD` (K - 1 local steps and a boundary)
  against the baseline's."""
  by_name = {p["name"]: p["modelled_ms"] for p in programs}
  rows = []
  for baseline, local, boundary in ROUND_PROGRAMS:
    if not {baseline, local, boundary} <= set(by_name):
      continue
    amortised = ((PERIOD - 1) * by_name[local] + by_name[boundary]) / PERIOD
    rows.append(
      [boundary, f"{by_name[boundary] - by_name[local]:.2f}", f"{amortised:.2f}"]
      + [f"{by_name[baseline]:.2f}", f"{amortised / by_name[baseline]:.2f}x"]
    )
  if not rows:
    return []
  head = ["program", "round's cost ms (boundary - local)", f"amortised ms (K = {PERIOD})"]
  head += ["baseline ms (AdamW / DDP)", "amortised / baseline"]
  return ["#### LoRDO's round, modelled", "", *studies.table(head, rows, align="lrrrr"), ""]


def main(argv=None) -> int:
  args = studies.parse_args(__doc__, "tiny shapes, the LM's tiny preset", argv, options)
  sections = args.sections or ("optimizer,lm" if args.quick else ",".join(SECTIONS))
  args.sections = [s for s in sections.split(",") if s]
  if unknown := sorted(set(args.sections) - set(SECTIONS)):
    raise SystemExit(f"--sections: unknown {unknown}; choose from {list(SECTIONS)}")
  args.fsdp = args.fsdp or (1 if args.quick else 2)
  if args.workers % args.fsdp:
    raise SystemExit(f"--fsdp {args.fsdp} does not divide --workers {args.workers}")
  args.lm = args.lm or ("tiny" if args.quick else "gpt2")
  args.flags = [f"--target {args.target}", f"--sections {','.join(args.sections)}"]
  args.flags += [f"--workers {args.workers}", f"--fsdp {args.fsdp}", f"--lm {args.lm}"]
  config = target_config(args.target)
  # Each program is read from what its compile writes: none may come from a cache.
  jax.config.update("jax_enable_compilation_cache", False)
  dump = pathlib.Path(DUMP)
  programs = []
  if "optimizer" in args.sections:
    programs += optimizer_programs(config, args.quick)
  if "lm" in args.sections:
    programs += lm_programs(config, args.lm, args.workers, args.fsdp, args.quick)
  calibrated = calibration_programs(target_config("h100")) if "calibration" in args.sections else []
  start = time.perf_counter()
  records = []
  for program in programs + calibrated:
    records.append(read(program, dump))
    print(f"{program.name}: {records[-1]['launches']} launches", flush=True)
  shutil.rmtree(dump, ignore_errors=True)
  numbers = target_numbers(config)
  by_name = {r["name"]: r for r in records[len(programs) :]}
  model_, errors, source = DEFAULT_MODEL, [], "not calibrated: no calibration section"
  if by_name:
    h100 = target_numbers(target_config("h100"))["memory_bandwidth"]
    model_, errors = fit(by_name, h100, args.link_gbps)
    source = f"fitted to {len(errors)} timed rows of an H100"
  for r in records:
    gpus = args.workers if r["section"].startswith("lm,") else 1
    r["modelled_ms"] = model_.ms(r, numbers["memory_bandwidth"], args.link_gbps, gpus)
  for r in records:
    del r["launch_costs"]
  record = {
    "target": numbers,
    "workers": args.workers,
    "fsdp": args.fsdp,
    "lm": args.lm,
    "link_gbps": args.link_gbps,
    "model": model_._asdict(),
    "model_source": source,
    "calibration": errors,
    "programs": records,
    "wall_time_s": time.perf_counter() - start,
  }
  notes = [
    "Compiled without a GPU (JAX's deviceless AOT compile, jax-cuda12 plugin); launches "
    "read from the thunk sequence XLA wrote, memory from memory_analysis().",
  ]
  args.out = args.out / f"gpu_program_{args.target}"
  studies.write(
    "gpu_program",
    args,
    record,
    f"The GPU program of each step, compiled for {numbers['device']}",
    markdown(record),
    notes,
  )
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
