"""``lordo_jax.remap_workers``: a run saved on 8 workers continues on 4, one saved on 4 on 8.

At a round boundary LoRDO's workers hold one state (tested leaf by leaf), so the
remapped run must equal, bit for bit at the next boundary, a run that starts M' workers
from the anchor and worker 0's saved state; DiLoCo's workers keep their own Adam
moments, and DES-LOC's between moment syncs, so their reference starts from the
moments' NumPy mean. Mid-round,
``mid_round="restart"`` equals a run started from the anchor with the averaged moments;
a message in flight, bases that differ between workers and unstacked leaves are refused.

Every method continues on 4 workers. The other way, a run of LoRDO with int8 and of
DiLoCo saved on 4 workers continues on 8 (the 4- and 8-worker steps compiled above): the
remap broadcasts each new worker's leaf alike for any number of workers, more or fewer
than were saved, and these two hold every kind of leaf it remaps (bases, anchor and
counters shared; Adam moments that differ between workers and int8 residuals,
averaged). Plain LoRDO's state is int8 LoRDO's without the residuals, and DES-LOC's
moments are averaged as DiLoCo's."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lordo_jax
from tests.helpers import workers as workers_lib

pytestmark = pytest.mark.timeout(300)

K = 4
SAVED = 8  # workers a run is saved on (but the runs that continue on 8)
BOUNDARY = 2 * K  # the step they are saved at, a round's end
SHAPES = {"w": (12, 6), "v": (6, 10), "b": (6,)}
METHODS = {
  "lordo": lambda: lordo_jax.lordo(1e-2, rank=2, sync_every=K, axis_name=workers_lib.AXIS),
  "lordo_int8": lambda: lordo_jax.lordo(
    1e-2, rank=2, sync_every=K, axis_name=workers_lib.AXIS, compression="int8"
  ),
  "diloco": lambda: lordo_jax.diloco(1e-2, sync_every=K, axis_name=workers_lib.AXIS),
  "desloc": lambda: lordo_jax.desloc(1e-2, sync_every=K, axis_name=workers_lib.AXIS),
}


def initial_params():
  keys = jax.random.split(jax.random.key(3), len(SHAPES))
  return {n: 0.3 * jax.random.normal(k, s) for k, (n, s) in zip(keys, SHAPES.items(), strict=True)}


def loss(params, batch):
  x, y = batch
  hidden = jnp.tanh(x @ params["w"] + params["b"])
  return jnp.mean((hidden @ params["v"] - y) ** 2)


def batch(t: int, workers: int):
  kx, ky = jax.random.split(jax.random.key(100 + t))
  return (jax.random.normal(kx, (workers, 16, 12)), jax.random.normal(ky, (workers, 16, 10)))


@functools.cache
def optimizer(name: str):
  """``name``'s optimizer, one object per method: its steps are compiled once."""
  return METHODS[name]()


@functools.cache
def compiled_step(tx, m: int):
  """The mesh of ``m`` workers and ``tx``'s jitted step on it (traced once per pair)."""
  mesh = jax.make_mesh((m,), (workers_lib.AXIS,), devices=jax.devices()[:m])
  return mesh, workers_lib.make_step(tx, loss, mesh)


def run(tx, params, state, first: int, last: int):
  """Steps ``first + 1 .. last`` on as many workers as ``params`` is stacked over."""
  m = jax.tree.leaves(params)[0].shape[0]
  mesh, step = compiled_step(tx, m)
  params, state = workers_lib.shard((params, state), mesh)
  for t in range(first, last):
    params, state = jax.block_until_ready(step(params, state, workers_lib.shard(batch(t, m), mesh)))
  return jax.device_get((params, state))


def saved_run(name: str, steps: int, saved: int = SAVED):
  """``name`` trained ``steps`` steps on ``saved`` workers."""
  tx = optimizer(name)
  params = workers_lib.stack(initial_params(), saved)
  return tx, run(tx, params, workers_lib.stack(tx.init(initial_params()), saved), 0, steps)


def worker0(tree, m: int):
  return jax.tree.map(lambda x: np.broadcast_to(np.asarray(x)[:1], (m, *np.shape(x)[1:])), tree)


def with_adam_moments_averaged(state, m: int):
  """The saved state with every Adam moment (optax.ScaleByAdamState) replaced by its mean
  over the workers: DES-LOC's reference, written apart from the library's remap."""
  is_adam = lambda x: isinstance(x, optax.ScaleByAdamState)  # noqa: E731

  def average(x):
    if not is_adam(x):
      return x
    return x._replace(mu=mean_over_workers(x.mu, 1), nu=mean_over_workers(x.nu, 1))

  return worker0(jax.tree.map(average, state, is_leaf=is_adam), m)


def assert_same(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def is_round(x) -> bool:
  return isinstance(x, lordo_jax.SynchronizeState)


def round_of(state) -> lordo_jax.SynchronizeState:
  (found,) = [x for x in jax.tree.leaves(state, is_leaf=is_round) if is_round(x)]
  return found


def mean_over_workers(tree, m: int):
  return jax.tree.map(
    lambda a: np.broadcast_to(
      np.asarray(a).mean(axis=0, dtype=np.float64).astype(a.dtype), (m, *np.shape(a)[1:])
    ),
    tree,
  )


def scenario(method: str, new: int, saved: int = SAVED) -> None:
  """Saved at the boundary of step 8 on ``saved`` workers, continued to step 12 on ``new``."""
  tx, (params, state) = saved_run(method, BOUNDARY, saved)
  saved_round = round_of(state)
  reference = worker0(state, new)
  if method == "lordo":  # One state on every worker at a boundary: moments averaged.
    for leaf in jax.tree.leaves((saved_round.inner_state, saved_round.anchor)):
      assert (np.asarray(leaf) == np.asarray(leaf)[:1]).all()
  if method in ("diloco", "desloc"):  # Their moments were not averaged now: they differ.
    mu = jax.tree.leaves(saved_round.inner_state)
    assert any(not (np.asarray(x) == np.asarray(x)[:1]).all() for x in mu)
    reference = with_adam_moments_averaged(state, new)
  if method == "lordo_int8":  # The residuals' mean: the next mean carries what rounding lost.
    residual = mean_over_workers(saved_round.residual, new)
    assert max(float(np.abs(x).max()) for x in jax.tree.leaves(residual)) > 0
    reference = jax.tree.map(
      lambda x: x._replace(residual=residual) if is_round(x) else x, reference, is_leaf=is_round
    )
  # Every worker landed on the anchor, up to the rounding of params + (anchor - params).
  for p, a in zip(jax.tree.leaves(params), jax.tree.leaves(saved_round.anchor), strict=True):
    np.testing.assert_allclose(np.asarray(p), np.asarray(a), rtol=1e-6, atol=1e-8)
  remapped = lordo_jax.remap_workers(params, state, new, sync_every=K)
  start = worker0(saved_round.anchor, new)
  assert_same(remapped, (start, reference))
  continued = run(tx, *remapped, BOUNDARY, BOUNDARY + K)
  expected = run(tx, start, reference, BOUNDARY, BOUNDARY + K)
  assert_same(continued, expected)
  assert int(np.asarray(lordo_jax.step_count(continued[1]))[0]) == BOUNDARY + K
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(continued[0]))


@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_run_saved_at_a_boundary_on_8_workers_continues_on_4(method):
  scenario(method, 4)


@pytest.mark.parametrize("method", ["diloco", "lordo_int8"])
def test_a_run_saved_at_a_boundary_on_4_workers_continues_on_8(method):
  """More workers than were saved: the steps on 4 and on 8 workers are the ones above."""
  scenario(method, 8, saved=4)


def test_mid_round_is_refused_unless_the_round_restarts_from_the_anchor():
  tx, (params, state) = saved_run("lordo", 6)  # The round ends at step 8.
  with pytest.raises(ValueError, match=r"saved mid-round \(update 6\).*mid_round='restart'"):
    lordo_jax.remap_workers(params, state, 4, sync_every=K)
  new_params, new_state = lordo_jax.remap_workers(
    params, state, 4, sync_every=K, mid_round="restart"
  )
  round_state = round_of(state)
  assert_same(new_params, worker0(round_state.anchor, 4))  # The round restarts at the anchor.
  # The reference: worker 0's state, every low-rank and Adam moment averaged (NumPy).
  moments = lambda x: isinstance(x, (lordo_jax.LowRankMoments, optax.ScaleByAdamState))  # noqa: E731
  mean = lambda a: mean_over_workers(a, SAVED)  # noqa: E731

  def average(x):
    if isinstance(x, lordo_jax.LowRankMoments):
      return x._replace(mu=mean(x.mu), nu=mean(x.nu), error=mean(x.error))
    if isinstance(x, optax.ScaleByAdamState):
      return x._replace(mu=mean(x.mu), nu=mean(x.nu))
    return x

  reference = worker0(jax.tree.map(average, state, is_leaf=moments), 4)
  assert_same(new_state, reference)
  continued = run(tx, new_params, new_state, 6, BOUNDARY)
  expected = run(tx, worker0(round_state.anchor, 4), reference, 6, BOUNDARY)
  assert_same(continued, expected)
  # The round ended where it would have: every worker back on one anchor at step 8.
  assert (np.asarray(continued[0]["w"]) == np.asarray(continued[0]["w"])[:1]).all()


def test_what_cannot_be_remapped_is_refused_with_what_to_do():
  params = workers_lib.stack(initial_params(), SAVED)
  overlapped = lordo_jax.diloco(1e-2, sync_every=K, axis_name=None, overlap="round")
  with pytest.raises(ValueError, match=r"message in flight \(overlap\)"):
    lordo_jax.remap_workers(params, jax.vmap(overlapped.init)(params), 4, sync_every=K)
  local = lordo_jax.lordo_local_projection(1e-2, rank=2, sync_every=K, axis_name=workers_lib.AXIS)
  p, s = run(local, params, workers_lib.stack(local.init(initial_params()), SAVED), 0, BOUNDARY)
  with pytest.raises(ValueError, match=r"workers disagree on .*basis.*local_gradient"):
    lordo_jax.remap_workers(p, s, 4, sync_every=K)
  with pytest.raises(ValueError, match=r"stacked over the workers"):
    lordo_jax.remap_workers(initial_params(), local.init(initial_params()), 4, sync_every=K)
  with pytest.raises(ValueError, match=r"workers=0 must be a positive int"):
    lordo_jax.remap_workers(params, jax.vmap(overlapped.init)(params), 0, sync_every=K)
  with pytest.raises(ValueError, match=r"mid_round='finish' is not a choice"):
    lordo_jax.remap_workers(
      params, jax.vmap(overlapped.init)(params), 4, sync_every=K, mid_round="finish"
    )
