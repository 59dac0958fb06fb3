"""Sync-period schedules: the steps that sync are exactly those the rule gives.

The expected sync steps are computed here from the rule's formula with plain Python
(rounds laid end to end, each as long as the rule says at its first step), not with
the library's ``sync_steps``; the optimizer's own counter and ledger must agree, and
the jitted step must compile once while the period changes.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lordo_jax
from lordo_jax.round import _periods as periods
from tests.helpers import workers

M = 2
STEPS = 40
PARAMS = {"w": jnp.ones((10, 6)) * 0.1, "b": jnp.zeros(6)}
LEARNING_RATE = optax.linear_schedule(1.0, 0.3, STEPS)  # the rate the rule reads
BASE, ALPHA = 2, 1.6  # period 2 at the start, 7 once the rate is below 0.6


def loss(params, x):
  return jnp.sum(jnp.tanh(x @ params["w"] + params["b"]) ** 2)


def batches(steps):
  keys = jax.random.split(jax.random.key(0), steps)
  return [jax.random.normal(k, (M, 5, 10)) for k in keys]


def expected_sync_steps(period_of_step, steps):
  """Rounds laid end to end; a round starting after s updates lasts period(s)."""
  found, start = [], 0
  while start + period_of_step(start) <= steps:
    start += period_of_step(start)
    found.append(start)
  return found


def qsr_by_hand(step):
  rate = 1.0 + (0.3 - 1.0) * min(step, STEPS) / STEPS
  return max(BASE, math.floor((ALPHA / rate) ** 2))


def test_quadratic_sync_rule_follows_its_formula():
  rule = lordo_jax.quadratic_sync_rule(BASE, ALPHA, LEARNING_RATE)
  lengths = [int(rule(s)) for s in range(STEPS)]
  assert lengths == [qsr_by_hand(s) for s in range(STEPS)]
  assert lengths[0] == BASE and lengths[-1] == 25  # it really grows
  constant = lordo_jax.quadratic_sync_rule(4, 0.1, 0.01)  # a float rate works too
  assert int(constant(0)) == 100


def test_quadratic_sync_rule_keeps_the_base_period_during_warmup():
  warmup = optax.linear_schedule(0.0, 1.0, transition_steps=10)
  rule = lordo_jax.quadratic_sync_rule(BASE, ALPHA, warmup, warmup_steps=10)
  assert [int(rule(s)) for s in range(10)] == [BASE] * 10
  assert int(rule(10)) == max(BASE, math.floor(ALPHA**2))
  # Without it, a warmup from 0 starts with a round that never ends, and says so.
  with pytest.warns(UserWarning, match="pass warmup_steps"):
    endless = lordo_jax.quadratic_sync_rule(BASE, ALPHA, warmup)
  assert int(endless(0)) == 2**30


def test_sync_steps_lists_the_rounds_end_to_end():
  rule = lordo_jax.quadratic_sync_rule(BASE, ALPHA, LEARNING_RATE)
  assert lordo_jax.sync_steps(rule, STEPS) == expected_sync_steps(qsr_by_hand, STEPS)
  assert lordo_jax.sync_steps(5, 23) == [5, 10, 15, 20]


def _syncs_and_bytes(tx):
  history, step = workers.run(tx, loss, PARAMS, batches(STEPS), M)
  syncs = [int(jax.device_get(state.syncs)[0, 0]) for _, state in history]
  sent = [lordo_jax.communicated_bytes(state) for _, state in history]
  return syncs, sent, step


@pytest.mark.parametrize(
  "build,period_of_step",
  [
    (
      lambda: lordo_jax.lordo(
        LEARNING_RATE,
        rank=2,
        sync_every=lordo_jax.quadratic_sync_rule(BASE, ALPHA, LEARNING_RATE),
        init_projection="random",
        axis_name=workers.AXIS,
      ),
      qsr_by_hand,
    ),
    (
      lambda: lordo_jax.diloco(1e-2, sync_every=lambda step: 3 + step // 8, axis_name=workers.AXIS),
      lambda step: 3 + step // 8,
    ),
  ],
  ids=["lordo-qsr", "diloco-step-function"],
)
def test_optimizer_syncs_exactly_at_the_rule_steps_and_compiles_once(build, period_of_step):
  syncs, sent, step = _syncs_and_bytes(build())
  expected = expected_sync_steps(period_of_step, STEPS)
  assert len(set(np.diff([0, *expected]))) > 1  # the period changes within the run
  counted = [t for t in range(1, STEPS + 1) if syncs[t - 1] > (syncs[t - 2] if t > 1 else 0)]
  assert counted == expected
  sending = [t for t in range(1, STEPS + 1) if sent[t - 1] > (sent[t - 2] if t > 1 else 0)]
  assert sending == expected  # the messages go out exactly then, and only then
  assert step._cache_size() == 1


def test_workers_agree_after_each_scheduled_sync():
  period = lambda step: 2 + step // 10  # noqa: E731
  tx = lordo_jax.local_adam(1e-2, sync_every=period, axis_name=workers.AXIS)
  history, _ = workers.run(tx, loss, PARAMS, batches(STEPS), M)
  expected = expected_sync_steps(period, STEPS)
  for t, (params, _) in enumerate(history, start=1):
    w = np.asarray(jax.device_get(params["w"]))
    spread = np.abs(w - w[0]).max()
    assert (spread < 1e-6) == (t in expected), f"step {t}: spread {spread}"


def test_fragment_labels_are_contiguous_and_balanced():
  params = {f"layer{i}": jnp.zeros((4 + i, 8)) for i in range(6)}
  labels = periods.fragment_labels(params, 3)
  assert labels == sorted(labels) and set(labels) == {0, 1, 2}
  sizes = [0, 0, 0]
  for label, leaf in zip(labels, jax.tree.leaves(params), strict=True):
    sizes[label] += leaf.size
  assert sizes == [120, 120, 72]  # the best contiguous split: no group can be smaller
  assert periods.fragment_offsets(8, 4) == [2, 4, 6, 0]
  assert periods.fragment_offsets(5, 1) == [0]


@pytest.mark.parametrize(
  "kwargs,pattern",
  [
    (dict(sync_every=0), r"sync_every=0 is not accepted; expected an int >= 1"),
    (dict(sync_every=4, fragments=5), r"fragments=5 is not accepted with sync_every=4"),
    (dict(sync_every=lambda s: 4, fragments=2), r"fragments=2 .*int sync_every"),
    (dict(sync_every=4, fragments=0), r"fragments=0 is not accepted"),
  ],
)
def test_bad_schedules_are_named(kwargs, pattern):
  with pytest.raises(ValueError, match=pattern):
    lordo_jax.lordo(1e-3, rank=2, **kwargs)


def test_more_fragments_than_leaves_is_refused():
  tx = lordo_jax.diloco(1e-3, sync_every=4, fragments=3)
  with pytest.raises(ValueError, match=r"fragments=3 is more than the 2 leaves"):
    tx.init({"big": jnp.zeros((100, 100)), "small": jnp.zeros(3)})
