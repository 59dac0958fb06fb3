r"""One LoRDO training job, the same code on every process of a multi-process run.

    python3 examples/launch_multiprocess.py --processes 2 --devices-per-process 4
    python3 examples/launch_multiprocess.py --processes 2 --devices-per-process 4 --fsdp 4

starts this file once per process (see ``launch_multiprocess.py``). Each process calls
``jax.distributed.initialize``, owns ``--local-devices`` CPU devices, and all
processes together form one mesh, ``workers x fsdp``: ``devices / F`` worker groups of
``F = --fsdp`` devices each, every group inside one process. With ``--fsdp 1`` (the
default) each worker is one device holding its whole model. With ``F > 1`` each group
shards its copy F ways (FSDP: parameters, optimizer state and batch split, the
parameters gathered whole for the forward pass inside the group) and the worker axis
spans the processes. Every process runs the same jitted ``shard_map`` step, manual over
the worker axis only, on its share of the workers; the optimizer's all-reduces (the
pseudo-gradient and the low-rank moments at each sync) cross processes through gloo.
The result does not depend on how the workers are spread over processes: 2 processes
x 4 devices train the same parameters as 1 process x 8 devices with the same mesh.

The problem: a small MLP (16 -> 32 -> 8, tanh) fitted by least squares; worker m
sees its own inputs and its own target map (heterogeneous data, as local-update
methods meet in practice). All data come from a seed, so every process can build the
whole global batch and keep its own workers' slices.

Run directly, one process per terminal, for example::

    python3 examples/multiprocess_job.py --num-processes 2 --process-id 0 \
        --coordinator 127.0.0.1:12355 --local-devices 4 --out /tmp/run
    python3 examples/multiprocess_job.py --num-processes 2 --process-id 1 \
        --coordinator 127.0.0.1:12355 --local-devices 4 --out /tmp/run

Process 0 writes ``result.npz`` (every worker's final parameters) and ``result.json``
(losses, bytes sent, the shapes of one device's slices) into ``--out``;
``--checkpoint-dir`` also saves the final params and optimizer state there with
:mod:`lordo_jax.checkpoint` (every process writes its own shards). ``--resume-from DIR``
continues the run saved there, on however many workers this run has, up to ``--steps``
(:func:`resume`: restored on the saved number of workers, ``lordo_jax.remap_workers``);
every process also writes the state it continues from, ``remapped_<process>.npz``.
"""

import os

# OpenBLAS (behind the CPU SVD) with its default threads on every simulated device of
# every process is 100x slower on a few cores. Before NumPy is imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import ctypes  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

AXIS, FSDP = "workers", "fsdp"
IN, HIDDEN, OUT = 16, 32, 8


@dataclasses.dataclass(frozen=True)
class Config:
  """The training run; the same on every process."""

  steps: int = 24
  sync_every: int = 4
  rank: int = 4
  learning_rate: float = 1e-2
  batch_per_worker: int = 16
  seed: int = 0
  fsdp: int = 1  # devices per worker group; 1: one worker per device, unsharded
  projection: str = "svd"


def die_with_launcher() -> None:
  """On Linux, have the kernel kill this process when its launcher dies.

  ``launch_multiprocess.py`` starts each process in its own session (so that it can
  kill a process with everything it started), which also shields it from the
  launcher's Ctrl-C; without this, a killed launcher would leave the processes
  waiting on each other at the next collective. The launcher passes its pid in
  ``LORDO_LAUNCHER_PID``.
  """
  launcher = os.environ.get("LORDO_LAUNCHER_PID")
  if launcher is None or not sys.platform.startswith("linux"):
    return
  pr_set_pdeathsig = 1
  ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
  if os.getppid() != int(launcher):  # it died before the line above
    os._exit(1)


def configure(local_devices: int, num_processes: int) -> None:
  """JAX settings that must precede any use of a device: device count, CPU collectives."""
  jax.config.update("jax_platforms", "cpu")
  jax.config.update("jax_num_cpu_devices", local_devices)
  if num_processes > 1:
    # Cross-process all-reduces on CPU go through gloo (over TCP on 127.0.0.1 here).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")


def init_params(seed: int) -> dict:
  rng = np.random.default_rng(seed)
  return {
    "w1": (rng.standard_normal((IN, HIDDEN)) / np.sqrt(IN)).astype(np.float32),
    "b1": np.zeros(HIDDEN, np.float32),
    "w2": (rng.standard_normal((HIDDEN, OUT)) / np.sqrt(HIDDEN)).astype(np.float32),
  }


def global_batch(config: Config, workers: int, step: int) -> tuple[np.ndarray, np.ndarray]:
  """Step ``step``'s inputs and targets for all workers, ``(M, B, IN)`` and ``(M, B, OUT)``."""
  maps = np.random.default_rng([config.seed, 1]).standard_normal((workers, IN, OUT)) / 4
  x = np.random.default_rng([config.seed, 2, step]).standard_normal(
    (workers, config.batch_per_worker, IN)
  )
  y = np.tanh(np.einsum("mbi,mio->mbo", x, maps))
  return x.astype(np.float32), y.astype(np.float32)


def loss_fn(params, x, y):
  import jax.numpy as jnp

  hidden = jnp.tanh(x @ params["w1"] + params["b1"])
  return jnp.mean((hidden @ params["w2"] - y) ** 2)


def fsdp_loss_fn(params, x, y):
  """The loss with FSDP's forward pass: each parameter gathered whole inside the worker
  group (an all-gather over ``fsdp``, on the group's own devices), the batch left split.
  The gradient comes back split like its parameter (the transpose: a reduce-scatter).
  With ``--fsdp 1`` nothing is split and this is :func:`loss_fn`."""
  return loss_fn(jax.tree.map(lambda a: jax.sharding.reshard(a, P()), params), x, y)


def make_optimizer(config: Config):
  import lordo_jax

  return lordo_jax.lordo(
    config.learning_rate,
    rank=config.rank,
    sync_every=config.sync_every,
    axis_name=AXIS,
    projection=config.projection,
  )


def make_mesh(config: Config):
  """The global mesh ``workers x fsdp``: ``devices / F`` worker groups of ``F`` devices.

  Each group's devices lie in one process (on a cluster: one node, one TPU slice, with
  its fast links), so FSDP's gathers stay inside a process and only LoRDO's all-reduce
  over ``workers`` crosses processes. The devices are taken process by process; the
  same layout with 1 process gives the same arithmetic.
  """
  fsdp = config.fsdp
  if jax.local_device_count() % fsdp or HIDDEN % fsdp or config.batch_per_worker % fsdp:
    raise ValueError(
      f"--fsdp {fsdp} must divide the devices of a process ({jax.local_device_count()}: a "
      f"worker group lies in one process), the hidden width ({HIDDEN}) and the batch "
      f"({config.batch_per_worker})"
    )
  devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
  grid = np.array(devices).reshape(len(devices) // fsdp, fsdp)
  return jax.sharding.Mesh(grid, (AXIS, FSDP), axis_types=(jax.sharding.AxisType.Explicit,) * 2)


# A leading worker axis, then each worker's copy split over ``fsdp`` on a dimension of
# size HIDDEN; the batch split over ``fsdp`` too.
PARAM_SPECS = {"w1": P(AXIS, None, FSDP), "b1": P(AXIS, FSDP), "w2": P(AXIS, FSDP, None)}
BATCH_SPECS = (P(AXIS, FSDP), P(AXIS, FSDP))


def on_workers(fn, mesh):
  """``fn`` of one worker's arrays, run by every worker: a jitted ``shard_map`` manual
  over the worker axis only, so inside a worker the arrays stay split over ``fsdp``.
  Its arguments and results carry a leading worker axis."""

  def body(*args):
    out = fn(*jax.tree.map(lambda a: a[0], args))
    return jax.tree.map(lambda a: a[None], out)

  return jax.jit(
    jax.shard_map(body, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS), axis_names={AXIS})
  )


def make_step(tx, mesh):
  """The jitted step; params, state and data carry a leading worker axis."""
  import optax

  def step(params, state, x, y):
    loss, grads = jax.value_and_grad(fsdp_loss_fn)(params, x, y)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss

  return on_workers(step, mesh)


def to_workers(tree, mesh, specs, workers: int | None = None):
  """Host arrays onto the global mesh, each leaf placed by its spec in ``specs``.

  With ``workers`` each leaf is first repeated along a new leading axis of that size.
  Every process passes the same values and keeps only its own devices' slices, so
  this works whether or not the mesh spans several processes.
  """

  def put(a, spec):
    a = np.asarray(a)
    if workers is not None:
      a = np.broadcast_to(a, (workers, *a.shape))
    sharding = jax.NamedSharding(mesh, spec)
    return jax.make_array_from_callback(a.shape, sharding, lambda index: a[index])

  return jax.tree.map(put, tree, specs)


def gather(tree):
  """Every worker's values, as NumPy, on every process (a collective: all must call)."""
  from jax.experimental import multihost_utils

  return jax.tree.map(np.asarray, multihost_utils.process_allgather(tree, tiled=True))


def placed_like(tree, like):
  """Host arrays (the same on every process) placed as the arrays of ``like`` are."""
  return jax.tree.map(
    lambda a, x: jax.make_array_from_callback(a.shape, x.sharding, lambda index: a[index]),
    tree,
    like,
  )


def shard_shapes(tree) -> dict:
  """The shape of the slice of each leaf that this process's first device holds."""
  device = jax.local_devices()[0]
  return jax.tree.map(
    lambda a: [s.data.shape for s in a.addressable_shards if s.device == device][0], tree
  )


def start(config: Config):
  """The mesh, the optimizer, and every worker's initial params and state.

  The state is made by ``tx.init`` on the workers, so that it is split like its
  parameter (the anchor, Adam's moments, the low-rank moments' kept dimension).
  """
  mesh = make_mesh(config)
  tx = make_optimizer(config)
  params = to_workers(init_params(config.seed), mesh, PARAM_SPECS, mesh.shape[AXIS])
  return mesh, tx, params, on_workers(tx.init, mesh)(params)


def run_steps(config: Config, mesh, tx, params, state, first: int):
  """Steps ``first + 1 .. config.steps`` on the mesh's workers; the params, the state and
  every step's losses."""
  step = make_step(tx, mesh)
  losses = []
  for t in range(first, config.steps):
    x, y = to_workers(global_batch(config, mesh.shape[AXIS], t), mesh, BATCH_SPECS)
    params, state, loss = step(params, state, x, y)
    jax.block_until_ready((params, state, loss))  # jaxlib 0.10 CPU: one program at a time
    losses.append(loss)
  return params, state, losses


def train(config: Config, checkpoint_dir: str | None = None) -> dict:
  """Runs ``config.steps`` steps on all of the mesh's workers; returns host results.

  Call after :func:`configure` (and ``jax.distributed.initialize`` for several
  processes); every process calls it and every process gets the same results.
  """
  import lordo_jax

  mesh, tx, params, state = start(config)
  workers = mesh.shape[AXIS]
  params, state, losses = run_steps(config, mesh, tx, params, state, 0)
  if checkpoint_dir is not None:
    from lordo_jax import checkpoint

    checkpoint.save(checkpoint_dir, config.steps, params, state, metadata={"workers": workers})
  return {
    "params": gather(params),
    "losses": [float(loss.mean()) for loss in gather(losses)],
    "communicated_bytes": lordo_jax.communicated_bytes(jax.device_get(gather(state))),
    "workers": workers,
    "fsdp": config.fsdp,
    "processes": jax.process_count(),
    # The processes each worker group's devices belong to: one each.
    "group_processes": [sorted({d.process_index for d in row}) for row in mesh.devices],
    # What one device holds: with FSDP a 1/F slice of its worker's params and anchor.
    "param_shards": shard_shapes(params),
    "anchor_shards": shard_shapes(state.anchor),
  }


def restore_and_gather(config: Config, checkpoint_dir: str) -> dict:
  """The params of a checkpoint written by :func:`train`, restored on this run's mesh."""
  from lordo_jax import checkpoint

  _, _, params_like, state_like = start(config)
  params, _ = checkpoint.restore(checkpoint_dir, config.steps, params_like, state_like)
  return gather(params)


def saved_like(config: Config, workers: int, sharding=None):
  """The trees :func:`train` saves on ``workers`` workers, as ``jax.ShapeDtypeStruct``s
  with ``sharding`` (``None``: restored onto one device)."""
  import jax.numpy as jnp

  tx = make_optimizer(config)
  params = init_params(config.seed)
  stacked = lambda tree: jax.tree.map(lambda a: jnp.stack([a] * workers), tree)  # noqa: E731
  shapes = jax.eval_shape(lambda: (stacked(params), stacked(tx.init(params))))
  return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), shapes)


def resume(config: Config, checkpoint_dir: str) -> dict:
  """Continues the run saved in ``checkpoint_dir`` on this run's workers, to ``config.steps``.

  The checkpoint is restored on its own number of workers M (a target stacked over M,
  split over this run's workers where they divide M), remapped to this run's M' by
  ``lordo_jax.remap_workers`` (which gathers leaves spread over processes: every process
  gets the whole state), and each process places its own devices' slices as a fresh
  state is placed. Every process calls it and gets the same results.
  """
  import lordo_jax
  from lordo_jax import checkpoint

  mesh, tx, fresh_params, fresh_state = start(config)
  workers = mesh.shape[AXIS]
  with checkpoint.Checkpointer(checkpoint_dir, async_save=False) as saved:
    step = saved.latest_step()
    saved_workers = saved.metadata(step)["workers"]
  split = P(AXIS) if saved_workers % workers == 0 else P()
  like = saved_like(config, saved_workers, jax.NamedSharding(mesh, split))
  params, state = checkpoint.restore(checkpoint_dir, step, *like)
  remapped = lordo_jax.remap_workers(params, state, workers, sync_every=config.sync_every)
  params, state = placed_like(remapped, (fresh_params, fresh_state))
  params, state, losses = run_steps(config, mesh, tx, params, state, step)
  return {
    "params": gather(params),
    "losses": [float(loss.mean()) for loss in gather(losses)],
    "remapped": flat(remapped),
    "workers": workers,
    "saved_workers": saved_workers,
    "resumed_at": step,
    "steps": np.asarray(lordo_jax.step_count(gather(state))).tolist(),
    "processes": jax.process_count(),
  }


def flat(tree) -> dict:
  """``tree``'s leaves as NumPy arrays, keyed by their key paths."""
  return {
    jax.tree_util.keystr(path): np.asarray(leaf)
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
  }


def write_results(results: dict, out: pathlib.Path, restored: dict | None = None) -> None:
  out.mkdir(parents=True, exist_ok=True)
  np.savez(out / "result.npz", **results["params"])
  if restored is not None:
    np.savez(out / "restored.npz", **restored)
  summary = {k: v for k, v in results.items() if k not in ("params", "remapped")}
  (out / "result.json").write_text(json.dumps(summary, indent=1))


def summary(results: dict) -> str:
  losses = f"loss {results['losses'][0]:.4f} -> {results['losses'][-1]:.4f}"
  if "resumed_at" in results:
    return (
      f"{results['processes']} process(es): resumed at step {results['resumed_at']} on "
      f"{results['workers']} workers (saved on {results['saved_workers']}), {losses}"
    )
  return (
    f"{results['processes']} process(es) x {jax.local_device_count()} devices: "
    f"{results['workers']} workers x {results['fsdp']}-way FSDP, {losses}, "
    f"{results['communicated_bytes']:,} bytes sent per worker"
  )


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--num-processes", type=int, default=1)
  parser.add_argument("--process-id", type=int, default=0)
  parser.add_argument("--coordinator", default="127.0.0.1:12355", help="host:port of process 0")
  parser.add_argument("--local-devices", type=int, default=8, help="CPU devices per process")
  parser.add_argument("--steps", type=int, default=Config.steps)
  parser.add_argument("--sync-every", type=int, default=Config.sync_every)
  parser.add_argument(
    "--fsdp", type=int, default=Config.fsdp, help="devices per worker group (FSDP inside it)"
  )
  parser.add_argument("--projection", default=Config.projection, help="LoRDO's basis method")
  parser.add_argument("--out", required=True, help="where process 0 writes its results")
  parser.add_argument("--checkpoint-dir", help="save the final params and state here")
  parser.add_argument("--restore-from", help="also restore this run's checkpoint and report it")
  parser.add_argument(
    "--resume-from", help="continue the run saved here (on any number of workers) to --steps"
  )
  args = parser.parse_args(argv)

  die_with_launcher()
  configure(args.local_devices, args.num_processes)
  if args.num_processes > 1:
    host, port = args.coordinator.rsplit(":", 1)
    local = host in ("127.0.0.1", "localhost")
    jax.distributed.initialize(
      coordinator_address=args.coordinator,
      num_processes=args.num_processes,
      process_id=args.process_id,
      initialization_timeout=60,
      # By default the coordinator listens on every interface; a local run needs none.
      coordinator_bind_address=f"127.0.0.1:{port}" if local else None,
    )
  config = Config(
    steps=args.steps, sync_every=args.sync_every, fsdp=args.fsdp, projection=args.projection
  )
  if args.resume_from:
    results = resume(config, args.resume_from)
    out = pathlib.Path(args.out)  # every process: the state it continued from
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / f"remapped_{jax.process_index()}.npz", **results["remapped"])
  else:
    results = train(config, checkpoint_dir=args.checkpoint_dir)
  restored = restore_and_gather(config, args.restore_from) if args.restore_from else None
  if jax.process_index() == 0:
    write_results(results, pathlib.Path(args.out), restored)
    print(summary(results), flush=True)


if __name__ == "__main__":
  main()
