"""lordo_jax.round._schedule: which fragments sync at a step, and when a round ends.

The expected schedules are enumerated here from MATH.md §4 and the module's
formulas (fragment f of F syncs at the steps t with t mod K = floor((f + 1) K / F)
mod K; with a period function H the rounds are laid end to end, s' = s + max(1,
floor(H(s)))), never from ``lordo_jax.round._periods``.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lordo_jax.round import _schedule as schedule

pytestmark = pytest.mark.timeout(120, method="thread")


def predicate_table(sync_every, fragments: int, steps: int, next_sync=0) -> np.ndarray:
  """``sync_predicates`` at the steps 1..steps, as a (steps, F) bool array."""
  table = jax.jit(
    jax.vmap(lambda t: jnp.stack(schedule.sync_predicates(sync_every, fragments, t, next_sync)))
  )
  return np.asarray(table(jnp.arange(1, steps + 1, dtype=jnp.int32)))


def expected_table(k: int, fragments: int, steps: int) -> np.ndarray:
  """Fragment f syncs at step t iff t mod K == floor((f + 1) K / F) mod K."""
  return np.array(
    [
      [t % k == ((f + 1) * k // fragments) % k for f in range(fragments)]
      for t in range(1, steps + 1)
    ]
  )


@pytest.mark.parametrize("k", [1, 3, 4, 6, 7])
def test_int_sync_every_fragments_sync_at_their_staggered_offsets(k):
  for fragments in sorted({1, 2, 3, k} & set(range(1, k + 1))):
    got = predicate_table(k, fragments, 3 * k)
    np.testing.assert_array_equal(
      got, expected_table(k, fragments, 3 * k), err_msg=f"F={fragments}"
    )
    # Each fragment syncs once per round; the last one at the round's end, t mod K = 0.
    np.testing.assert_array_equal(got.sum(axis=0), [3] * fragments)
    np.testing.assert_array_equal(got[:, -1], [t % k == 0 for t in range(1, 3 * k + 1)])


def test_staggered_steps_of_one_round_written_out():
  # K = 6, F = 4: offsets floor(6/4)=1, floor(12/4)=3, floor(18/4)=4, 24/4 mod 6 = 0,
  # so in the round 1..6 the fragments sync at steps 1, 3, 4 and 6 (offsets f K / F
  # would give 0, 1, 3, 4: steps 6, 1, 3, 4).
  got = predicate_table(6, 4, 6)
  steps = [int(np.flatnonzero(got[:, f])[0]) + 1 for f in range(4)]
  assert steps == [1, 3, 4, 6]
  # Without streaming: steps K, 2K, ... only.
  np.testing.assert_array_equal(np.flatnonzero(predicate_table(4, 1, 12)[:, 0]) + 1, [4, 8, 12])


def period(step):
  """A round length that grows with the round's first step, fractional and below 1."""
  return 0.5 + step / 3


def expected_sync_steps(steps: int) -> list[int]:
  """Rounds end to end: a round starting after s updates ends at s + max(1, floor(H(s)))."""
  found, start = [], 0
  while True:
    start += max(1, math.floor(0.5 + start / 3))
    if start > steps:
      return found
    found.append(start)


def run_schedule(sync_every, steps: int) -> list[int]:
  """The steps at which the (last) predicate holds, with next_sync carried as the
  state carries it: n = H(0) before step 1, moved on by ``next_sync``."""

  @jax.jit
  def step(count, current):
    ends = schedule.sync_predicates(sync_every, 1, count, current)[-1]
    return ends, schedule.next_sync(sync_every, count, current, ends)

  if callable(sync_every):
    current = jnp.maximum(jnp.floor(jnp.asarray(period(jnp.int32(0)))).astype(jnp.int32), 1)
  else:
    current = jnp.int32(sync_every)
  found = []
  for t in range(1, steps + 1):
    ends, current = step(jnp.int32(t), current)
    if bool(ends):
      found.append(t)
  return found


def test_period_function_rounds_end_where_the_enumeration_says():
  expected = expected_sync_steps(40)
  # 1 (H(0) = 0.5 -> 1), 2, 3, 4, 5 (H(4) = 1.83 -> 1), 7 (H(5) = 2.17 -> 2), 9, ...
  assert expected[:7] == [1, 2, 3, 4, 5, 7, 9]
  assert run_schedule(period, 40) == expected


def test_next_sync_moves_on_only_when_the_round_ends():
  # Int K: n' = t + K at a round's end, else n.
  assert int(schedule.next_sync(4, jnp.int32(8), jnp.int32(8), True)) == 12
  assert int(schedule.next_sync(4, jnp.int32(7), jnp.int32(8), False)) == 8
  # Period function: n' = t + max(1, floor(H(t))), H taken at t (the next round's start).
  assert int(schedule.next_sync(period, jnp.int32(9), jnp.int32(9), True)) == 9 + 3
  assert int(schedule.next_sync(period, jnp.int32(5), jnp.int32(7), False)) == 7
  assert run_schedule(5, 23) == [5, 10, 15, 20]


def test_callable_sync_every_predicate_is_count_equals_next_sync():
  got = predicate_table(period, 1, 8, next_sync=jnp.int32(6))
  np.testing.assert_array_equal(got[:, 0], [t == 6 for t in range(1, 9)])


PARAMS = {
  "a": jnp.zeros(10),
  "b": jnp.zeros(3),
  "c": jnp.zeros((2, 2)),
  "d": jnp.zeros(2),
}


def test_fragment_masks_one_true_per_leaf_in_contiguous_groups():
  assert schedule.fragment_masks(PARAMS, 1) == [None]
  # Sizes 10, 3, 4, 2 in flattening order: the split with the smallest largest
  # fragment into two contiguous groups is {a} | {b, c, d} (10 against 9).
  masks = schedule.fragment_masks(PARAMS, 2)
  assert masks == [
    {"a": True, "b": False, "c": False, "d": False},
    {"a": False, "b": True, "c": True, "d": True},
  ]
  for fragments in (3, 4):
    masks = schedule.fragment_masks(PARAMS, fragments)
    assert len(masks) == fragments
    table = np.array([jax.tree.leaves(m) for m in masks])  # (fragment, leaf)
    np.testing.assert_array_equal(table.sum(axis=0), [1] * 4)  # exactly one fragment per leaf
    labels = list(table.argmax(axis=0))  # in flattening order: contiguous, none empty
    assert labels == sorted(labels) and set(labels) == set(range(fragments))


def test_fragment_masks_and_synced_now_follow_a_labelling_function():
  labels = {"a": 1, "b": 0, "c": 1, "d": 0}
  masks = schedule.fragment_masks(PARAMS, lambda params: labels)
  assert masks == [
    {"a": False, "b": True, "c": False, "d": True},
    {"a": True, "b": False, "c": True, "d": False},
  ]
  for predicates in ([False, True], [True, False]):
    synced = schedule.synced_now(PARAMS, masks, [jnp.asarray(p) for p in predicates])
    assert {name: bool(x) for name, x in synced.items()} == {
      name: predicates[label] for name, label in labels.items()
    }
  synced = schedule.synced_now(PARAMS, [None], [jnp.asarray(True)])
  assert all(bool(x) for x in jax.tree.leaves(synced))
