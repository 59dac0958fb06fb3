"""fault_tolerant=True: a failed or absent worker is left out of the averages."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import lordo_jax
from lordo_jax.round import _faults as faults_lib
from tests.helpers import workers

pytestmark = pytest.mark.timeout(300, method="thread")

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


# The parts of lordo_jax.round._faults, one by one.

STEPPED = optax.ScaleByAdamState(
  count=jnp.int32(4),
  mu={"w": jnp.array([0.5, -0.5]), "h": jnp.array([1.5], jnp.bfloat16)},
  nu={"w": jnp.array([0.25, 0.25]), "h": jnp.array([2.5], jnp.bfloat16)},
)
BEFORE = optax.ScaleByAdamState(
  count=jnp.int32(3),
  mu={"w": jnp.array([0.1, 0.2]), "h": jnp.array([0.75], jnp.bfloat16)},
  nu={"w": jnp.array([0.3, 0.4]), "h": jnp.array([0.5], jnp.bfloat16)},
)
UPDATES = {"w": jnp.array([-0.01, 0.02]), "h": jnp.array([0.03], jnp.bfloat16)}


def counts(round_ok=True, excluded=3, empty_syncs=1) -> faults_lib.FaultCounts:
  return faults_lib.FaultCounts(jnp.bool_(round_ok), jnp.int32(excluded), jnp.int32(empty_syncs))


def assert_trees_equal(got, expected):
  for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
    assert g.dtype == e.dtype
    np.testing.assert_array_equal(np.asarray(g, np.float64), np.asarray(e, np.float64))


def test_init_fault_counts_and_all_finite():
  start = faults_lib.init_fault_counts()
  assert bool(start.round_ok) and int(start.excluded) == 0 and int(start.empty_syncs) == 0
  assert bool(faults_lib.all_finite(UPDATES))
  for bad in (np.nan, np.inf, -np.inf):
    assert not bool(faults_lib.all_finite({**UPDATES, "w": jnp.array([0.0, bad])}))
  assert not bool(faults_lib.all_finite({**UPDATES, "h": jnp.array([np.nan], jnp.bfloat16)}))


def test_skip_non_finite_step_keeps_the_state_and_fails_the_round():
  grads = {"w": jnp.array([1.0, np.nan]), "h": jnp.array([1.0], jnp.bfloat16)}
  step = jax.jit(faults_lib.skip_non_finite_step)
  updates, state, after = step(grads, UPDATES, STEPPED, BEFORE, counts())
  assert_trees_equal(updates, jax.tree.map(jnp.zeros_like, UPDATES))
  assert_trees_equal(state.mu, BEFORE.mu)  # the floating-point state before the step
  assert_trees_equal(state.nu, BEFORE.nu)
  assert int(state.count) == 4  # counters advance with the other workers
  assert not bool(after.round_ok)
  assert (int(after.excluded), int(after.empty_syncs)) == (3, 1)  # counted at the sync


@pytest.mark.parametrize("round_ok", [True, False])
def test_skip_non_finite_step_keeps_a_finite_step(round_ok):
  grads = {"w": jnp.array([1.0, 2.0]), "h": jnp.array([1.0], jnp.bfloat16)}
  updates, state, after = faults_lib.skip_non_finite_step(
    grads, UPDATES, STEPPED, BEFORE, counts(round_ok)
  )
  assert_trees_equal(updates, UPDATES)
  assert_trees_equal(state, STEPPED)
  assert bool(after.round_ok) == round_ok  # a worker failed earlier stays failed


def test_keep_every_step_is_the_identity_even_on_nan():
  grads = {"w": jnp.array([np.nan, np.nan]), "h": jnp.array([np.inf], jnp.bfloat16)}
  updates, state, after = faults_lib.keep_every_step(grads, UPDATES, STEPPED, BEFORE, counts())
  assert_trees_equal(updates, UPDATES)
  assert_trees_equal(state, STEPPED)
  assert_trees_equal(after, counts())


def test_count_sync_rounds_the_workers_left_out():
  workers_count = 3
  # Shares as a float32 sync computes them: 2/3 rounds up in float32, so (1 - 2/3) M
  # is 0.99999994, counted as 1 worker (not 0, as a floor would).
  fractions = [1.0, 2 / 3, 0.0, 1 / 3]
  run = workers.on_workers(lambda c, f: faults_lib.count_sync(c, f, workers.AXIS), workers_count)
  state = workers.stack(counts(round_ok=True, excluded=0, empty_syncs=0), workers_count)
  state = state._replace(round_ok=np.array([True, False, False]))
  history = []
  for fraction in fractions:
    state = run(state, np.full(workers_count, fraction, np.float32))
    history.append((int(state.excluded[0]), int(state.empty_syncs[0])))
    np.testing.assert_array_equal(state.round_ok, [True] * workers_count)  # a new round
  assert history == [(0, 0), (1, 0), (4, 1), (6, 1)]


def test_count_sync_on_one_worker():
  after = faults_lib.count_sync(counts(False, 2, 0), jnp.float32(0.0), None)
  assert (bool(after.round_ok), int(after.excluded), int(after.empty_syncs)) == (True, 3, 1)
  after = faults_lib.count_sync(after, jnp.float32(1.0), None)
  assert (int(after.excluded), int(after.empty_syncs)) == (3, 1)
