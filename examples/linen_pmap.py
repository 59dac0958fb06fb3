r"""LoRDO with Flax Linen, ``jax.pmap`` and a ``TrainState``: the classic data-parallel loop.

    python3 examples/linen_pmap.py

The only change from a DDP training script is the optimizer:
``tx = lordo_jax.lordo(lr, rank=..., sync_every=..., axis_name="batch")`` instead of
``optax.adamw(lr)`` plus a ``jax.lax.pmean`` of the gradients. Each device is a worker:
it takes local steps on its own data and, every ``sync_every`` steps, LoRDO averages
the pseudo-gradient and the low-rank moments over the ``pmap`` axis.
``TrainState.apply_gradients`` already passes the params to ``tx.update``, which LoRDO
needs.

The task: a Linen MLP classifying points drawn around 10 random class centres; each
device sees its own samples.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # CPU LAPACK, one thread per device.

import argparse  # noqa: E402
import functools  # noqa: E402

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import flax.linen as nn  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax.training import train_state  # noqa: E402

import lordo_jax  # noqa: E402

NUM_CLASSES, DIM = 10, 64


class MLP(nn.Module):
  hidden: int = 128

  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Dense(self.hidden)(x))
    x = nn.relu(nn.Dense(self.hidden)(x))
    return nn.Dense(NUM_CLASSES)(x)


def make_data(rng: np.random.Generator, centres: np.ndarray, n: int):
  labels = rng.integers(0, NUM_CLASSES, n)
  points = centres[labels] + rng.normal(size=(n, DIM)) * 2.0
  return points.astype(np.float32), labels.astype(np.int32)


@functools.partial(jax.pmap, axis_name="batch")
def train_step(state: train_state.TrainState, x, y):
  def loss_fn(params):
    logits = state.apply_fn({"params": params}, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  loss, grads = jax.value_and_grad(loss_fn)(state.params)
  return state.apply_gradients(grads=grads), loss  # No pmean of the gradients: LoRDO syncs.


@jax.jit
def accuracy(params, x, y):
  return jnp.mean(jnp.argmax(MLP().apply({"params": params}, x), -1) == y)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--steps", type=int, default=256, help="training steps")
  parser.add_argument("--batch", type=int, default=32, help="examples per device per step")
  parser.add_argument("--rank", type=int, default=16, help="LoRDO rank")
  parser.add_argument("--sync-every", type=int, default=16, help="steps between syncs")
  args = parser.parse_args(argv)

  devices = jax.local_device_count()
  rng = np.random.default_rng(0)
  centres = rng.normal(size=(NUM_CLASSES, DIM)).astype(np.float32)
  params = MLP().init(jax.random.key(0), jnp.zeros((1, DIM)))["params"]
  tx = lordo_jax.lordo(3e-3, rank=args.rank, sync_every=args.sync_every, axis_name="batch")
  state = train_state.TrainState.create(apply_fn=MLP().apply, params=params, tx=tx)
  state = jax.tree.map(lambda a: np.stack([a] * devices), state)  # One copy per device.
  test_x, test_y = make_data(rng, centres, 2048)

  for step in range(1, args.steps + 1):
    x, y = make_data(rng, centres, devices * args.batch)
    x, y = x.reshape(devices, args.batch, DIM), y.reshape(devices, args.batch)
    state, loss = train_step(state, x, y)
    jax.block_until_ready((state, loss))  # One multi-device program at a time on CPU.
    if step % args.sync_every == 0 and step % (args.steps // 4 or 1) < args.sync_every:
      params0 = jax.tree.map(lambda a: a[0], state.params)  # After a sync all agree.
      print(
        f"step {step:4d}  train loss {np.asarray(loss).mean():.3f}  "
        f"test accuracy {float(accuracy(params0, test_x, test_y)):.3f}  "
        f"sent {lordo_jax.communicated_bytes(state.opt_state)} bytes per worker"
      )
  params = jax.device_get(state.params)
  spread = max(float(np.abs(a - a[0]).max()) for a in jax.tree.leaves(params))
  synced = " (synced)" if args.steps % args.sync_every == 0 else ""
  print(f"{devices} workers, parameter spread across workers: {spread:.1e}{synced}")


if __name__ == "__main__":
  main()
