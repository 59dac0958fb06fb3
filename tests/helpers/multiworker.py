"""Run an optax transformation on M simulated workers (shared by the LoRDO tests).

Each worker holds its own copy of the parameters and optimizer state, stacked along
a leading axis of size M and sharded over a one-axis mesh named ``workers``; the
step is one jitted ``shard_map`` (or ``pmap``) program. The loss is the per-worker
least squares of ``lordo_reference.make_regression``, whose gradient is written out
by hand so that the NumPy reference computes the same mathematics.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

AXIS = "workers"


def regression_grads(params, x, y):
  """Gradient of 0.5 ||X W + 1 b^T - Y||^2 (same formula as the reference)."""
  r = x @ params["w"] + params["b"] - y
  return {"w": x.T @ r, "b": r.sum(axis=0)}


def stack(tree, num_workers: int):
  """M identical copies of ``tree`` along a new leading axis."""
  return jax.tree.map(lambda a: jnp.stack([jnp.asarray(a)] * num_workers), tree)


def unstack(tree, num_workers: int) -> list:
  """The M per-worker trees of a stacked tree, as float64 NumPy arrays."""
  host = jax.tree.map(lambda a: np.asarray(a, np.float64), tree)
  return [jax.tree.map(lambda a, m=m: a[m], host) for m in range(num_workers)]


def _local_step(tx):
  def step(params, state, x, y):
    grads = regression_grads(params, x, y)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  return step


class Workers:
  """M workers running ``tx``; each step takes per-worker data (M, n, p), (M, n, q).

  ``mode="shard_map"`` runs one ``jax.shard_map`` program over a mesh axis
  ``workers`` (the leading axis is squeezed inside the body); ``mode="pmap"``
  maps the same local step with ``jax.pmap(axis_name="workers")``. The step is
  compiled once; every call blocks until its outputs are ready (a multi-device
  CPU program launched before the previous one finished can deadlock in jaxlib
  0.10).
  """

  def __init__(self, tx, params, num_workers: int, mode: str = "shard_map"):
    self.num_workers = m = num_workers
    self.tx = tx
    local = _local_step(tx)
    params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
    stacked_params = stack(params, m)
    stacked_state = stack(tx.init(params), m)
    if mode == "shard_map":
      mesh = jax.make_mesh((m,), (AXIS,))
      spec = P(AXIS)
      sharding = NamedSharding(mesh, spec)
      state_spec = jax.tree.map(lambda _: spec, stacked_state)

      def body(params, state, x, y):
        squeeze = lambda t: jax.tree.map(lambda a: a[0], t)
        expand = lambda t: jax.tree.map(lambda a: a[None], t)
        new_params, new_state = local(squeeze(params), squeeze(state), x[0], y[0])
        return expand(new_params), expand(new_state)

      self._step = jax.jit(
        jax.shard_map(
          body, mesh=mesh, in_specs=(spec, state_spec, spec, spec), out_specs=(spec, state_spec)
        )
      )
      self._put = lambda t: jax.device_put(t, sharding)
    elif mode == "pmap":
      self._step = jax.pmap(local, axis_name=AXIS)
      self._put = lambda t: t
    else:
      raise ValueError(mode)
    self.params, self.state = self._put(stacked_params), self._put(stacked_state)

  def step(self, x, y):
    """One optimizer step on every worker (worker m sees ``x[m]``, ``y[m]``)."""
    data = self._put((jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)))
    self.params, self.state = self._step(self.params, self.state, *data)
    jax.block_until_ready((self.params, self.state))
    return self.params

  def worker_params(self) -> list:
    """Per-worker parameters as float64 NumPy dicts."""
    return unstack(self.params, self.num_workers)

  def worker_state(self, m: int = 0):
    """Worker m's optimizer state (a pytree like ``tx.init``'s), on the host."""
    return jax.tree.map(lambda a: jax.device_get(a)[m], self.state)


class SingleDevice:
  """One worker, ``axis_name=None``: the plain jitted local step."""

  def __init__(self, tx, params):
    params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
    self._step = jax.jit(_local_step(tx))
    self.params, self.state = params, tx.init(params)

  def step(self, x, y):
    """One optimizer step on data ``x`` (n, p), ``y`` (n, q)."""
    x, y = jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)
    self.params, self.state = self._step(self.params, self.state, x, y)
    jax.block_until_ready((self.params, self.state))
    return self.params
