"""fault_tolerant=True: a failed or absent worker is left out of the averages."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

import lordo_jax
from tests import workers

M = 4
PARAMS = {"w": jnp.ones((12, 6)) * 0.1, "b": jnp.zeros(6)}
STEPS, SYNC_EVERY, BAD_WORKER = 9, 3, 2
NAN_STEPS = (2, 3, 4)  # across the sync at step 3


def loss(params, x):
  return jnp.sum(jnp.tanh(x @ params["w"] + params["b"]) ** 2)


def run(tx, poison: bool, absent_at: tuple[int, ...], absent_workers=(BAD_WORKER,)):
  """Per-step params; worker BAD_WORKER gets NaN gradients (``poison``) on NAN_STEPS,
  and ``absent_workers`` are marked absent on the steps ``absent_at``."""
  mesh = jax.make_mesh((M,), (workers.AXIS,))

  def body(params, state, x, nan, present):
    params, state, x, nan, present = jax.tree.map(lambda a: a[0], (params, state, x, nan, present))
    grads = jax.grad(loss)(params, x)
    grads = jax.tree.map(lambda g: jnp.where(nan, jnp.nan, g), grads)
    updates, state = tx.update(grads, state, params, worker_present=present)
    return jax.tree.map(lambda a: a[None], (optax.apply_updates(params, updates), state))

  step = jax.jit(
    jax.shard_map(body, mesh=mesh, in_specs=P(workers.AXIS), out_specs=P(workers.AXIS))
  )
  state = workers.shard(workers.stack(tx.init(PARAMS), M), mesh)
  params = workers.shard(workers.stack(PARAMS, M), mesh)
  history = []
  for t in range(1, STEPS + 1):
    x = jax.random.normal(jax.random.key(t), (M, 5, 12))
    nan = (jnp.arange(M) == BAD_WORKER) & (poison and t in NAN_STEPS)
    present = ~(jnp.isin(jnp.arange(M), jnp.asarray(absent_workers)) & (t in absent_at))
    params, state = step(params, state, *workers.shard((x, nan, present), mesh))
    jax.block_until_ready((params, state))
    history.append((jax.device_get(params), jax.device_get(state)))
  return history


def optimizer():
  return lordo_jax.lordo(
    1e-2, rank=2, sync_every=SYNC_EVERY, axis_name=workers.AXIS, fault_tolerant=True
  )


def test_nan_worker_is_left_out_like_an_absent_one_and_counted():
  poisoned = run(optimizer(), poison=True, absent_at=())
  absent = run(optimizer(), poison=False, absent_at=(3, 6))
  others = [m for m in range(M) if m != BAD_WORKER]
  for t, ((p_nan, _), (p_absent, _)) in enumerate(zip(poisoned, absent, strict=True), 1):
    for name in PARAMS:
      np.testing.assert_allclose(
        p_nan[name][others], p_absent[name][others], atol=1e-6, err_msg=f"step {t}"
      )
  final_params, final_state = poisoned[-1]
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(final_params))
  # After the second sync every worker, the failed one too, holds the same params.
  for name in PARAMS:
    np.testing.assert_allclose(final_params[name], absent[-1][0][name], atol=1e-6)
  faults = final_state.faults
  np.testing.assert_array_equal(faults.excluded, [2] * M)
  np.testing.assert_array_equal(faults.empty_syncs, [0] * M)
  # Workers really left out: the average without worker 2 differs from the full one.
  everyone = run(optimizer(), poison=False, absent_at=())
  assert np.max(np.abs(everyone[2][0]["w"][0] - absent[2][0]["w"][0])) > 1e-5


def test_a_sync_with_nobody_present_keeps_the_anchor():
  history = run(optimizer(), poison=False, absent_at=(SYNC_EVERY,), absent_workers=range(M))
  params, state = history[SYNC_EVERY - 1]
  for name in PARAMS:
    np.testing.assert_allclose(params[name], np.stack([PARAMS[name]] * M), atol=1e-7)
  np.testing.assert_array_equal(state.faults.empty_syncs, [1] * M)
  np.testing.assert_array_equal(state.faults.excluded, [M] * M)
  # The next round starts from the anchor and synchronises normally.
  params, state = history[2 * SYNC_EVERY - 1]
  assert np.max(np.abs(params["w"] - PARAMS["w"])) > 1e-4
  np.testing.assert_array_equal(state.faults.empty_syncs, [1] * M)


def test_worker_present_needs_fault_tolerance():
  tx = lordo_jax.lordo(1e-2, rank=2, sync_every=2)
  state = tx.init(PARAMS)
  try:
    tx.update(PARAMS, state, PARAMS, worker_present=False)
  except ValueError as error:
    assert "fault_tolerant=True" in str(error)
  else:
    raise AssertionError("worker_present was silently ignored")
