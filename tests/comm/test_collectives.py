"""The ledger counts exactly what the compiled program all-reduces (MATH.md §7)."""

import jax
import jax.numpy as jnp
import pytest

import lordo_jax
from lordo_jax.comm import _collectives as collectives
from tests.helpers import hlo
from tests.helpers import workers

M = 4
RANK = 2
PARAMS = {"w": jnp.ones((12, 6)), "v": jnp.ones((5, 10)), "b": jnp.zeros(6)}


def loss(params, batch):
  h = batch @ params["w"] + params["b"]
  return jnp.sum(jnp.tanh(h) ** 2) + jnp.sum((params["v"] @ batch.T[:10, :5]) ** 2)


def batches(steps):
  keys = jax.random.split(jax.random.key(0), steps)
  return [jax.random.normal(k, (M, 7, 12)) for k in keys]


def spec_payloads():
  """(pseudo-gradient, moments, first gradient) elements per sync, from MATH.md §7."""
  # w: 12 x 6, left: pq + 2rq. v: 5 x 10, right: pq + 2rp. b: full-rank, 8 + 2 * 6.
  delta = 12 * 6 + 5 * 10 + 6
  moments = 2 * RANK * 6 + 2 * RANK * 5 + 2 * 6
  first_gradient = 12 * 6 + 5 * 10
  return delta, moments, first_gradient


def compiled_text(tx, steps=2):
  history, step = workers.run(tx, loss, PARAMS, batches(steps), M)
  params, state = history[-1]
  return history, step.lower(
    params, state, workers.shard(batches(1)[0], step_mesh())
  ).compile().as_text()


def step_mesh():
  return jax.make_mesh((M,), (workers.AXIS,))


def test_limbs_count_past_int32():
  ledger = collectives.init_ledger()
  for _ in range(3):
    ledger = collectives.record(ledger, jax.ShapeDtypeStruct((1_000_000_000,), jnp.float32))
  assert collectives.ledger_total(ledger) == (3_000_000_000, 12_000_000_000)


def test_every_branch_firing_sends_what_the_ledger_says():
  """sync_every=1: step 1 runs every conditional, so it sends every all-reduce."""
  tx = lordo_jax.lordo(1e-2, rank=RANK, sync_every=1, axis_name=workers.AXIS)
  history, text = compiled_text(tx)
  found = hlo.collectives_by_depth(text)
  assert 0 not in found, "an all-reduce outside a conditional runs on every step"
  program_elements = sum(e for depth in found.values() for e, _ in depth)
  program_bytes = sum(b for depth in found.values() for _, b in depth)
  first = history[0][1]
  assert lordo_jax.communicated_elements(first) == program_elements
  assert lordo_jax.communicated_bytes(first) == program_bytes
  delta, moments, first_gradient = spec_payloads()
  assert program_elements == delta + moments + first_gradient
  second = history[1][1]
  assert lordo_jax.communicated_elements(second) - program_elements == delta + moments


@pytest.mark.parametrize("sync_every,moments_every", [(3, 2)])
def test_ledger_follows_the_schedule_of_the_compiled_branches(sync_every, moments_every):
  tx = lordo_jax.lordo(
    1e-2,
    rank=RANK,
    sync_every=sync_every,
    sync_moments_every=moments_every,
    init_projection="random",
    axis_name=workers.AXIS,
  )
  steps = 13
  history, step = workers.run(tx, loss, PARAMS, batches(steps), M)
  params, state = history[-1]
  text = step.lower(params, state, workers.shard(batches(1)[0], step_mesh())).compile().as_text()
  found = hlo.collectives_by_depth(text)
  assert sorted(found) == [1, 2]
  round_bytes = sum(b for _, b in found[1])
  moment_bytes = sum(b for _, b in found[2])
  delta, moments, _ = spec_payloads()
  assert (sum(e for e, _ in found[1]), sum(e for e, _ in found[2])) == (delta, moments)
  sent = [lordo_jax.communicated_bytes(s) for _, s in history]
  for t in range(1, steps + 1):
    syncs = t // sync_every
    expected = syncs * round_bytes + (syncs // moments_every) * moment_bytes
    assert sent[t - 1] == expected, f"step {t}"
  assert lordo_jax.all_reduce_count(state) == 4 + 2


def test_single_worker_sends_nothing():
  tx = lordo_jax.lordo(1e-2, rank=RANK, sync_every=1)
  state = tx.init(PARAMS)
  grads = jax.tree.map(jnp.ones_like, PARAMS)
  _, state = jax.jit(tx.update)(grads, state, PARAMS)
  assert lordo_jax.communicated_bytes(state) == 0
