"""The training loop: M simulated workers on a mesh of CPU devices, any method.

The devices form a ``(workers, data)`` mesh. Each worker owns ``devices / workers``
devices: its batch is split over them and its gradient averaged over them (the fast
link inside a node, not counted), while everything the optimizer sends between
workers goes over the ``workers`` axis through the library's counted all-reduce.
Parameters and optimizer state carry a leading worker axis of size M, sharded over
``workers``; inside ``jax.shard_map`` that axis is size 1 and squeezed away, so the
step body is the ordinary single-worker optax step.

With ``fsdp=N`` (N > 1) each worker also shards its parameters N ways (FSDP): the mesh
is ``(workers, data, fsdp)`` with ``Auto`` axes, each parameter is split over ``fsdp``
on its smallest dimension that N divides, and the step is manual over ``workers`` and
``data`` only, so the model sees its parameters split over ``fsdp`` and the compiler
gathers what it needs (the Flax model runs unchanged). The optimizer state is laid out
like its parameter (``lordo_jax.state_sharding``), and the step keeps both layouts
(its ``out_shardings``). With ``offload=True`` the method keeps its anchor (and outer
state, residual) in ``pinned_host`` memory.

jaxlib 0.10 on CPU can deadlock when several multi-device programs are in flight,
so every step blocks until its outputs are ready, and host-side reductions use NumPy.

With ``param_dtype="bfloat16"`` the parameters (and so the gradients and the
activations) are bfloat16, while the optimizer keeps its moments and projections in
float32 (every ``lordo_jax`` method does). With ``checkpoint_dir`` the loop saves
checkpoints (:mod:`.checkpoints`), and ``resume=True`` continues from the latest one
exactly as the run would have gone on without the stop. With ``warm_start_from`` the
run starts after step S of another run's checkpoint, its parameters, data position and
inner optimizer state (bases, moments, error buffers, step counters) carried over
(:mod:`.warm_start`): the paper's protocol of LoRDO started from low-rank DDP at a
third of the run.
"""

import dataclasses
import functools
import inspect
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tqdm.auto import tqdm

import lordo_jax

from . import checkpoints
from . import data as data_lib
from . import elastic
from . import metrics as metrics_lib
from . import model as model_lib
from . import optimizers
from . import warm_start as warm_start_lib

AXIS = "workers"
DATA_AXIS = "data"
FSDP_AXIS = "fsdp"


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Everything a run needs besides the model and the data."""

  steps: int = 256
  num_workers: int = 8
  batch_size: int = 8  # Windows per worker per step.
  learning_rate: float = 2e-3
  warmup_steps: int = 20
  weight_decay: float = 0.0
  rank: int = 32
  sync_every: int = 16  # K, the round length of the local-update methods.
  refresh_every: int = 16  # T, the low-rank DDP basis refresh period.
  seed: int = 0
  eval_every: int = 16
  eval_windows: int = 64
  # Further keyword arguments of the method's factory, e.g. {"omega": 1.0}.
  optimizer_options: tuple[tuple[str, Any], ...] = ()
  # "bfloat16": parameters, gradients and activations in bfloat16 (moments float32).
  param_dtype: str = "float32"
  checkpoint_dir: str | None = None  # Where this run's checkpoints go; None: none.
  checkpoint_every: int = 0  # Steps between checkpoints; 0: only at the end of a call.
  resume: bool = False  # Continue from the latest checkpoint in checkpoint_dir.
  stop_after: int | None = None  # End this call after this step (a time-limited job).
  # Start after step S of this checkpoint directory of another run (see warm_start.py).
  warm_start_from: str | None = None
  warm_start_step: int | None = None  # S; None: the latest checkpoint there.
  warm_start_moments: str = "keep"  # The moments at the switch: "keep" or "reset" (zeros).
  clip_norm: float | None = None  # Clip each worker's gradient to this global norm.
  schedule: str = "cosine"  # After the warmup: "cosine" (to lr/10) or "constant".
  fsdp: int = 1  # N: each worker's parameters and state split N ways over its devices.
  offload: bool = False  # The method's anchor (outer state, residual) in host memory.
  # The round's message in flight while the workers go on: "round" or tau < sync_every
  # steps (lordo_jax's overlap; MATH.md §9); None: every sync blocks. merge: how it lands.
  overlap: Any = None
  merge: str | None = None
  # (worker, first round, last round): the worker is absent for those rounds (1-based,
  # inclusive) and comes back (elastic.py); the method is built fault tolerant.
  absent: tuple[tuple[int, int, int], ...] = ()
  # A resume on another num_workers of a state saved mid-round: None refuses it,
  # "restart" restarts the round from the anchor (lordo_jax.remap_workers).
  resume_mid_round: str | None = None


@dataclasses.dataclass
class RunResult:
  """One method's run: curves and final numbers, JSON-ready."""

  method: str
  final_val_loss: float
  communicated_bytes: int
  state_bytes: dict[str, int]
  wall_time_s: float  # Summed over the calls of a stopped and resumed run.
  compile_time_s: float
  train_loss: list[float]  # Mean over workers, every step.
  # Wall time of every step; step 1 includes compilation (none where an earlier run in
  # this process compiled the same programs: make_programs).
  step_time_s: list[float]
  bytes_sent: list[int]  # Bytes all-reduced per worker since init, after every step.
  evals: list[dict[str, Any]]  # step, val_loss and the metrics of that step.
  resumed_from: int = 0  # The checkpoint's step this call continued from (0: none).
  warm_start_step: int = 0  # The step of the other run this run started from (0: none).


def make_mesh(num_workers: int, fsdp: int = 1) -> jax.sharding.Mesh:
  """The ``(workers, data)`` mesh over all devices; ``(workers, data, fsdp)`` if ``fsdp > 1``.

  The FSDP axis is ``Auto``: the model's lookups and matrix products on parameters
  split over it are left to the compiler, which gathers them. (With ``Explicit`` axes
  the model would have to say how each of their outputs is split.)

  Raises:
    ValueError: ``num_workers * fsdp`` does not divide the number of devices.
  """
  devices = len(jax.devices())
  if devices % (num_workers * fsdp):
    raise ValueError(
      f"--workers {num_workers} x --fsdp {fsdp} does not divide the {devices} devices; use "
      "a --workers and --fsdp whose product divides them."
    )
  data = devices // (num_workers * fsdp)
  if fsdp == 1:
    return jax.make_mesh((num_workers, data), (AXIS, DATA_AXIS))
  axes = (AXIS, DATA_AXIS, FSDP_AXIS)
  return jax.make_mesh((num_workers, data, fsdp), axes, axis_types=(AxisType.Auto,) * 3)


def param_spec(shape: tuple[int, ...], fsdp: int) -> P:
  """``P("workers", ...)`` of a stacked leaf: ``fsdp`` on its smallest dimension N divides.

  For a low-rank matrix that is the dimension its moments keep (ties go to the last,
  as a square matrix projected on the left keeps its columns), so that its moments
  split with it and its basis along the other dimension: every state leaf shrinks N
  ways (docs/guides/sharded_models.md). A leaf none of whose dimensions (after the worker
  dimension) N divides stays whole in each worker.
  """
  dims = [i for i in range(1, len(shape)) if fsdp > 1 and shape[i] % fsdp == 0]
  if not dims:
    return P(AXIS)
  split = min(dims, key=lambda i: (shape[i], -i))
  return P(AXIS, *(FSDP_AXIS if i == split else None for i in range(1, len(shape))))


def param_shardings(mesh: jax.sharding.Mesh, stacked: Any, fsdp: int) -> Any:
  """The ``NamedSharding`` of every leaf of the stacked parameters (:func:`param_spec`)."""
  return jax.tree.map(lambda x: NamedSharding(mesh, param_spec(x.shape, fsdp)), stacked)


def stack(tree: Any, num_workers: int) -> Any:
  """``num_workers`` copies of ``tree`` along a new leading axis."""
  return jax.tree.map(lambda x: jnp.broadcast_to(x, (num_workers, *x.shape)), tree)


def make_step(
  apply: Callable,
  tx: optax.GradientTransformation,
  mesh,
  state_spec,
  out_shardings=None,
  phase: tuple[str, str] | None = None,
  presence: bool = False,
) -> Callable:
  """The jitted step ``(params, opt_state, batch) -> (params, opt_state, loss)``.

  Manual over the ``workers`` and ``data`` axes; an ``fsdp`` axis stays to the
  compiler. ``out_shardings`` (of the three outputs), if given, keeps the layout of the
  parameters and state from step to step. ``phase``: the steps' static phase as
  ``(keyword, value)`` (:func:`step_phase`): ``("overlap_phase", ...)`` for a method
  with an int ``overlap``, ``("round_phase", ...)`` for one with blocking rounds. With
  ``presence`` the step takes a fourth argument, each worker's ``worker_present``
  (bool ``(M,)``), for a method built with ``fault_tolerant=True``.
  """
  extra = {} if phase is None else dict([phase])

  def body(params, opt_state, batch_1BT1, *present_1):
    squeeze = lambda t: jax.tree.map(lambda x: x[0], t)  # noqa: E731
    expand = lambda t: jax.tree.map(lambda x: x[None], t)  # noqa: E731
    params, opt_state = squeeze(params), squeeze(opt_state)
    present = {"worker_present": present_1[0][0]} if present_1 else {}

    def loss(p):
      return jax.lax.pmean(model_lib.loss_fn(apply, p, batch_1BT1[0]), DATA_AXIS)

    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = tx.update(grads, opt_state, params, **extra, **present)
    params = optax.apply_updates(params, updates)
    return expand(params), expand(opt_state), value[None]

  worker = P(AXIS)
  return jax.jit(
    jax.shard_map(
      body,
      mesh=mesh,
      in_specs=(worker, state_spec, P(AXIS, DATA_AXIS), *((worker,) if presence else ())),
      out_specs=(worker, state_spec, worker),
      axis_names={AXIS, DATA_AXIS},
    ),
    donate_argnums=(0, 1),
    **({} if out_shardings is None else {"out_shardings": out_shardings}),
  )


def make_evaluate(loss: Callable, windows: np.ndarray, chunk: int = 32) -> Callable:
  """``evaluate(stacked_params) -> float``: validation loss of the workers' average,
  ``loss(params, windows)`` (jitted: :func:`make_programs`) over ``windows`` in chunks.

  After a synchronisation all workers hold the same parameters, so this is the
  model every method ends with; between syncs it is the plain average.
  """
  chunks = [windows[i : i + chunk] for i in range(0, len(windows), chunk)]

  def evaluate(stacked_params) -> float:
    host = jax.tree.map(
      lambda x: np.asarray(jax.device_get(x), np.float32).mean(0).astype(x.dtype), stacked_params
    )
    total = sum(float(loss(host, c)) * len(c) for c in chunks)
    return total / len(windows)

  return evaluate


# TrainConfig's fields that no program of a run depends on: calls of :func:`train` that
# differ only in these (another seed, a resumed call, another checkpoint folder) share
# their compiled programs within a process (:func:`make_programs`).
RUN_ONLY_FIELDS = (
  "seed", "eval_every", "eval_windows", "checkpoint_dir", "checkpoint_every", "resume",
  "stop_after", "warm_start_step", "warm_start_moments", "resume_mid_round",
)  # fmt: skip


@dataclasses.dataclass
class Programs:
  """What the runs of one method, config and model compile: the model's ``apply``, the
  optimizer, the mesh, the jitted validation loss, and the jitted steps (:func:`make_step`,
  one per :func:`step_phase`, made as the steps ask). The parameters are each run's own."""

  apply: Callable
  tx: optax.GradientTransformation
  mesh: jax.sharding.Mesh
  loss: Callable
  steps: dict = dataclasses.field(default_factory=dict)


def make_programs(
  method: str, config: TrainConfig, model_config: model_lib.ModelConfig
) -> Programs:
  """The :class:`Programs` of ``method`` under ``config``: the same object for every call
  whose config differs only in :data:`RUN_ONLY_FIELDS` (the last 16 kept), so that a
  study's seeds and a resumed call trace and compile nothing again (a jitted function is
  traced once per function object: a new one each run would retrace, and lower, every
  program the persistent compilation cache then finds compiled)."""
  defaults = {name: TrainConfig.__dataclass_fields__[name].default for name in RUN_ONLY_FIELDS}
  return _programs(method, dataclasses.replace(config, **defaults), model_config)


@functools.lru_cache(maxsize=16)
def _programs(method: str, config: TrainConfig, model_config) -> Programs:
  apply, _ = model_lib.init(model_config, config.seed)  # The graph; no parameter is kept.
  return Programs(
    apply=apply,
    tx=make_optimizer(method, config),
    mesh=make_mesh(config.num_workers, config.fsdp),
    loss=jax.jit(lambda p, w: model_lib.loss_fn(apply, p, w)),
  )


def make_optimizer(method: str, config: TrainConfig) -> optax.GradientTransformation:
  """``lordo_jax.<method>`` configured by ``config``, for one worker's params.

  With ``config.clip_norm`` c each worker's gradient is first clipped to global norm
  c: ``G -> G min(1, c / ||G||)``, before any average (the LoRDO authors clip at 0.5;
  torchtitan clips the averaged gradient of a DDP step, so for low-rank DDP and DDP
  this is per worker, not of the average).

  With ``config.offload`` the method is built with ``offload=True`` (its anchor, outer
  state and residual in host memory); a method without an anchor (``ddp``,
  ``low_rank_ddp``) is a ValueError.

  A warm-started run (``config.warm_start_from``) builds a method that takes
  ``init_projection`` with random first bases, which the warm start replaces by the
  checkpoint's (:mod:`.warm_start`), instead of recomputing them from its first gradient.
  """
  extra = dict(config.optimizer_options)
  if config.warm_start_from and _accepts(method, "init_projection"):
    extra.setdefault("init_projection", "random")
  if config.offload:
    if not _accepts(method, "offload"):
      raise ValueError(
        f"--offload: {method} has no anchor to keep in host memory; use it without "
        f"--offload, or train one of {','.join(offload_methods())} with it."
      )
    extra.setdefault("offload", True)
  if config.absent:
    if not _accepts(method, "fault_tolerant"):
      raise ValueError(
        f"--absent: {method} has no round to leave a worker out of; train one with "
        "rounds (lordo, diloco, local_adam, ...)."
      )
    extra.setdefault("fault_tolerant", True)
  for option, value in (("overlap", config.overlap), ("merge", config.merge)):
    if value is None:
      continue
    if not _accepts(method, option):
      raise ValueError(
        f"--{option}: {method} has no round to overlap; use it without --{option}, or "
        f"train one of {','.join(overlap_methods())} with it."
      )
    extra.setdefault(option, value)
  learning_rate = optimizers.schedule(
    config.learning_rate, config.steps, config.warmup_steps, config.schedule
  )
  tx = optimizers.get_optimizer(
    method,
    learning_rate=learning_rate,
    axis_name=AXIS,
    rank=config.rank,
    sync_every=config.sync_every,
    refresh_every=config.refresh_every,
    weight_decay=config.weight_decay,
    extra_options=extra,
    warmup_steps=config.warmup_steps,
  )
  if config.clip_norm is None:
    return tx
  # Stateless and local: each worker clips its own gradient, before any average.
  return optax.chain(optax.clip_by_global_norm(config.clip_norm), tx)


def step_phase(
  t: int, config: TrainConfig, overlap: Any, fragments: int | None, updates: int | None = None
) -> tuple[str, str] | None:
  """Step t's (1-based) static phase, ``(keyword, value)`` for ``tx.update``, or
  ``None`` (one program): with an int ``overlap`` its ``overlap_phase`` (the steps that
  send a chunk are a program of their own); with blocking rounds and an int
  ``fragments``, the round phase of the optimizer's update number ``updates`` (the
  local steps compiled without the round's conditionals, which on a GPU cost copies
  of the state and a read back by the host)."""
  if isinstance(overlap, int) and not isinstance(overlap, bool):
    phase = lordo_jax.overlap_phase(
      t - 1, sync_every=config.sync_every, overlap=overlap, fragments=fragments or 1
    )
    return ("overlap_phase", phase)
  if updates is not None and not overlap and fragments is not None:
    phase = lordo_jax.round_phase(updates, sync_every=config.sync_every, fragments=fragments)
    return ("round_phase", phase)
  return None


def fragments_of(method: str, config: TrainConfig) -> int | None:
  """The int ``fragments`` ``method`` is built with under ``config``: an ``--option``'s,
  else its variant's; 1 for none; ``None`` for a function of the params, whose count
  the host cannot see (its steps then take no round phase)."""
  options = {**optimizers.factory_of(method)[1], **dict(config.optimizer_options)}
  fragments = options.get("fragments", 1)
  return fragments if isinstance(fragments, int) else None


def round_updates(method: str, config: TrainConfig, opt_state) -> int | None:
  """The updates the round of ``opt_state`` has taken (``lordo_jax.synchronize``'s
  count, read once on the host), from which the loop computes its steps' round phase;
  ``None`` without blocking rounds of an int ``sync_every`` (no round, or the
  Quadratic Synchronization Rule, whose rounds the phase does not follow here)."""
  options = {**optimizers.factory_of(method)[1], **dict(config.optimizer_options)}
  is_round = lambda x: isinstance(x, lordo_jax.SynchronizeState)  # noqa: E731
  rounds = [x for x in jax.tree.leaves(opt_state, is_leaf=is_round) if is_round(x)]
  if not rounds or options.get("quadratic_sync_alpha") is not None:
    return None
  return int(np.asarray(rounds[0].count).ravel()[0])


def sync_period(method: str, config: TrainConfig) -> int:
  """K, the round length ``method`` is built with (:func:`make_optimizer`).

  Raises:
    checkpoints.ResumeError: the Quadratic Synchronization Rule, whose round lengths
      follow the learning rate: a resume on another number of workers is not offered.
  """
  options = {**optimizers.factory_of(method)[1], **dict(config.optimizer_options)}
  if options.get("quadratic_sync_alpha") is not None:
    raise checkpoints.ResumeError(
      f"--resume on another --workers: {method} runs the Quadratic Synchronization Rule, "
      "whose rounds this job does not follow; resume it on the workers it was saved on."
    )
  return config.sync_every


def offload_methods() -> tuple[str, ...]:
  """The available methods that take ``offload`` (those with an anchor)."""
  return tuple(m for m in optimizers.available_methods() if _accepts(m, "offload"))


def overlap_of(method: str, config: TrainConfig) -> Any:
  """The ``overlap`` ``method`` is built with under ``config`` (:func:`make_optimizer`):
  an ``--option``'s, else ``--overlap``'s, else its variant's; ``None``: none."""
  options = dict(config.optimizer_options)
  if "overlap" in options:
    return options["overlap"]
  if config.overlap is not None:
    return config.overlap
  return optimizers.factory_of(method)[1].get("overlap")


def fault_tolerant_methods() -> tuple[str, ...]:
  """The available methods that take ``fault_tolerant`` (workers may be ``--absent``)."""
  return tuple(m for m in optimizers.available_methods() if _accepts(m, "fault_tolerant"))


def overlap_methods() -> tuple[str, ...]:
  """The available methods that take ``overlap`` (those built on a round, bar DES-LOC,
  whose moment periods do not overlap)."""
  methods = (m for m in optimizers.available_methods() if _accepts(m, "overlap"))
  return tuple(m for m in methods if m != "desloc")


def _accepts(method: str, name: str) -> bool:
  """Whether ``lordo_jax.<method>`` takes the keyword ``name`` (directly or via lordo)."""
  factory = optimizers.factory_of(method)[0]
  if not callable(factory):
    return False
  accepted = inspect.signature(factory).parameters
  if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
    accepted = {**inspect.signature(lordo_jax.lordo).parameters, **accepted}
  return name in accepted


def resolve_warm_start(method, config, model_config, dataset) -> tuple[TrainConfig, dict | None]:
  """``(config with warm_start_step set, the source run's settings)``; no warm start: None.

  Raises:
    warm_start.WarmStartError: no usable checkpoint, or one of another model, data,
      workers, batch, rank or seed.
  """
  if config.warm_start_from is None:
    return config, None
  step, saved = warm_start_lib.read_settings(config.warm_start_from, config.warm_start_step)
  if step >= config.steps:
    raise warm_start_lib.WarmStartError(
      f"--warm-start-from {config.warm_start_from}: its step {step} is not before --steps "
      f"{config.steps}; give more --steps."
    )
  config = dataclasses.replace(config, warm_start_step=step)
  current = checkpoints.settings(method, config, model_config, dataset)
  warm_start_lib.check_compatible(saved, current, config.warm_start_from)
  return config, saved


def warm_started(config, saved, tx, params, shardings) -> tuple[Any, Any, int]:
  """``(params, opt_state, data_position)`` of a warm start (see :mod:`.warm_start`).

  The checkpoint is restored with its own method's optimizer as the template; this
  run's state is ``tx.init`` of the checkpoint's parameters (so LoRDO's anchor is
  them), with every inner optimizer state then taken from the checkpoint's.

  Args:
    config: this run's config, ``warm_start_step`` resolved (:func:`resolve_warm_start`).
    saved: the checkpoint's settings.
    tx: this run's optimizer (:func:`make_optimizer`).
    params: the stacked parameters of this run, sharded: the restore's template.
    shardings: the shardings of this run's state (``lordo_jax.state_sharding``).
  """
  m = config.num_workers
  source = dataclasses.replace(warm_start_lib.source_config(config, saved), offload=False)
  source_tx = make_optimizer(saved["method"], source)
  one_worker = jax.tree.map(lambda x: np.asarray(x)[0], params)
  like = jax.device_put(
    stack(source_tx.init(one_worker), m),
    lordo_jax.state_sharding(source_tx, params, worker_axis=AXIS),
  )
  params, source_state, metadata = checkpoints.restore(
    config.warm_start_from, config.warm_start_step, params, like
  )
  opt_state = jax.device_put(stack(tx.init(warm_start_lib.first_worker(params)), m), shardings)
  opt_state = warm_start_lib.transplant(source_state, opt_state, moments=config.warm_start_moments)
  return params, jax.device_put(opt_state, shardings), metadata["data_position"]


def train(
  method: str,
  config: TrainConfig,
  model_config: model_lib.ModelConfig,
  dataset: data_lib.Dataset,
  *,
  progress: bool = True,
) -> RunResult:
  """Trains ``model_config`` with ``lordo_jax.<method>`` on ``dataset``.

  With ``config.checkpoint_dir`` a checkpoint is saved every
  ``config.checkpoint_every`` steps and after the call's last step (``steps``, or
  ``stop_after``); the two latest are kept. With ``config.resume`` the run continues
  from the latest one: parameters, optimizer state, data position and curves, so
  that it ends bit-identical to a run that never stopped. (The first step after a
  restart includes compilation; the first basis similarity after it is measured
  from the restored bases.)

  Raises:
    checkpoints.ResumeError: ``resume`` without a checkpoint, a checkpoint of other
      settings (method, rank, ...), or checkpoints already there without ``resume``.
    warm_start.WarmStartError: ``warm_start_from`` without a usable checkpoint, or one
      of another model, data, rank, workers, batch or seed.
  """
  start = time.perf_counter()
  m = config.num_workers
  config, warm_settings = resolve_warm_start(method, config, model_config, dataset)
  programs = make_programs(method, config, model_config)
  apply, tx, mesh, steps = programs.apply, programs.tx, programs.mesh, programs.steps
  _, params = model_lib.init(model_config, config.seed)
  params = model_lib.cast(params, config.param_dtype)
  opt_state = stack(tx.init(params), m)
  state_spec = jax.tree.map(lambda _: P(AXIS), opt_state)
  params = stack(params, m)
  params = jax.device_put(params, param_shardings(mesh, params, config.fsdp))
  shardings = lordo_jax.state_sharding(tx, params, worker_axis=AXIS)
  opt_state = jax.device_put(opt_state, shardings)
  batch_sharding = NamedSharding(mesh, P(AXIS, DATA_AXIS))
  layout = (jax.tree.map(lambda x: x.sharding, params), shardings, NamedSharding(mesh, P(AXIS)))

  overlap, fragments = overlap_of(method, config), fragments_of(method, config)
  rounds = {}  # The round's update count at the first step of this run (round_updates).

  def step(t: int):
    updates = None if rounds["before"] is None else rounds["before"] + t - 1 - first
    phase = step_phase(t, config, overlap, fragments, updates)
    if phase not in steps:
      steps[phase] = make_step(
        apply, tx, mesh, state_spec, out_shardings=layout, phase=phase, presence=presence
      )
    return steps[phase]

  presence = bool(config.absent)
  elastic.check_absent(config.absent, m)

  def present(t: int) -> tuple:
    """Step t's worker_present argument, with an absence schedule; else none."""
    if not presence:
      return ()
    return (jax.device_put(elastic.presence(t, m, config.sync_every, config.absent), layout[2]),)

  batches = data_lib.Batches(
    dataset, seq_len=model_config.seq_len, batch_size=config.batch_size, seed=config.seed
  )
  windows = data_lib.validation_windows(
    dataset, seq_len=model_config.seq_len, max_windows=config.eval_windows
  )
  evaluate = make_evaluate(programs.loss, windows)
  tracker = metrics_lib.ProjectionTracker()
  saver = None
  if config.checkpoint_dir is not None:
    settings = checkpoints.settings(method, config, model_config, dataset)
    saver = checkpoints.RunCheckpoints(
      config.checkpoint_dir, settings, resume=config.resume, every=config.checkpoint_every
    )
  elif config.resume:
    raise checkpoints.ResumeError("--resume needs the --checkpoint-dir of the run to continue.")
  first = saver.resume_step if saver is not None else 0
  resumed = bool(first)
  if resumed and saver.saved_workers != m:  # Another number of workers: remapped.
    params, opt_state, saved = elastic.restore_on(
      saver.directory, first, saver.saved_workers, params, opt_state, shardings,
      sync_every=sync_period(method, config), mid_round=config.resume_mid_round,
    )  # fmt: skip
    batches.restart(first)
    history = saved["history"]
  elif resumed:
    params, opt_state, saved = saver.restore(params, opt_state)
    batches.seek(saved["data_position"])
    history = saved["history"]
  elif warm_settings is not None:
    params, opt_state, position = warm_started(config, warm_settings, tx, params, shardings)
    batches.seek(position)
    first = config.warm_start_step
  tracker(opt_state)
  rounds["before"] = round_updates(method, config, opt_state)
  if not resumed:
    history = {"train_loss": [], "step_time_s": [], "bytes_sent": [], "wall_time_s": 0.0}
    history["evals"] = [
      {"step": first, "val_loss": evaluate(params)} | metrics_lib.step_metrics(opt_state, tracker)
    ]
  last = min(config.steps, config.stop_after or config.steps)
  compile_time = 0.0
  bar = tqdm(
    range(first + 1, last + 1),
    desc=f"{method:>12}",
    total=config.steps,
    initial=first,
    disable=not progress,
    leave=True,
  )
  for t in bar:
    tic = time.perf_counter()
    batch = jax.device_put(batches(), batch_sharding)
    params, opt_state, loss = step(t)(params, opt_state, batch, *present(t))
    jax.block_until_ready((params, opt_state, loss))
    history["step_time_s"].append(time.perf_counter() - tic)
    if t == first + 1:
      compile_time = history["step_time_s"][-1]
    history["train_loss"].append(float(np.asarray(loss).mean()))
    history["bytes_sent"].append(lordo_jax.communicated_bytes(opt_state))
    if t % config.eval_every == 0 or t == config.steps:
      record = {"step": t, "val_loss": evaluate(params)}
      record |= metrics_lib.step_metrics(opt_state, tracker)
      history["evals"].append(record)
      bar.set_postfix(
        loss=f"{history['train_loss'][-1]:.3f}",
        val=f"{record['val_loss']:.3f}",
        sent=f"{record['bytes'] / 2**20:.1f}MiB",
      )
    if saver is not None and saver.due(t, last):
      elapsed = history["wall_time_s"] + time.perf_counter() - start
      saver.save(
        t,
        params,
        opt_state,
        data_position=batches.position(),
        history=history | {"wall_time_s": elapsed},
      )
  bar.close()
  if saver is not None:
    saver.close()
  evals = history["evals"]
  return RunResult(
    method=method,
    final_val_loss=evals[-1]["val_loss"],
    communicated_bytes=lordo_jax.communicated_bytes(opt_state),
    state_bytes=metrics_lib.state_bytes(opt_state),
    wall_time_s=history["wall_time_s"] + time.perf_counter() - start,
    compile_time_s=compile_time,
    train_loss=history["train_loss"],
    step_time_s=history["step_time_s"],
    bytes_sent=history["bytes_sent"],
    evals=evals,
    resumed_from=first if resumed else 0,
    warm_start_step=(config.warm_start_step or 0) if config.warm_start_from else 0,
  )
