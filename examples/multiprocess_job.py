r"""One LoRDO training job, the same code on every process of a multi-process run.

    python3 examples/launch_multiprocess.py --processes 2 --devices-per-process 4

starts this file once per process (see ``launch_multiprocess.py``). Each process calls
``jax.distributed.initialize``, owns ``--local-devices`` CPU devices, and all
processes together form one mesh with one axis, ``workers``, one worker per device.
Every process runs the same jitted ``shard_map`` step on its share of the workers;
the optimizer's all-reduces (the pseudo-gradient and the low-rank moments at each
sync) cross processes through gloo. The result does not depend on how the workers
are spread over processes: 2 processes x 4 devices train the same parameters as
1 process x 8 devices.

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
(losses, bytes sent) into ``--out``; ``--checkpoint-dir`` also saves the final
params and optimizer state there with :mod:`lordo_jax.checkpoint` (every process
writes its own shards).
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

AXIS = "workers"
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


def make_optimizer(config: Config):
  import lordo_jax

  return lordo_jax.lordo(
    config.learning_rate, rank=config.rank, sync_every=config.sync_every, axis_name=AXIS
  )


def make_step(tx, mesh):
  """The jitted ``shard_map`` step; params, state and data carry a leading worker axis."""
  import optax
  from jax.sharding import PartitionSpec as P

  def body(params, state, x, y):
    params, state, x, y = jax.tree.map(lambda a: a[0], (params, state, x, y))
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, updates)
    return jax.tree.map(lambda a: a[None], (params, state, loss))

  return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS)))


def to_workers(tree, mesh, workers: int | None = None):
  """Host arrays onto the global mesh, split along the leading axis.

  With ``workers`` each leaf is first repeated along a new leading axis of that size.
  Every process passes the same values and keeps only its own devices' slices, so
  this works whether or not the mesh spans several processes.
  """
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  sharding = NamedSharding(mesh, P(AXIS))

  def put(a):
    a = np.asarray(a)
    if workers is not None:
      a = np.broadcast_to(a, (workers, *a.shape))
    return jax.make_array_from_callback(a.shape, sharding, lambda index: a[index])

  return jax.tree.map(put, tree)


def gather(tree):
  """Every worker's values, as NumPy, on every process (a collective: all must call)."""
  from jax.experimental import multihost_utils

  return jax.tree.map(np.asarray, multihost_utils.process_allgather(tree, tiled=True))


def train(config: Config, checkpoint_dir: str | None = None) -> dict:
  """Runs ``config.steps`` steps on all of the mesh's workers; returns host results.

  Call after :func:`configure` (and ``jax.distributed.initialize`` for several
  processes); every process calls it and every process gets the same results.
  """
  import lordo_jax

  workers = jax.device_count()
  mesh = jax.make_mesh((workers,), (AXIS,))
  tx = make_optimizer(config)
  step = make_step(tx, mesh)
  params0 = init_params(config.seed)
  params = to_workers(params0, mesh, workers)
  state = to_workers(jax.device_get(tx.init(params0)), mesh, workers)
  losses = []
  for t in range(config.steps):
    x, y = to_workers(global_batch(config, workers, t), mesh)
    params, state, loss = step(params, state, x, y)
    jax.block_until_ready((params, state, loss))  # jaxlib 0.10 CPU: one program at a time
    losses.append(loss)
  if checkpoint_dir is not None:
    from lordo_jax import checkpoint

    checkpoint.save(checkpoint_dir, config.steps, params, state)
  return {
    "params": gather(params),
    "losses": [float(loss.mean()) for loss in gather(losses)],
    "communicated_bytes": lordo_jax.communicated_bytes(jax.device_get(gather(state))),
    "workers": workers,
    "processes": jax.process_count(),
  }


def restore_and_gather(config: Config, checkpoint_dir: str) -> dict:
  """The params of a checkpoint written by :func:`train`, restored on this run's mesh."""
  from lordo_jax import checkpoint

  workers = jax.device_count()
  mesh = jax.make_mesh((workers,), (AXIS,))
  tx = make_optimizer(config)
  params0 = init_params(config.seed)
  params_like = to_workers(params0, mesh, workers)
  state_like = to_workers(jax.device_get(tx.init(params0)), mesh, workers)
  params, _ = checkpoint.restore(checkpoint_dir, config.steps, params_like, state_like)
  return gather(params)


def write_results(results: dict, out: pathlib.Path, restored: dict | None = None) -> None:
  out.mkdir(parents=True, exist_ok=True)
  np.savez(out / "result.npz", **results["params"])
  if restored is not None:
    np.savez(out / "restored.npz", **restored)
  summary = {k: v for k, v in results.items() if k != "params"}
  (out / "result.json").write_text(json.dumps(summary, indent=1))


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--num-processes", type=int, default=1)
  parser.add_argument("--process-id", type=int, default=0)
  parser.add_argument("--coordinator", default="127.0.0.1:12355", help="host:port of process 0")
  parser.add_argument("--local-devices", type=int, default=8, help="CPU devices per process")
  parser.add_argument("--steps", type=int, default=Config.steps)
  parser.add_argument("--sync-every", type=int, default=Config.sync_every)
  parser.add_argument("--out", required=True, help="where process 0 writes its results")
  parser.add_argument("--checkpoint-dir", help="save the final params and state here")
  parser.add_argument("--restore-from", help="also restore this run's checkpoint and report it")
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
  config = Config(steps=args.steps, sync_every=args.sync_every)
  results = train(config, checkpoint_dir=args.checkpoint_dir)
  restored = restore_and_gather(config, args.restore_from) if args.restore_from else None
  if jax.process_index() == 0:
    write_results(results, pathlib.Path(args.out), restored)
    print(
      f"{results['processes']} process(es) x {jax.local_device_count()} devices: "
      f"{results['workers']} workers, loss {results['losses'][0]:.4f} -> "
      f"{results['losses'][-1]:.4f}, {results['communicated_bytes']:,} bytes sent per worker",
      flush=True,
    )


if __name__ == "__main__":
  main()
