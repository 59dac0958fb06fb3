"""Runs an optimizer on M simulated workers with shard_map, for the tests.

Params and optimizer state carry a leading worker axis; the step body sees one
worker's slice. Every step waits for its outputs (jaxlib 0.10 CPU deadlocks when
several multi-device executions are in flight).
"""

import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec as P

AXIS = "workers"


def stack(tree, workers: int):
  """``tree`` repeated along a new leading worker axis."""
  return jax.tree.map(lambda x: jnp.stack([x] * workers), tree)


def shard(tree, mesh):
  """Puts every leaf on the mesh, split along its leading (worker) axis."""

  def put(x):
    spec = P(AXIS, *([None] * (x.ndim - 1)))
    return jax.device_put(x, jax.NamedSharding(mesh, spec))

  return jax.tree.map(put, tree)


def make_step(tx, loss_fn, mesh):
  """A jitted shard_map step: ``(params, state, batch) -> (params, state)``."""

  def body(params, state, batch):
    params, state, batch = jax.tree.map(lambda x: x[0], (params, state, batch))
    grads = jax.grad(loss_fn)(params, batch)
    updates, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, updates)
    return jax.tree.map(lambda x: x[None], (params, state))

  return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS)))


def run(tx, loss_fn, params, batches, workers: int):
  """Runs ``len(batches)`` steps; ``batches[t]`` has a leading worker axis.

  Returns the list of (params, state) after every step, and the jitted step.
  """
  mesh = jax.make_mesh((workers,), (AXIS,))
  step = make_step(tx, loss_fn, mesh)
  state = shard(stack(tx.init(params), workers), mesh)
  params = shard(stack(params, workers), mesh)
  history = []
  for batch in batches:
    params, state = step(params, state, shard(batch, mesh))
    jax.block_until_ready((params, state))
    history.append((params, state))
  return history, step


def on_workers(fn, workers: int):
  """``fn``, written for one worker, run on ``workers`` simulated workers.

  The returned function takes ``fn``'s arguments with a leading worker axis and
  returns its results, on the host, with the same axis; ``fn`` runs inside one
  jitted ``shard_map`` over the axis ``AXIS``, and each call waits for its outputs.
  """
  mesh = jax.make_mesh((workers,), (AXIS,))

  def body(*args):
    args = jax.tree.map(lambda x: x[0], args)
    return jax.tree.map(lambda x: x[None], fn(*args))

  mapped = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS)))

  def call(*args):
    out = mapped(*shard(args, mesh))
    jax.block_until_ready(out)
    return jax.device_get(out)

  return call


def ledger_numbers(ledger) -> tuple[int, int, int]:
  """(elements, bytes, all-reduces) of worker 0's ledger, from a stacked
  :class:`lordo_jax.comm._collectives.Ledger` (its int32 limbs: low + high * 2**20)."""
  value = lambda limbs: int(limbs[0, 0]) + int(limbs[0, 1]) * 2**20  # noqa: E731
  return value(ledger.elements), value(ledger.bytes), int(ledger.all_reduces[0])
