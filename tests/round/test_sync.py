"""Synchronisation (MATH.md §4): agreement, averaging, one-worker and pmap equivalence.

* After every sync all workers hold the same parameters, and with the default
  outer optimizer they are the mean of the workers' local parameters (what each
  worker would have after its local step, computed by stepping the same state
  with a transformation that never syncs).
* M workers fed identical data follow exactly the one-device run with
  ``axis_name=None``.
* ``jax.pmap`` and ``jax.shard_map`` compute the same thing.

Every loop here steps through ``multiworker.Workers.step``, which waits on each step
(``jax.block_until_ready``): jaxlib 0.10's CPU collectives deadlock with several steps
in flight.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lordo_jax
from tests.helpers import multiworker
from tests.references import lordo_reference as ref

NUM_WORKERS = 4
STEPS = 9
SYNC_EVERY = 3
RANK = 2
LR = 0.02
NEVER = 10**6  # a sync_every that is never reached


def _problem(shape=(12, 8), seed=0):
  p, q = shape
  data = ref.make_regression(p, q, NUM_WORKERS, STEPS, seed=seed)
  return ref.initial_params(p, q, seed), data["x"], data["y"]


def _spread(worker_params, leaf):
  """Largest difference between any worker's leaf and worker 0's."""
  return max(np.max(np.abs(w[leaf] - worker_params[0][leaf])) for w in worker_params)


@pytest.mark.parametrize(
  "options",
  [
    {},
    {"projection": "dct", "error_feedback": True, "weight_decay": 0.1},
  ],
  ids=["default", "dct-ef-wd"],
)
def test_sync_averages_local_parameters(options):
  params, x, y = _problem()
  kwargs = {"rank": RANK, "axis_name": "workers", **options}
  workers = multiworker.Workers(
    lordo_jax.lordo(LR, sync_every=SYNC_EVERY, **kwargs), params, NUM_WORKERS
  )
  local_only = multiworker.Workers(
    lordo_jax.lordo(LR, sync_every=NEVER, **kwargs), params, NUM_WORKERS
  )
  for t in range(1, STEPS + 1):
    if t % SYNC_EVERY == 0:  # the local step from the same parameters and state
      local_only.params, local_only.state = workers.params, workers.state
      local_only.step(x[t - 1], y[t - 1])
      local = local_only.worker_params()
    workers.step(x[t - 1], y[t - 1])
    got = workers.worker_params()
    if t % SYNC_EVERY:  # between syncs the workers drift apart
      assert _spread(got, "w") > 1e-3, f"workers should differ at step {t}"
      continue
    assert _spread(local, "w") > 1e-3, "local steps should differ"
    for leaf in ("w", "b"):
      mean = np.mean([w[leaf] for w in local], axis=0)
      for m, w in enumerate(got):
        np.testing.assert_allclose(
          w[leaf], got[0][leaf], rtol=0, atol=1e-6, err_msg=f"step {t}, worker {m}, {leaf}"
        )
        np.testing.assert_allclose(
          w[leaf], mean, rtol=0, atol=1e-6, err_msg=f"step {t}, worker {m}, {leaf}"
        )


@pytest.mark.parametrize(
  "options",
  [
    {},
    {
      "projection": "subspace_iteration",
      "error_feedback": True,
      "full_rank_scale": "vector",
      "transport": "keep",
    },
  ],
  ids=["default", "subspace-ef-vector-keep"],
)
def test_identical_data_matches_one_device(options):
  params, x, y = _problem()
  x = np.broadcast_to(x[:, :1], x.shape)  # every worker sees worker 0's data
  y = np.broadcast_to(y[:, :1], y.shape)
  kwargs = {"rank": RANK, "sync_every": SYNC_EVERY, **options}
  workers = multiworker.Workers(
    lordo_jax.lordo(LR, axis_name="workers", **kwargs), params, NUM_WORKERS
  )
  single = multiworker.SingleDevice(lordo_jax.lordo(LR, axis_name=None, **kwargs), params)
  for t in range(1, STEPS + 1):
    workers.step(x[t - 1], y[t - 1])
    single.step(x[t - 1, 0], y[t - 1, 0])
    want = {k: np.asarray(v, np.float64) for k, v in single.params.items()}
    for m, got in enumerate(workers.worker_params()):
      for leaf in ("w", "b"):
        np.testing.assert_allclose(
          got[leaf], want[leaf], rtol=1e-6, atol=1e-6, err_msg=f"step {t}, worker {m}, {leaf}"
        )
  np.testing.assert_allclose(
    np.asarray(lordo_jax.projections(workers.worker_state(0))["w"]),
    np.asarray(lordo_jax.projections(single.state)["w"]),
    atol=1e-6,
  )


def test_pmap_matches_shard_map():
  params, x, y = _problem(shape=(8, 12), seed=1)
  tx = lordo_jax.lordo(
    LR, rank=RANK, sync_every=SYNC_EVERY, axis_name="workers", error_feedback=True
  )
  by_shard_map = multiworker.Workers(tx, params, NUM_WORKERS, mode="shard_map")
  by_pmap = multiworker.Workers(tx, params, NUM_WORKERS, mode="pmap")
  for t in range(1, STEPS + 1):
    by_shard_map.step(x[t - 1], y[t - 1])
    by_pmap.step(x[t - 1], y[t - 1])
    for m, (a, b) in enumerate(
      zip(by_shard_map.worker_params(), by_pmap.worker_params(), strict=True)
    ):
      for leaf in ("w", "b"):
        np.testing.assert_allclose(
          a[leaf], b[leaf], rtol=1e-6, atol=1e-6, err_msg=f"step {t}, worker {m}, {leaf}"
        )


def test_outer_momentum_is_float32_for_bfloat16_params():
  params = {"w": jnp.ones((4, 3), jnp.bfloat16)}
  tx = lordo_jax.diloco(1e-2, sync_every=1)
  state = tx.init(params)
  updates, state = tx.update(jax.tree.map(jnp.ones_like, params), state, params)
  traces = [x for x in jax.tree.leaves(state.outer_state) if x.ndim == 2]
  assert traces and all(x.dtype == jnp.float32 for x in traces)
  assert updates["w"].dtype == jnp.bfloat16
  assert np.all(np.asarray(traces[0]) != 0)  # the momentum moved


def test_local_update_does_not_pass_through_the_rounds_conditional():
  """The update is chosen outside the round's ``lax.cond`` (round/_synchronize.py, "Cost of a local
  step"): the only parameter-shaped result of any conditional is the anchor, so a
  local step's update can fuse with ``apply_updates``."""
  shape = (24, 40)  # a shape nothing else in the program has
  params = {"w": jnp.full(shape, 0.1)}
  tx = lordo_jax.lordo(1e-2, rank=4, sync_every=4)
  state = tx.init(params)

  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  text = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, params).compile().as_text()
  entry = text[text.index("ENTRY") :]
  results = [line.split("conditional(")[0] for line in entry.splitlines() if "conditional(" in line]
  assert results, "no conditional in the step"
  assert max(r.count("f32[24,40]") for r in results) == 1, results
