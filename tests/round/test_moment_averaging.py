"""lordo_jax.round._moment_averaging: which moments a sync averages, and their averages.

The moments due at the s-th sync are enumerated here from the rule (mu when s mod
P1 = 0, nu when s mod P2 = 0); the averaged moments are compared with NumPy means
over the simulated workers, for a local optimizer with low-rank moments (``r x q``)
and full-rank Adam moments side by side, as ``lordo`` builds it.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lordo_jax.comm import _collectives as collectives
from lordo_jax.local import _low_rank_adam as low_rank
from lordo_jax.round import _averaging as averaging
from lordo_jax.round import _moment_averaging as moment_averaging
from tests.helpers import workers

pytestmark = pytest.mark.timeout(180, method="thread")

M = 4
AXIS = workers.AXIS
PARAMS = {"w": jnp.ones((6, 4)), "b": jnp.ones(4)}
INNER = optax.partition(
  {
    "low": low_rank.scale_by_low_rank_adam(2, init_projection="external"),
    "full": optax.scale_by_adam(),
  },
  {"w": "low", "b": "full"},
)
# Moment sizes: "w" is 6 x 4, projected on the left at rank 2: mu and nu are 2 x 4.
SIZES = {"w": 8, "b": 4}


@pytest.mark.parametrize(
  "periods, expected",
  [
    ((1, 1), [(1, ("mu", "nu"))]),
    ((1, None), [(1, ("mu",))]),
    ((None, 3), [(3, ("nu",))]),
    ((2, 3), [(2, ("mu",)), (3, ("nu",))]),
    ((None, None), []),
  ],
)
def test_moment_groups(periods, expected):
  assert moment_averaging.moment_groups(*periods) == expected


@pytest.mark.parametrize("periods", [(1, 1), (1, None), (2, 3), (3, 3), (None, 2)])
def test_due_fields_at_syncs_one_to_six_match_the_enumeration(periods):
  groups = moment_averaging.moment_groups(*periods)
  traced = jax.jit(lambda s: [p for p, _ in moment_averaging.due(s, groups)])
  for s in range(1, 7):
    expected = {f for f, p in zip(("mu", "nu"), periods, strict=True) if p and s % p == 0}
    for predicates in (
      [p for p, _ in moment_averaging.due(s, groups)],
      [bool(p) for p in traced(jnp.int32(s))],
    ):
      fields = [f for (_, fs), p in zip(groups, predicates, strict=True) if p for f in fs]
      assert sorted(fields) == sorted(expected), (periods, s)


def moment_field(path):
  """("mu" | "nu" | None, the parameter's name) of a leaf of the inner state."""
  names = [k.name for k in path if isinstance(k, jax.tree_util.GetAttrKey)]
  param = [k.key for k in path if isinstance(k, jax.tree_util.DictKey) and k.key in PARAMS]
  field = next((n for n in names if n in ("mu", "nu")), None)
  if "groups" in names:  # The low-rank state, stored per shape group: w's, its one matrix.
    return field, "w"
  return field, param[-1] if param else None


def stacked_state(seed: int):
  """M workers' inner states, each with its own random mu and nu."""
  rng = np.random.default_rng(seed)
  state = workers.stack(INNER.init(PARAMS), M)

  def fill(path, x):
    if moment_field(path)[0] is None:
      return np.asarray(x)
    return rng.standard_normal(x.shape).astype(np.float32)

  return jax.tree_util.tree_map_with_path(fill, state)


def expected_state(state, fields, keep, present=None):
  """NumPy: the moments in ``fields`` of the leaves in ``keep`` replaced by the mean
  over the present workers (all: ``present=None``; none present: kept)."""
  present = np.ones(M, bool) if present is None else present

  def one(path, x):
    field, param = moment_field(path)
    if field not in fields or not (keep is None or keep[param]) or not present.any():
      return x
    return np.stack([x[present].astype(np.float64).mean(axis=0)] * M)

  return jax.tree_util.tree_map_with_path(one, state)


def assert_states_close(got, expected):
  for (path, g), e in zip(
    jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(expected), strict=True
  ):
    np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6, err_msg=jax.tree_util.keystr(path))


def average(fields, keep, strategy, state, present):
  def one(state, present):
    return moment_averaging.average_moments(
      state, collectives.init_ledger(), fields, present, keep, strategy.moment_mean
    )

  return workers.on_workers(one, M)(state, present)


def test_average_moments_replaces_the_fields_by_their_mean():
  state = stacked_state(0)
  got, ledger = average(("mu",), None, averaging.Averaging(AXIS), state, np.ones(M, bool))
  assert_states_close(got, expected_state(state, ("mu",), None))
  # The second moments differ between workers still.
  assert not np.allclose(
    got.inner_states["full"].inner_state.nu["b"][0],
    state.inner_states["full"].inner_state.nu["b"][1],
  )
  assert workers.ledger_numbers(ledger) == (12, 48, 1)  # mu of "w" (2 x 4) and of "b" (4)


def test_average_moments_of_one_fragment_both_fields_in_one_message():
  state = stacked_state(1)
  keep = {"w": True, "b": False}
  got, ledger = average(("mu", "nu"), keep, averaging.Averaging(AXIS), state, np.ones(M, bool))
  assert_states_close(got, expected_state(state, ("mu", "nu"), keep))
  assert workers.ledger_numbers(ledger) == (2 * SIZES["w"], 2 * SIZES["w"] * 4, 1)


def test_average_moments_over_present_workers_and_nobody_present():
  state = stacked_state(2)
  tolerant = averaging.OfPresentWorkers(AXIS)
  present = np.array([True, True, False, True])
  got, ledger = average(("mu", "nu"), None, tolerant, state, present)
  assert_states_close(got, expected_state(state, ("mu", "nu"), None, present))
  assert workers.ledger_numbers(ledger) == (2 * 12 + 1, (2 * 12 + 1) * 4, 1)
  nobody = np.zeros(M, bool)
  got, _ = average(("mu", "nu"), None, tolerant, state, nobody)
  assert_states_close(got, state)  # kept, not replaced by the zero mean


def test_average_due_moments_at_syncs_one_to_six():
  groups = moment_averaging.moment_groups(2, 3)
  moment_mean = averaging.Averaging(AXIS).moment_mean

  def one(state, sync_index):
    return moment_averaging.average_due_moments(
      state, collectives.init_ledger(), sync_index, groups, True, None, moment_mean
    )

  run = workers.on_workers(one, M)
  state = stacked_state(3)
  for s in range(1, 7):
    fields = tuple(f for f, p in (("mu", 2), ("nu", 3)) if s % p == 0)
    got, ledger = run(state, np.full(M, s, np.int32))
    assert_states_close(got, expected_state(state, fields, None))
    # One message per due group, nothing sent at s = 1 and 5.
    assert workers.ledger_numbers(ledger) == (12 * len(fields), 48 * len(fields), len(fields)), s
