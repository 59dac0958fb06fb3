"""lordo_jax.round._basis_refresh: where the bases come from, and what that costs.

Expected bases are computed in NumPy: the first r left singular vectors of the
source matrix, each column's largest-magnitude entry made positive (MATH.md
§5). The source is the workers' mean (``"pseudo_gradient"``: the first gradient sent
once, counted in the ledger) or each worker's own gradient (``"local_gradient"``:
nothing sent, the ledger unchanged).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lordo_jax.comm import _collectives as collectives
from lordo_jax.local import _low_rank_adam as low_rank
from lordo_jax.round import _averaging as averaging
from lordo_jax.round import _basis_refresh as basis_refresh
from tests.helpers import workers

pytestmark = pytest.mark.timeout(180, method="thread")

M, RANK = 4, 2
AXIS = workers.AXIS
PARAMS = {"w": jnp.zeros((8, 4)), "v": jnp.zeros((6, 3))}  # 32 + 18 elements
LOW_RANK = low_rank.scale_by_low_rank_adam(RANK, init_projection="external")
PLAIN_MEAN = averaging.Averaging(AXIS).gradient_mean


def numpy_basis(matrix) -> np.ndarray:
  """Top-r left singular vectors, each column's largest |entry| positive."""
  u, _, _ = np.linalg.svd(np.asarray(matrix, np.float64), full_matrices=False)
  q = u[:, :RANK]
  pivots = q[np.argmax(np.abs(q), axis=0), np.arange(RANK)]
  return q * np.sign(pivots)


def gradients(seed: int) -> dict:
  """Per-worker gradients, stacked, different on every worker."""
  rng = np.random.default_rng(seed)
  return {k: rng.standard_normal((M, *v.shape)).astype(np.float32) for k, v in PARAMS.items()}


def bases(state) -> dict:
  """The stacked bases of every matrix of a (stacked) LowRankAdamState."""
  return {name: np.asarray(state.moments.matrices()[name].basis) for name in PARAMS}


@functools.cache
def initial_runner(source: str):
  """``BasisRefresh.initial_projection`` from ``source`` on every worker, compiled once."""

  def one(state, grads):
    refresh = basis_refresh.BasisRefresh(LOW_RANK, "gradient", source, PLAIN_MEAN)
    return refresh.initial_projection(state, collectives.init_ledger(), grads, True)

  return workers.on_workers(one, M)


def initial(source: str, grads):
  return initial_runner(source)(workers.stack(LOW_RANK.init(PARAMS), M), grads)


def test_pseudo_gradient_source_bases_from_the_mean_first_gradient():
  grads = gradients(0)
  state, ledger = initial("pseudo_gradient", grads)
  for name, basis in bases(state).items():
    expected = numpy_basis(grads[name].mean(axis=0))
    for m in range(M):  # the same basis on every worker
      np.testing.assert_allclose(basis[m], expected, atol=1e-5)
  assert workers.ledger_numbers(ledger) == (32 + 18, (32 + 18) * 4, 1)  # one full-size message


def test_local_gradient_source_bases_from_own_gradient_nothing_sent():
  grads = gradients(1)
  state, ledger = initial("local_gradient", grads)
  for name, basis in bases(state).items():
    for m in range(M):
      np.testing.assert_allclose(basis[m], numpy_basis(grads[name][m]), atol=1e-5)
    assert not np.allclose(basis[0], basis[1], atol=1e-2)  # the workers' bases differ
  assert workers.ledger_numbers(ledger) == (0, 0, 0)


def synced_state(seed: int):
  """A stacked state after a few steps: a basis, nonzero moments, count 5."""
  state, _ = initial("pseudo_gradient", gradients(seed))
  rng = np.random.default_rng(seed + 100)

  def fill(m):
    return m._replace(
      mu=rng.standard_normal(m.mu.shape).astype(np.float32),
      nu=rng.uniform(0.1, 1.0, m.nu.shape).astype(np.float32),
    )

  moments = state.moments.with_matrices(low_rank.map_matrices(fill, state.moments.matrices()))
  return state._replace(moments=moments, count=np.full(M, 5, np.int32))


KEEP = {"w": True, "v": False}


@functools.cache
def at_sync_runner(source: str):
  """``BasisRefresh.at_sync`` of the fragment KEEP on every worker, compiled once."""

  def one(state, delta, grads, fraction):
    delta = {"w": delta["w"], "v": optax.MaskedNode()}
    refresh = basis_refresh.BasisRefresh(LOW_RANK, "gradient", source, PLAIN_MEAN)
    return refresh.at_sync(state, delta, grads, KEEP, fraction)

  return workers.on_workers(one, M)


def at_sync(source: str, state, delta, grads, fraction):
  return at_sync_runner(source)(state, delta, grads, np.full(M, fraction, np.float32))


@pytest.mark.parametrize("source", ["pseudo_gradient", "local_gradient"])
def test_refresh_at_sync_takes_the_source_of_its_kind_for_the_fragment(source):
  state = synced_state(2)
  grads = gradients(3)
  delta = {k: np.stack([v.mean(axis=0)] * M) for k, v in gradients(4).items()}
  refreshed = at_sync(source, state, delta, grads, 1.0)
  got, old = bases(refreshed), bases(state)
  for m in range(M):
    matrix = delta["w"][m] if source == "pseudo_gradient" else grads["w"][m]
    np.testing.assert_allclose(got["w"][m], numpy_basis(matrix), atol=1e-5)
  np.testing.assert_array_equal(got["v"], old["v"])  # outside the fragment
  np.testing.assert_array_equal(
    refreshed.moments.matrices()["v"].mu, state.moments.matrices()["v"].mu
  )
  assert not np.allclose(
    refreshed.moments.matrices()["w"].mu, state.moments.matrices()["w"].mu
  )  # transported


def test_refresh_at_sync_with_nobody_present_keeps_bases_and_moments():
  state = synced_state(5)
  delta = {k: np.stack([v.mean(axis=0)] * M) for k, v in gradients(6).items()}
  kept = at_sync("pseudo_gradient", state, delta, gradients(7), 0.0)
  for got, old in zip(jax.tree.leaves(kept), jax.tree.leaves(state), strict=True):
    np.testing.assert_array_equal(got, old)


def before_first_step(refresh, count: int, grads):
  def one(count, grads, state):
    return refresh.before_first_step(count, grads, state, collectives.init_ledger(), True)

  stacked = workers.stack(LOW_RANK.init(PARAMS), M)
  return workers.on_workers(one, M)(np.full(M, count, np.int32), grads, stacked)


def test_choose_initial_projection_only_at_step_one_and_only_for_gradient():
  grads = gradients(8)
  empty = bases(workers.stack(LOW_RANK.init(PARAMS), M))
  gradient = basis_refresh.BasisRefresh(LOW_RANK, "gradient", "pseudo_gradient", PLAIN_MEAN)
  state, ledger = before_first_step(gradient, 1, grads)
  np.testing.assert_allclose(bases(state)["w"][0], numpy_basis(grads["w"].mean(axis=0)), atol=1e-5)
  assert workers.ledger_numbers(ledger) == (50, 200, 1)
  for refresh, count in (
    (gradient, 2),  # a later step sends nothing
    (basis_refresh.BasisRefresh(LOW_RANK, None, "pseudo_gradient", PLAIN_MEAN), 1),
    (basis_refresh.BasisRefresh(None, "gradient", "pseudo_gradient", PLAIN_MEAN), 1),
  ):
    state, ledger = before_first_step(refresh, count, grads)
    for name in PARAMS:
      np.testing.assert_array_equal(bases(state)[name], empty[name])
    assert workers.ledger_numbers(ledger) == (0, 0, 0)


def test_choose_without_low_rank_leaves_the_state_at_sync():
  refresh = basis_refresh.BasisRefresh(None, "gradient", "pseudo_gradient", PLAIN_MEAN)
  state = optax.adam(1e-3).init(PARAMS)
  grads = {k: jnp.ones_like(v) for k, v in PARAMS.items()}
  assert refresh.at_sync(state, grads, grads, None, jnp.float32(1.0)) is state
