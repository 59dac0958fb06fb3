r"""LoRDO's speed on the device JAX runs on: the optimizer step alone and the LM's whole step.

    python benchmarks/speed/device_speed.py           # GPT-2 small's shapes; the LM at --lm
    python benchmarks/speed/device_speed.py --quick   # tiny shapes, the LM's tiny preset: ~1 min
                                                      # (bfloat16 in the optimizer section only,
                                                      # the round-phase rows in the first dtype)
    PYTHONPATH=. python benchmarks/speed/device_speed.py --sections optimizer,lm \
      --dtypes float32,bfloat16 --out DIR       # on a GPU (jax, optax and flax suffice)

It writes ``<out>/device_speed_<backend>.json`` and ``.md`` (``device_speed_cpu``,
``device_speed_gpu``), named after the platform of ``jax.devices()[0]``, the one device
every step runs on (other devices may be present: they stay idle). The header names
the device (``device_kind``), the platform, jax and the date.

Section ``optimizer``: one jitted ``step(params, state, grads) -> (apply_updates(params,
update), new state)`` on GPT-2 small's parameters (``communication_table.gpt2_small_shapes``:
12 layers of 768 x 2304, 768 x 768, 768 x 3072 and 3072 x 768 matrices with their
biases and layer norms, the 50257 x 768 token and 1024 x 768 position embeddings;
124M parameters), params and state donated, one worker (``axis_name=None``, so no
collective runs), for

* ``optax.adamw``;
* ``optax.contrib.galore`` at rank r, ``update_proj_gap = K``: its SVD refresh runs on
  steps 1, K + 1, ...;
* ``lordo_jax.lordo(rank=r, sync_every=K, projection=p)`` for every one-sided
  projection p of ``lordo_jax.local.bases.ONE_SIDED`` (read at run time), and with
  ``offload=True`` at the default projection where the device has a ``pinned_host``
  memory space. LoRDO routes the leaves by its own rules (every 2-D leaf with
  ``min(p, q) > r``, the embeddings included, is low-rank).

r = 192 and K = 16, weight decay 1e-4 for all three, float32 and bfloat16 parameters
(the gradients in the same dtype).

Section ``lm``: the jitted training step of ``examples/lm`` (``train.make_step``:
forward, backward, ``tx.update``, ``apply_updates`` under ``jax.shard_map``, params and
state donated) on one worker (a 1 x 1 ``(workers, data)`` mesh of the first device),
16 windows per step, for ``ddp``, ``low_rank_ddp`` (refresh every T = K steps) and
``lordo`` with every one-sided projection, as ``optimizers.get_optimizer`` configures
them (rank d/4, embeddings and head full-rank), float32 and bfloat16 parameters
(``model.cast``). ``--lm gpt2`` is a GPT-2-small-sized model (d = 768, 12 layers, 12
heads, context 512, byte vocabulary: 85M parameters, r = 192); ``small`` and ``tiny``
are the example's presets. ``gpt2`` is the default on an accelerator, ``small`` on
CPU (where a ``gpt2`` step takes about a minute).

How: each candidate runs rounds of K consecutive steps, each followed by
``jax.block_until_ready`` and timed with ``time.perf_counter``; its first round is
warm-up (LoRDO's first step computes the initial bases). Then ``--repeats`` rounds,
the candidates of a section and dtype taking turns (``studies.interleave``). LoRDO's
sync steps are those ``lordo_jax.sync_steps(K, t)`` lists (t = K, 2K, ...), and the
syncs its state counted are recorded with them; GaLore's and low-rank DDP's refresh
steps are t = 1, K + 1, .... Each kind is the median over its timed steps, the amortised step
is :math:`((K - 1)\, t_\text{local} + t_\text{sync}) / K`, and every ratio is against
AdamW's (or DDP's) step measured in the same run.

Memory: the optimizer state's bytes on the device and in host memory
(``lordo_jax.state_bytes``); the compiled step's ``memory_analysis()`` (argument +
output + temp - alias bytes: its peak on the device); and where the device reports
``memory_stats()`` (GPUs, TPUs), its ``peak_bytes_in_use`` after each section and
dtype, which counts the whole process since it started (it cannot be reset).
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # Before NumPy loads; see step_speed.py.

import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import datetime  # noqa: E402
import faulthandler  # noqa: E402
import importlib.util  # noqa: E402
import io  # noqa: E402
import pathlib  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks.*

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import lordo_jax  # noqa: E402
from benchmarks.communication import communication_table as table  # noqa: E402
from benchmarks.harness import studies  # noqa: E402
from benchmarks.harness.studies import Timed  # noqa: E402
from lordo_jax.local import bases  # noqa: E402
from lordo_jax.methods import lordo as lordo_lib  # noqa: E402


def _without_progress_bars() -> None:
  """A stand-in for tqdm where it is not installed (a bare GPU image): ``examples/lm``'s
  training loop imports it for a progress bar this study never shows."""
  if importlib.util.find_spec("tqdm") is None:
    auto = types.ModuleType("tqdm.auto")
    auto.tqdm = lambda iterable=None, **_: iterable
    sys.modules.update({"tqdm": types.ModuleType("tqdm"), "tqdm.auto": auto})


_without_progress_bars()
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))

from lm import data  # noqa: E402
from lm import model  # noqa: E402
from lm import optimizers  # noqa: E402
from lm import train  # noqa: E402

SECTIONS = ("refresh", "optimizer", "lm")
DTYPES = ("float32", "bfloat16")
LEARNING_RATE = 1e-3
WEIGHT_DECAY = 1e-4  # optax.adamw's default, given to AdamW, GaLore and LoRDO alike.
LM_LEARNING_RATE = 2e-3
LM_BATCH = 16  # Windows per step.
GPT2_LM = model.ModelConfig(d_model=768, num_layers=12, num_heads=12, seq_len=512)
FULL = dict(shapes=table.gpt2_small_shapes(), rank=table.RANK, period=table.K)
# Quick mode: one layer of d = 64 (GPT-2's four matrix shapes, one matrix each).
QUICK = dict(shapes=table.gpt2_shapes(1, 64, vocab=512, context=128), rank=16, period=4)
QUICK_REPEATS = 1
# LoRDO's default and the exact one; quick mode's LoRDO rows take the first only.
QUICK_PROJECTIONS = ("subspace_iteration", "svd")
REPEATS = {"cpu": 3}  # Full mode's rounds per platform; 5 elsewhere.
WATCHDOG_S = 3600  # A section and dtype that runs longer has hung: traceback, exit.
MB = 1e6
PHASED = "lordo, round phase"  # LoRDO's local steps compiled without the round (round_phase).
PHASES = ("first", "local", "boundary")


def parse_args(argv=None):
  """The command line; ``sections``, ``dtypes``, ``lm`` and ``repeats`` resolved, and
  ``flags`` (the study's own options, for the recorded command) set."""

  def extra(parser):
    parser.add_argument("--sections", default=",".join(SECTIONS), help=",".join(SECTIONS))
    parser.add_argument(
      "--without",
      default="",
      help="optimizer-section baselines to leave out: galore, offload (a short GPU run)",
    )
    parser.add_argument(
      "--projections",
      default=None,
      help="LoRDO's one-sided projections to measure (default: all; with --quick, "
      f"{','.join(QUICK_PROJECTIONS)}, LoRDO's rows at the first only)",
    )
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="float32,bfloat16")
    parser.add_argument(
      "--lm",
      choices=("gpt2", *model.PRESETS),
      default=None,
      help="the LM's size (default: tiny with --quick, gpt2 on an accelerator, small on CPU)",
    )
    parser.add_argument(
      "--repeats", type=int, default=None, help="timed rounds per candidate (after a warm-up)"
    )

  args = studies.parse_args(
    __doc__, "tiny shapes, the LM's tiny preset, 1 round, LoRDO at one projection", argv, extra
  )
  platform = jax.devices()[0].platform
  args.sections, args.dtypes = args.sections.split(","), args.dtypes.split(",")
  default = QUICK_PROJECTIONS if args.quick else tuple(bases.ONE_SIDED)
  args.projections = args.projections.split(",") if args.projections else list(default)
  # Quick mode's LoRDO rows (optimizer and LM sections): the first projection only; its
  # refresh section compares every one.
  args.lordo_projections = args.projections[:1] if args.quick else args.projections
  args.without = [w for w in args.without.split(",") if w]
  if not set(args.without) <= {"galore", "offload"}:
    raise SystemExit(f"--without {','.join(args.without)}: choose among galore,offload")
  for name, known in (("sections", SECTIONS), ("dtypes", DTYPES), ("projections", bases.ONE_SIDED)):
    if not set(getattr(args, name)) <= set(known):
      raise SystemExit(f"--{name} {','.join(getattr(args, name))}: choose among {','.join(known)}")
  if args.lm is None:
    args.lm = "tiny" if args.quick else ("small" if platform == "cpu" else "gpt2")
  if args.repeats is None:
    args.repeats = QUICK_REPEATS if args.quick else REPEATS.get(platform, 5)
  args.flags = [
    f"--sections {','.join(args.sections)}",
    f"--projections {','.join(args.projections)}",
    *([f"--without {','.join(args.without)}"] if args.without else []),
    f"--dtypes {','.join(args.dtypes)}",
    f"--lm {args.lm}",
    f"--repeats {args.repeats}",
  ]
  return args


def device() -> dict:
  """The device every step runs on: ``jax.devices()[0]``."""
  first = jax.devices()[0]
  memories = sorted(m.kind for m in first.addressable_memories())
  return {
    "kind": first.device_kind,
    "platform": first.platform,
    "visible": jax.device_count(),
    "memories": memories,
    "reports_memory_stats": first.memory_stats() is not None,
  }


def lordo_kind(period: int):
  """LoRDO's step t (from 1) is a sync where the library says a round ends: t = K, 2K, ...."""
  return lambda t: "sync" if lordo_jax.sync_steps(period, t)[-1:] == [t] else "local"


def refresh_kind(period: int):
  """GaLore's and low-rank DDP's step t refreshes the bases: t = 1, K + 1, ...."""
  return lambda t: "sync" if t % period == 1 % period else "local"


def every_step_local(t: int) -> str:
  return "local"


def own_buffers(tree):
  """A copy of every array of ``tree``, in the same memory (device or host): a buffer
  can be donated only once per call, and LoRDO's state holds its params (the anchor)."""
  return jax.tree.map(lambda x: jax.device_put(x, x.sharding, may_alias=False), tree)


def compiled_memory(compiled) -> dict | None:
  """The compiled step's ``memory_analysis()`` in bytes, with ``peak`` = argument +
  output + temp - alias (None where the backend gives no analysis or a field)."""
  analysis = compiled.memory_analysis()
  if analysis is None:
    return None
  fields = ("argument", "output", "alias", "temp", "host_argument", "host_output", "host_temp")
  sizes = {f: getattr(analysis, f"{f}_size_in_bytes", None) for f in fields}
  parts = [sizes[f] for f in ("argument", "output", "temp", "alias")]
  sizes["peak"] = None if None in parts else parts[0] + parts[1] + parts[2] - parts[3]
  sizes["xla_peak"] = getattr(analysis, "peak_memory_in_bytes", None)  # XLA's own figure.
  return sizes


def process_peak() -> int | None:
  """The device's ``peak_bytes_in_use`` since the process started; None where the
  device reports no ``memory_stats()`` (CPU)."""
  stats = jax.devices()[0].memory_stats()
  return None if stats is None else stats.get("peak_bytes_in_use")


def compiled_timed(jitted, *args):
  """``(compiled, seconds)``: ``jitted`` lowered and compiled for ``args``, and how long
  that took."""
  start = time.perf_counter()
  compiled = jitted.lower(*args).compile()
  return compiled, time.perf_counter() - start


class Candidate:
  """A timed step and what it holds: ``carry`` (params, state), its compiled program's
  memory and compile time, and its state's bytes."""

  def __init__(self, call, carry, compiled, compile_s: float, period: int, kind, prepare=tuple):
    self.timed = Timed(call, period, kind or every_step_local, prepare)
    self.carry = carry
    sizes = lordo_jax.state_bytes(carry[1])
    self.state_bytes = {"device": sizes["device"], "host": sizes["host"]}
    self.memory, self.compile_s = compiled_memory(compiled), compile_s
    self.compiled = compiled  # Its HLO for step_profile.py.

  def syncs(self) -> int | None:
    """Syncs its state counted (``SynchronizeState.syncs``); None without a round."""
    is_round = lambda x: isinstance(x, lordo_jax.SynchronizeState)  # noqa: E731
    rounds = [x for x in jax.tree.leaves(self.carry[1], is_leaf=is_round) if is_round(x)]
    return int(np.asarray(rounds[0].syncs).max()) if rounds else None  # No compiled op.

  def finite(self) -> bool:
    """Whether every parameter is finite after all its steps (read on the host: no
    small program compiled per leaf shape)."""
    return all(bool(np.isfinite(np.asarray(x)).all()) for x in jax.tree.leaves(self.carry[0]))


def random_tree(shapes, dtype: str, scale: float, seed: int):
  """Arrays of ``shapes``: ``scale`` times standard normal, in ``dtype``."""
  leaves, treedef = jax.tree.flatten(shapes)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  arrays = [
    (scale * jax.random.normal(k, x.shape)).astype(dtype) for k, x in zip(keys, leaves, strict=True)
  ]
  return jax.tree.unflatten(treedef, arrays)


def default_projection() -> str:
  """``lordo``'s projection when none is given (one-sided)."""
  return lordo_lib.with_projection({})["projection"]


def offload_skipped() -> str | None:
  """Why ``offload=True`` cannot run here, or None."""
  if "pinned_host" in device()["memories"]:
    return None
  return f"offload skipped: {jax.devices()[0].device_kind} has no pinned_host memory space"


def optimizers_of(
  rank: int, period: int, projections, without=(), phased=True
) -> dict[tuple, tuple]:
  """(method, projection, offload) -> (transformation, kind of step t) of the section;
  :data:`PHASED` where ``phased``."""
  common = dict(axis_name=None, rank=rank, sync_every=period, weight_decay=WEIGHT_DECAY)
  common["low_rank_labels"] = table.no_embeddings  # The block matrices, as in the paper.
  out = {
    ("adamw", None, False): (optax.adamw(LEARNING_RATE, weight_decay=WEIGHT_DECAY), None),
    ("galore", None, False): (
      optax.contrib.galore(
        LEARNING_RATE, rank=rank, update_proj_gap=period, weight_decay=WEIGHT_DECAY
      ),
      refresh_kind(period),
    ),
  }
  for projection in projections:
    tx = lordo_jax.lordo(LEARNING_RATE, projection=projection, **common)
    out["lordo", projection, False] = (tx, lordo_kind(period))
  if phased and default_projection() in projections:
    tx = lordo_jax.lordo(LEARNING_RATE, **common)
    out[PHASED, default_projection(), False] = (tx, lordo_kind(period))
  if "galore" in without:
    del out["galore", None, False]
  if offload_skipped() is None and "offload" not in without:
    tx = lordo_jax.lordo(LEARNING_RATE, offload=True, **common)
    out["lordo", default_projection(), True] = (tx, lordo_kind(period))
  return out


def optimizer_step(tx, params, grads, period: int, kind, phased: bool = False) -> Candidate:
  """One jitted step of ``tx`` on its own copy of ``params``, params and state donated;
  ``phased``: two programs, each update taking ``lordo_jax.round_phase``'s (the local
  one measured for memory and compile time, the other compiled at its first use)."""
  carry = [own_buffers(params), own_buffers(tx.init(params))]

  def step(params, state, grads, phase):
    extra = {} if phase is None else {"round_phase": phase}
    updates, state = tx.update(grads, state, params, **extra)
    return optax.apply_updates(params, updates), state

  jitted = jax.jit(step, donate_argnums=(0, 1), static_argnums=3)
  first = "local" if phased else None
  compiled, seconds = compiled_timed(jitted, *carry, grads, first)
  programs, done = {first: compiled}, [0]

  def call():
    phase = lordo_jax.round_phase(done[0], sync_every=period) if phased else None
    if phase not in programs:
      programs[phase] = jitted.lower(*carry, grads, phase).compile()
    carry[:] = programs[phase](*carry, grads)
    done[0] += 1
    return carry

  return Candidate(call, carry, compiled, seconds, period, kind)


def optimizer_section(dtype: str, shapes, rank, period, projections, without=(), phased=True):
  """Every optimizer's step on ``shapes`` in ``dtype`` (gradients in it too)."""
  params = random_tree(shapes, dtype, 0.02, seed=0)
  grads = random_tree(shapes, dtype, 1.0, seed=1)
  return {
    key: optimizer_step(tx, params, grads, period, kind, phased=key[0] == PHASED)
    for key, (tx, kind) in optimizers_of(rank, period, projections, without, phased).items()
  }


def block_matrices(shapes) -> dict:
  """The low-rank matrices of the paper's routing (every 2-D leaf but the embeddings),
  flat, by path."""
  labels = jax.tree.leaves(table.no_embeddings(shapes))
  paths = jax.tree_util.tree_leaves_with_path(shapes)
  return {jax.tree_util.keystr(k): x for (k, x), low in zip(paths, labels, strict=True) if low}


def refresh_of(projection: str, matrices: dict, rank: int) -> Candidate:
  """One refresh of every matrix's basis from a new matrix of the same shapes, as a
  sync does (``LowRankAdam.refresh``: the bases, batched per shape, and the moments
  rotated into them), the state donated."""
  tx = lordo_jax.scale_by_low_rank_adam(rank, projection=projection, transport="rotate")
  first = jax.jit(lambda state, source: tx.refresh(state, source, first=True))
  state = first(tx.init(matrices), matrices)  # A basis to start from.
  sources = [random_tree(matrices, "float32", 1.0, seed=2 + i) for i in range(2)]
  carry = [own_buffers(state)]
  refresh = jax.jit(lambda state, source: tx.refresh(state, source), donate_argnums=0)
  compiled, seconds = compiled_timed(refresh, carry[0], sources[0])
  turn = [0]

  def call():
    turn[0] += 1
    carry[0] = compiled(carry[0], sources[turn[0] % 2])
    return carry

  return Candidate(call, [matrices, carry[0]], compiled, seconds, 1, None)  # One per round.


# The solver library's calls of each factorisation: LAPACK's on a CPU, cuSOLVER's and
# cuBLAS's on a GPU (the custom-call targets name the routine).
SOLVER_TARGETS = {
  "cholesky": ("potrf", "cholesky"),
  "triangular_solve": ("trsm", "triangularSolve"),
  "qr": ("geqrf",),
  "svd": ("gesdd", "gesvd"),
  "eigh": ("syevd", "heevd", "syev"),
}


def solver_calls(hlo_text: str) -> dict[str, int]:
  """The solver calls of a compiled program, by factorisation (:data:`SOLVER_TARGETS`):
  each call site once, whatever the batch of matrices it takes (a call in a
  conditional's branch, such as a fallback, included). On the CPU of jaxlib before
  0.12 a batched call is a loop of one-matrix calls around one site."""
  targets = re.findall(r'custom_call_target="([^"]+)"', hlo_text)
  return {
    kind: sum(any(name in target for name in names) for target in targets)
    for kind, names in SOLVER_TARGETS.items()
  }


def refresh_section(dtype: str, shapes, rank, period, projections) -> dict[tuple, Candidate]:
  """Every projection's refresh of the block matrices (in float32 whatever ``dtype``:
  a refresh casts its matrices), one call per round."""
  del period
  matrices = random_tree(block_matrices(shapes), dtype, 1.0, seed=0)
  return {("refresh", p, False): refresh_of(p, matrices, rank) for p in projections}


def lm_config(name: str) -> model.ModelConfig:
  return GPT2_LM if name == "gpt2" else model.PRESETS[name]


def lm_methods(projections, phased=True) -> list[tuple[str, str | None]]:
  """(method, projection) of the LM section; :data:`PHASED` where ``phased``."""
  phased = (
    [(PHASED, default_projection())] if phased and default_projection() in projections else []
  )
  return [("ddp", None), ("low_rank_ddp", None)] + [("lordo", p) for p in projections] + phased


def one_worker_mesh() -> jax.sharding.Mesh:
  """The example's ``(workers, data)`` mesh over the first device alone."""
  return jax.make_mesh((1, 1), (train.AXIS, train.DATA_AXIS), devices=jax.devices()[:1])


def lm_optimizer(method: str, projection, config: model.ModelConfig, period: int):
  """The optimizer :func:`lm_step` trains ``method`` (``"lordo"`` for :data:`PHASED`)
  with."""
  return optimizers.get_optimizer(
    method,
    learning_rate=LM_LEARNING_RATE,
    axis_name=train.AXIS,
    rank=config.d_model // 4,
    sync_every=period,
    refresh_every=period,
    extra_options=None if projection is None else {"projection": projection},
  )


def lm_step(method, projection, config, apply, params, dataset, period: int) -> Candidate:
  """``method``'s training step of ``examples/lm`` on one worker, compiled once (twice
  for :data:`PHASED`: its local and boundary programs, the second at its first use)."""
  phased = method == PHASED
  method = "lordo" if phased else method
  tx = lm_optimizer(method, projection, config, period)
  mesh = one_worker_mesh()
  worker = NamedSharding(mesh, P(train.AXIS))
  carry = [jax.device_put(train.stack(x, 1), worker) for x in (params, tx.init(params))]
  spec = jax.tree.map(lambda _: P(train.AXIS), carry[1])
  steps = {None: train.make_step(apply, tx, mesh, spec)}
  if phased:
    steps = {p: train.make_step(apply, tx, mesh, spec, phase=("round_phase", p)) for p in PHASES}
  batches = data.Batches(dataset, seq_len=config.seq_len, batch_size=LM_BATCH, seed=0)
  batch_sharding = NamedSharding(mesh, P(train.AXIS, train.DATA_AXIS))

  def prepare():  # The next batch, on the device before the timer starts.
    return (jax.device_put(batches(), batch_sharding),)

  first = "local" if phased else None
  compiled, seconds = compiled_timed(steps[first], *carry, *prepare())
  programs, done = {first: compiled}, [0]

  def call(batch):
    phase = lordo_jax.round_phase(done[0], sync_every=period) if phased else None
    program = programs.get(phase) or steps[phase]
    carry[0], carry[1], loss = program(carry[0], carry[1], batch)
    done[0] += 1
    return carry, loss

  kind = {"lordo": lordo_kind(period), "low_rank_ddp": refresh_kind(period)}.get(method)
  return Candidate(call, carry, compiled, seconds, period, kind, prepare)


def lm_section(
  dtype: str, config: model.ModelConfig, period, projections, phased=True
) -> dict[tuple, Candidate]:
  """Every method's LM training step with ``dtype`` parameters."""
  apply, params = model.init(config, seed=0)
  params = model.cast(params, dtype)
  raw, name = data.load_text()
  dataset = data.split(raw, num_workers=1, seq_len=config.seq_len, batch_size=LM_BATCH, name=name)
  return {
    (method, projection, False): lm_step(method, projection, config, apply, params, dataset, period)
    for method, projection in lm_methods(projections, phased)
  }


def rows_of(candidates: dict, section: str, dtype: str, period: int) -> list[dict]:
  """One row per candidate, its ratios against the first candidate's (AdamW's, DDP's)
  local step in the same run."""
  baseline_key = next(iter(candidates))
  baseline = candidates[baseline_key].timed.ms()
  rows = []
  for (method, projection, offload), candidate in candidates.items():
    timed = candidate.timed
    local = timed.ms()
    sync = timed.ms("sync") if timed.seconds.get("sync") else local
    ms = {"local": local, "sync": sync, "amortised": studies.amortised(local, sync, period)}
    rows.append(
      {
        "section": section,
        "dtype": dtype,
        "method": method,
        "projection": projection,
        "offload": offload,
        "ms": ms,
        "baseline": baseline_key[0],
        "baseline_ms": baseline,
        "vs_baseline": {k: v / baseline for k, v in ms.items()},
        "sync_over_local": sync / local,
        "state_bytes": candidate.state_bytes,
        "compiled_memory": candidate.memory,
        "samples": {k: len(v) for k, v in timed.seconds.items()},
        "syncs": candidate.syncs(),
        "finite": candidate.finite(),
        "compile_s": candidate.compile_s,
        "solver_calls": solver_calls(candidate.compiled.as_text())
        if section == "refresh"
        else None,
      }
    )
  return rows


def section_dtypes(section: str, args) -> list[str]:
  """The dtypes ``section`` is measured in: every one of ``--dtypes``; with ``--quick``
  the refresh and the LM in the first only (each program compiled costs the suite that
  runs the quick mode), the optimizer section in every one (its bfloat16 rows, offloaded
  and not, are the states the float32 ones are compared with)."""
  return args.dtypes if not args.quick or section == "optimizer" else args.dtypes[:1]


def measure(section: str, dtype: str, args, settings: dict) -> tuple[list[dict], dict]:
  """(rows, block) of one section and dtype; the block has its wall time and the
  process's peak device memory after it. A block running past :data:`WATCHDOG_S` has
  hung: every thread's traceback is printed and the process exits."""
  start = time.perf_counter()
  faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
  phased = not args.quick or dtype == args.dtypes[0]  # Quick mode: in the first dtype only.
  if section == "lm":
    config = lm_config(args.lm)
    candidates = lm_section(dtype, config, settings["period"], args.lordo_projections, phased)
  elif section == "optimizer":
    projections, without = args.lordo_projections, args.without
    candidates = optimizer_section(
      dtype, **settings, projections=projections, without=without, phased=phased
    )
  else:
    candidates = refresh_section(dtype, **settings, projections=args.projections)
  compiled = time.perf_counter() - start
  print(f"{section}, {dtype}: {len(candidates)} steps compiled in {compiled:.0f} s", flush=True)
  studies.interleave([c.timed for c in candidates.values()], args.repeats)
  rows = rows_of(candidates, section, dtype, settings["period"])
  faulthandler.cancel_dump_traceback_later()
  block = {
    "section": section,
    "dtype": dtype,
    "process_peak_bytes": process_peak(),
    "wall_time_s": time.perf_counter() - start,
  }
  return rows, block


def label(row: dict) -> str:
  name = row["method"] + (f" {row['projection']}" if row["projection"] else "")
  return name + (" + offload" if row["offload"] else "")


def milliseconds(x: float) -> str:
  return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def megabytes(x: int | None) -> str:
  return "n/a" if x is None else f"{x / MB:.1f}"


def refresh_table(rows: list[dict]) -> list[str]:
  body = [
    [
      row["dtype"],
      row["projection"],
      milliseconds(row["ms"]["local"]),
      f"**{row['vs_baseline']['local']:.3f}**",
      megabytes((row["compiled_memory"] or {}).get("peak")),
      f"{row['compile_s']:.1f}",
      ", ".join(f"{n} {kind}" for kind, n in row["solver_calls"].items() if n) or "none",
    ]
    for row in rows
  ]
  header = ["dtype", "projection", "ms per refresh", f"vs {rows[0]['projection']}"]
  more = ["compiled peak MB", "compile s", "solver calls"]
  return studies.table([*header, *more], body, align="llrrrrl")


def section_table(rows: list[dict], baseline: str) -> list[str]:
  header = ["dtype", "method", "local ms", "sync ms", "amortised ms", f"vs {baseline}: local"]
  header += ["sync", "amortised", "sync / local", "state MB: device", "host"]
  header += ["compiled peak MB", "compile s"]
  body = []
  for row in rows:
    ms, ratio = row["ms"], row["vs_baseline"]
    peak = (row["compiled_memory"] or {}).get("peak")
    body.append(
      [
        row["dtype"],
        label(row),
        milliseconds(ms["local"]),
        milliseconds(ms["sync"]),
        milliseconds(ms["amortised"]),
        f"{ratio['local']:.2f}",
        f"{ratio['sync']:.2f}",
        f"**{ratio['amortised']:.2f}**",
        f"{row['sync_over_local']:.1f}",
        megabytes(row["state_bytes"]["device"]),
        megabytes(row["state_bytes"]["host"]),
        megabytes(peak),
        f"{row['compile_s']:.1f}",
      ]
    )
  return studies.table(header, body, align="ll" + "r" * (len(header) - 2))


def markdown(record: dict) -> list[str]:
  d, s = record["device"], record["settings"]
  lines = [
    f"Device: **{d['kind']}** ({d['platform']}; the first of {d['visible']} visible), "
    f"jax {jax.__version__}, {record['measured_on']}.",
  ]
  lm = s["lm_config"]
  titles = {
    "refresh": f"The refresh alone: the {s['refreshed_matrices']} block matrices of "
    f"{s['optimizer_shapes']} (r = {s['rank']}), each projection's bases and rotated moments",
    "optimizer": f"Optimizer step alone: {s['optimizer_shapes']}, {s['optimizer_params']:,} "
    f"parameters, r = {s['rank']}, K = {s['sync_every']}",
    "lm": f"Whole LM training step: examples/lm at {s['lm']} (d = {lm['d_model']}, "
    f"{lm['num_layers']} layer(s), context {lm['seq_len']}), {s['lm_params']:,} parameters, "
    f"r = {s['lm_rank']}, K = {s['sync_every']}, {LM_BATCH} windows per step",
  }
  for section in s["sections"]:
    rows = [r for r in record["rows"] if r["section"] == section]
    if not rows:  # Not measured yet (a partial record).
      continue
    lines += ["", f"#### {titles[section]}", ""]
    if section == "refresh":
      lines += refresh_table(rows)
    else:
      lines += section_table(rows, {"optimizer": "AdamW", "lm": "DDP"}[section])
    peaks = [b for b in record["blocks"] if b["section"] == section and b["process_peak_bytes"]]
    if peaks:
      lines += [
        "",
        "Peak device memory of the process (memory_stats), after "
        + "; ".join(f"{b['dtype']}: {megabytes(b['process_peak_bytes'])} MB" for b in peaks)
        + ".",
      ]
  return lines


def notes_of(args, record: dict) -> list[str]:
  s = record["settings"]
  notes = [
    f"Milliseconds per step: medians over {args.repeats} interleaved rounds of K = "
    f"{s['sync_every']} steps (K - 1 local steps and 1 sync or refresh step per round) "
    "after one warm-up round; one worker, params and state donated, every step followed "
    "by jax.block_until_ready; in the refresh section, one refresh per round.",
    "sync: LoRDO's sync step (t = K, 2K, ...: lordo_jax.sync_steps), GaLore's and "
    "low-rank DDP's basis refresh (t = 1, K + 1, ...); AdamW and DDP have none (their "
    "sync column is their step). amortised = ((K - 1) local + sync) / K. Ratios are "
    "against AdamW's (optimizer) or DDP's (LM) step in the same run and dtype.",
    "Refresh section: LowRankAdam.refresh (scale_by_low_rank_adam, transport='rotate') of "
    "the block matrices from new matrices of the same shapes, jitted, the state donated: "
    "what a sync computes for the bases (the first basis of a run, exact, not included); "
    "ratios against the first projection measured. solver calls: the solver library's "
    "calls in the compiled refresh, each call site once whatever batch of matrices it "
    "takes (a fallback's inside its conditional included; on the CPU of jaxlib before "
    "0.12 a batched call is a loop around one site).",
    "Optimizer section: optax.adamw, optax.contrib.galore (update_proj_gap = K) and "
    "lordo_jax.lordo (axis_name=None) with each projection measured, weight decay "
    f"{WEIGHT_DECAY} for all; LoRDO's low-rank matrices are the paper's (every 2-D leaf "
    "but the embeddings, low_rank_labels); GaLore projects every 2-D leaf.",
    f"'{PHASED}': LoRDO at its default projection, each update given "
    "round_phase=lordo_jax.round_phase(step, sync_every=K), a static value: the local "
    "steps are a program without the round's conditionals, the first update and the "
    "sync steps the whole program (two programs, the same numbers). 'lordo': one "
    "program for every step, the round decided on the device.",
    "LM section: examples/lm's train.make_step on a 1 x 1 (workers, data) mesh of the "
    "first device, the methods as optimizers.get_optimizer builds them (rank d/4; "
    f"embeddings and head full-rank; low-rank DDP refreshes every K), learning rate "
    f"{LM_LEARNING_RATE}.",
    "bfloat16: parameters and gradients in bfloat16 (the LM also computes in it, with "
    "its loss in float32). optax.adamw keeps its moments in the parameters' dtype; "
    "every lordo_jax method keeps its moments and bases in float32.",
    "state MB: lordo_jax.state_bytes of the optimizer state, in device memory and in "
    "host memory (offload: the anchor). compiled peak: the step's "
    "compiled.memory_analysis(), argument + output + temp - alias bytes (n/a where the "
    "backend gives none); on CPU host and device memory are the same memory. compile s: "
    "seconds to trace, lower and compile the step, before any timed call.",
    "The process's peak device memory (memory_stats()['peak_bytes_in_use'], where "
    "the device reports it) counts everything since the process started and cannot "
    "be reset: each figure includes the sections and dtypes measured before it.",
  ]
  if offload_skipped():
    notes.append(offload_skipped() + ".")
  return notes


def settings_of(args, settings: dict) -> dict:
  config = lm_config(args.lm)
  return {
    "sections": args.sections,
    "dtypes": args.dtypes,
    "repeats": args.repeats,
    "sync_every": settings["period"],
    "rank": settings["rank"],
    "optimizer_shapes": "tiny GPT-2 (1 layer, d = 64)" if args.quick else "GPT-2 small",
    "optimizer_params": sum(x.size for x in jax.tree.leaves(settings["shapes"])),
    "projections": args.projections,
    "lordo_projections": args.lordo_projections,
    "refreshed_matrices": len(block_matrices(settings["shapes"])),
    "lm": args.lm,
    "lm_config": dataclasses.asdict(config),
    "lm_params": model.num_params(model.param_shapes(config)),
    "lm_rank": config.d_model // 4,
    "lm_batch": LM_BATCH,
    "learning_rate": LEARNING_RATE,
    "weight_decay": WEIGHT_DECAY,
    "lm_learning_rate": LM_LEARNING_RATE,
    "xla_flags": os.environ.get("XLA_FLAGS", ""),
  }


def write(args, record: dict) -> None:
  """Writes the JSON and markdown of ``record``: silently after each section and dtype
  (a run stopped by a time limit keeps what it measured), printed once complete."""
  notes = notes_of(args, record)
  blocks = sum(len(section_dtypes(section, args)) for section in args.sections)
  done = len(record["blocks"]) == blocks
  if not done:
    notes.append(f"Partial: written after {len(record['blocks'])} of {blocks} sections and dtypes.")
  info = record["device"]
  with contextlib.redirect_stdout(sys.stdout if done else io.StringIO()):
    studies.write(
      f"device_speed_{info['platform']}",
      args,
      {**record, "complete": done},
      f"LoRDO's step on {info['kind']} ({info['platform']}): optimizer alone and whole LM step",
      markdown(record),
      notes,
    )


def main(argv=None) -> int:
  args = parse_args(argv)
  settings = QUICK if args.quick else FULL
  if "optimizer" in args.sections and offload_skipped():
    print(offload_skipped())
  start = time.perf_counter()
  record = {
    "command": studies.command("device_speed.py", args),  # Not device_speed_<platform>.py.
    "device": device(),
    "measured_on": datetime.date.today().isoformat(),
    "settings": settings_of(args, settings),
    "rows": [],
    "blocks": [],
  }
  for section in args.sections:
    for dtype in section_dtypes(section, args):
      rows, block = measure(section, dtype, args, settings)
      record["rows"] += rows
      record["blocks"].append(block)
      record["wall_time_s"] = time.perf_counter() - start
      print(f"{section}, {dtype}: done in {block['wall_time_s']:.0f} s", flush=True)
      write(args, record)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
