"""The two-layer MLP the sharded-worker tests train: ``tanh(x up + bias) down``, 16 -> 24
-> 16, regressing a fixed linear map of its input, with the worker axis first and the
layouts that split it inside each worker group."""

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

AXIS = "workers"
# 2-way FSDP: each matrix split on one dimension, the bias with it.
FSDP_SPECS = {"up": P(AXIS, "fsdp", None), "down": P(AXIS, None, "fsdp"), "bias": P(AXIS, "fsdp")}


def params():
  keys = jax.random.split(jax.random.key(0), 2)
  return {
    "up": jax.random.normal(keys[0], (16, 24)) / 4,
    "down": jax.random.normal(keys[1], (24, 16)) / 5,
    "bias": jnp.zeros((24,)),
  }


def _matmul(a, b):
  """``a @ b``; with ``Explicit`` axes a sum over a sharded inner dimension is made
  whole (an all-reduce inside the worker, as in Megatron's row-parallel layer)."""
  sharded = any(axes is not None for axes in jax.typeof(a).sharding.spec)
  return jnp.matmul(a, b, out_sharding=P() if sharded else None)


def loss(params, batch):
  x, y = batch
  hidden = jnp.tanh(x @ params["up"] + params["bias"])
  return jnp.mean((_matmul(hidden, params["down"]) - y) ** 2)


def batch(t: int, workers: int):
  """Step ``t``'s batch: 8 inputs per worker, each worker's different."""
  x = jax.random.normal(jax.random.key(100 + t), (workers, 8, 16))
  return x, x @ (jax.random.normal(jax.random.key(1), (16, 16)) / 4)
