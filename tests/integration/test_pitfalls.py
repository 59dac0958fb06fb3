"""The multi-worker traps a user can fall into, each an error, made safe, or measurable.

Each test here failed before the library caught its case: an apply_if_finite that lets
one worker skip a sync, a transformation after the method, ``axis_name=None`` inside a
worker ``shard_map``, a rank at or above every matrix's smaller side, a sync rule that never
syncs, an offloaded state placed in device memory, and ``count`` in a state.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import lordo_jax
from tests.helpers import workers as workers_lib

WORKERS = 4
PARAMS = {"w": jax.random.normal(jax.random.key(0), (16, 8)), "b": jnp.zeros(8)}


def loss(params, x):
  return jnp.mean((x @ params["w"] + params["b"]) ** 2)


def batches(steps):
  return [jax.random.normal(jax.random.key(100 + t), (WORKERS, 4, 16)) for t in range(steps)]


def shard_map_step(tx, mesh):
  def body(params, state, x):
    params, state, x = jax.tree.map(lambda a: a[0], (params, state, x))
    updates, state = tx.update(jax.grad(loss)(params, x), state, params)
    params = optax.apply_updates(params, updates)
    spread = lordo_jax.worker_disagreement(params, workers_lib.AXIS)
    return jax.tree.map(lambda a: a[None], (params, state, spread))

  specs = P(workers_lib.AXIS)
  return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=specs))


def placed(tree, mesh):
  return workers_lib.shard(workers_lib.stack(tree, WORKERS), mesh)


@pytest.mark.parametrize(
  "make",
  [
    lambda: lordo_jax.lordo(1e-2, rank=2, sync_every=2, axis_name=workers_lib.AXIS),
    lambda: lordo_jax.lordo(
      1e-2, rank=2, sync_every=2, axis_name=workers_lib.AXIS, fault_tolerant=True
    ),
    lambda: lordo_jax.diloco(1e-2, sync_every=2, axis_name=workers_lib.AXIS),
    lambda: lordo_jax.ddp(1e-2, axis_name=workers_lib.AXIS),
  ],
  ids=["lordo", "lordo_fault_tolerant", "diloco", "ddp"],
)
def test_apply_if_finite_around_a_communicating_method_is_refused_at_trace_time(make):
  """A NaN on one worker would skip its update alone: a missed collective, then rounds
  out of step (XLA aborts the process after 40 s). Refused before anything runs."""
  mesh = jax.make_mesh((WORKERS,), (workers_lib.AXIS,))
  tx = optax.apply_if_finite(make(), max_consecutive_errors=3)
  step = shard_map_step(tx, mesh)
  with pytest.raises(ValueError, match="fault_tolerant=True"):
    step.lower(placed(PARAMS, mesh), placed(tx.init(PARAMS), mesh), placed(batches(1)[0][0], mesh))


def test_apply_if_finite_after_the_average_is_accepted():
  mesh = jax.make_mesh((WORKERS,), (workers_lib.AXIS,))
  tx = optax.chain(
    lordo_jax.average_gradients(workers_lib.AXIS), optax.apply_if_finite(optax.adam(1e-2), 3)
  )
  step = shard_map_step(tx, mesh)
  step.lower(placed(PARAMS, mesh), placed(tx.init(PARAMS), mesh), placed(batches(1)[0][0], mesh))


def spreads(tx, steps=4):
  """The workers' disagreement after each of ``steps`` steps on different data."""
  mesh = jax.make_mesh((WORKERS,), (workers_lib.AXIS,))
  step = shard_map_step(tx, mesh)
  params, state = placed(PARAMS, mesh), placed(tx.init(PARAMS), mesh)
  found = []
  for x in batches(steps):
    params, state, spread = jax.block_until_ready(step(params, state, workers_lib.shard(x, mesh)))
    found.append(float(np.asarray(spread)[0]))
  return found


def test_worker_disagreement_flags_a_transformation_after_lordo():
  lordo = lambda: lordo_jax.lordo(1e-2, rank=2, sync_every=2, axis_name=workers_lib.AXIS)  # noqa: E731
  alone = spreads(lordo())
  after = spreads(optax.chain(lordo(), optax.scale(0.5)))
  # Steps 2 and 4 end in a sync: the workers agree to float32 rounding...
  assert alone[1] < 1e-6 and alone[3] < 1e-6
  # ...and part between syncs, on their own data.
  assert alone[0] > 1e-4
  # A scale after lordo halves the landing step: they part at the sync too.
  assert after[1] > 1e-3 and after[3] > 1e-3


def test_worker_disagreement_is_zero_for_equal_workers_and_counts_every_leaf():
  call = workers_lib.on_workers(
    lambda tree: lordo_jax.worker_disagreement(tree, workers_lib.AXIS), WORKERS
  )
  same = {"a": np.ones((WORKERS, 3)), "b": np.full((WORKERS, 2), -2.0)}
  assert float(call(same)[0]) == 0.0
  one_off = {"a": np.ones((WORKERS, 3)), "b": np.full((WORKERS, 2), -2.0)}
  one_off["b"][2, 1] = -2.5  # worker 2, leaf b: sums -4.5 and 10.25 against -4 and 8
  assert float(call(one_off)[0]) == pytest.approx(max(0.5 / 4.5, 2.25 / 10.25), rel=1e-6)


@pytest.mark.parametrize("wrap", ["shard_map", "pmap"])
def test_axis_name_none_inside_a_worker_map_is_refused(wrap):
  tx = lordo_jax.lordo(1e-2, rank=2, sync_every=2)  # axis_name forgotten

  def body(params, state):
    return tx.update(params, state, params)

  stacked = (workers_lib.stack(PARAMS, WORKERS), workers_lib.stack(tx.init(PARAMS), WORKERS))
  if wrap == "pmap":
    mapped = jax.pmap(body, axis_name="workers", devices=jax.devices()[:WORKERS])
  else:
    mesh = jax.make_mesh((WORKERS,), (workers_lib.AXIS,))
    one = lambda f: (
      lambda *a: jax.tree.map(  # noqa: E731
        lambda x: x[None], f(*jax.tree.map(lambda x: x[0], a))
      )
    )
    mapped = jax.jit(
      jax.shard_map(one(body), mesh=mesh, in_specs=P("workers"), out_specs=P("workers"))
    )
    stacked = workers_lib.shard(stacked, mesh)
  with pytest.raises(ValueError, match="axis_name=None, but update.. runs inside"):
    mapped(*stacked)


def test_axis_name_none_under_vmap_is_one_worker_per_model():
  """vmap (an ensemble of models) binds no manual axis: accepted, as before. (Each
  program jitted: the check reads the trace's axes, op by op or compiled alike.)"""
  tx = lordo_jax.lordo(1e-2, rank=2, sync_every=2)
  stacked = (workers_lib.stack(PARAMS, 3), workers_lib.stack(tx.init(PARAMS), 3))
  updates, _ = jax.jit(jax.vmap(lambda p, s: tx.update(p, s, p)))(*stacked)
  single, _ = jax.jit(tx.update)(PARAMS, tx.init(PARAMS), PARAMS)
  np.testing.assert_allclose(updates["w"][1], single["w"], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
  "make",
  [
    lambda rank: lordo_jax.lordo(1e-2, rank=rank, sync_every=2),
    lambda rank: lordo_jax.lordo_local_projection(1e-2, rank=rank, sync_every=2),
    lambda rank: lordo_jax.low_rank_ddp(1e-2, rank=rank),
    lambda rank: lordo_jax.low_rank_ddp(1e-2, rank=rank, communicate="projected"),
  ],
  ids=["lordo", "lordo_local_projection", "low_rank_ddp", "low_rank_ddp_projected"],
)
def test_a_rank_that_leaves_no_matrix_low_rank_is_refused(make):
  """Matrices that are all at or below the rank: refused, not a quiet full-rank run.
  (Parameters with no 2-D leaf at all warn and train as the full-rank counterpart:
  ``tests/methods/test_params_without_a_matrix.py``.)"""
  with pytest.raises(ValueError, match=r"rank=8 leaves no matrix low-rank.*16 x 8"):
    make(8).init(PARAMS)
  state = make(7).init(PARAMS)  # One below the smaller side: the matrix is low-rank.
  assert lordo_jax.projections(state)["w"].shape == (16, 7)


def test_a_sync_rule_that_starts_at_a_rate_of_zero_warns_and_its_fix_syncs():
  schedule = optax.warmup_cosine_decay_schedule(0.0, 1e-2, 8, 100)
  with pytest.warns(UserWarning, match="pass warmup_steps"):
    rule = lordo_jax.quadratic_sync_rule(2, 0.01, schedule)
  assert lordo_jax.sync_steps(rule, 50) == []  # What the warning is about.
  with pytest.warns(UserWarning, match="first round of 1,073,741,824 steps"):
    lordo_jax.lordo(schedule, rank=2, sync_every=rule)
  with pytest.warns(UserWarning, match="first round"):
    lordo_jax.synchronize(optax.adam(1e-2), sync_every=lambda step: jnp.asarray(2**20))
  fixed = lordo_jax.quadratic_sync_rule(2, 0.01, schedule, warmup_steps=8)
  assert lordo_jax.sync_steps(fixed, 8) == [2, 4, 6, 8]


def test_a_sync_rule_that_syncs_gives_no_warning(recwarn):
  lordo_jax.lordo(1e-2, rank=2, sync_every=lordo_jax.quadratic_sync_rule(2, 0.01, 1e-2))
  lordo_jax.lordo(1e-2, rank=2, sync_every=4)
  # A first round of 3 steps against a base of 2 is the rule at work, not a trap.
  rule = lordo_jax.quadratic_sync_rule(2, 1.8, lambda step: jnp.asarray(1.0))
  assert lordo_jax.sync_steps(rule, 6) == [3, 6]
  assert not [w for w in recwarn if issubclass(w.category, UserWarning)]


@pytest.mark.no_compilation_cache
def test_offload_accepts_a_state_placed_in_device_memory():
  """The Flax guide's first placement (device_put of a stacked init) with offload=True."""
  mesh = jax.make_mesh((WORKERS,), (workers_lib.AXIS,))
  results = {}
  for offload in (False, True):
    tx = lordo_jax.lordo(1e-2, rank=2, sync_every=2, axis_name=workers_lib.AXIS, offload=offload)
    step = shard_map_step(tx, mesh)
    params, state = placed(PARAMS, mesh), placed(tx.init(PARAMS), mesh)
    assert state.anchor["w"].sharding.memory_kind == "device"
    for x in batches(3):
      params, state, _ = jax.block_until_ready(step(params, state, workers_lib.shard(x, mesh)))
    results[offload] = (params, state)
  assert results[True][1].anchor["w"].sharding.memory_kind == "pinned_host"
  for a, b in zip(
    jax.tree.leaves(results[False][0]), jax.tree.leaves(results[True][0]), strict=True
  ):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize(
  "make",
  [
    lambda: lordo_jax.lordo(1e-2, rank=2, sync_every=2),
    lambda: lordo_jax.low_rank_ddp(1e-2, rank=2),
    lambda: optax.inject_hyperparams(lordo_jax.lordo, static_args=("rank", "sync_every"))(
      1e-2, rank=2, sync_every=2
    ),
  ],
  ids=["lordo", "low_rank_ddp", "inject_hyperparams"],
)
def test_step_count_reads_the_one_count_tree_get_cannot(make):
  tx = make()
  state = tx.init(PARAMS)
  with pytest.raises(KeyError, match="multiple values for 'count'"):
    optax.tree_utils.tree_get(state, "count")
  update = jax.jit(tx.update)
  for _ in range(3):
    _, state = update(PARAMS, state, PARAMS)
  assert int(lordo_jax.step_count(state)) == 3
