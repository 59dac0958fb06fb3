"""The float64 reference of overlapped synchronisation (``tests/references/overlap_reference.py``)
has the properties MATH.md §9 states, so the library can be held against it.

With SGD inside and fixed gradients, ``"rebase"`` gives the plain round's parameters
at steps t0+tau .. t0+K-1 of every round; the moment correction gives the plain
round's moments; with the averaging outer a landing leaves the workers' mean where
it was; tau = 0 is the plain round; and a whole round in flight lands one round late.
"""

import numpy as np
import pytest

from tests.references import overlap_reference as ref

K, M, STEPS = 4, 4, 16
RNG = np.random.default_rng(0)
FIXED = RNG.normal(size=(M, 3, 2))  # each worker's constant gradient
PARAMS0 = RNG.normal(size=(3, 2))


def fixed(m, t, params):
  return FIXED[m]


def varying(m, t, params):
  return FIXED[m] * np.cos(t) + 0.3 * params


def _params(history, t):
  return np.array([w.params for w in history[t - 1]])


@pytest.mark.parametrize("tau", [1, 2, K - 1])
def test_rebase_gives_the_plain_rounds_parameters_after_each_landing(tau):
  plain = ref.run(ref.Setup(workers=M, sync_every=K), PARAMS0, fixed, STEPS)
  late = ref.run(ref.Setup(workers=M, sync_every=K, tau=tau), PARAMS0, fixed, STEPS)
  for t0 in range(K, STEPS, K):
    for t in range(t0 + tau, t0 + K):
      np.testing.assert_allclose(_params(late, t), _params(plain, t), rtol=0, atol=1e-12)
    if tau > 1:  # inside the window the workers have not landed yet: they differ
      assert np.abs(_params(late, t0 + 1) - _params(plain, t0 + 1)).max() > 1e-3


@pytest.mark.parametrize("tau", [1, 2, K - 1])
def test_the_moment_correction_gives_the_plain_rounds_moments(tau):
  plain = ref.run(ref.Setup(workers=M, sync_every=K, inner="adam"), PARAMS0, fixed, STEPS)
  late = ref.run(ref.Setup(workers=M, sync_every=K, tau=tau, inner="adam"), PARAMS0, fixed, STEPS)
  for t0 in range(K, STEPS, K):
    for t in range(t0 + tau, t0 + K):
      for a, b in zip(late[t - 1], plain[t - 1], strict=True):
        np.testing.assert_allclose(a.u, b.u, rtol=0, atol=1e-12)
        np.testing.assert_allclose(a.v, b.v, rtol=0, atol=1e-12)


def _workers_with_a_message_in_flight(seed=1):
  rng = np.random.default_rng(seed)
  anchor = rng.normal(size=(3, 2))
  return [
    ref.Worker(
      params=rng.normal(size=(3, 2)),
      u=rng.normal(size=(3, 2)),
      v=rng.uniform(size=(3, 2)),
      anchor=anchor,
      outer_momentum=np.zeros((3, 2)),
      frozen=(rng.normal(size=(3, 2)), rng.normal(size=(3, 2)), rng.uniform(size=(3, 2))),
    )
    for _ in range(M)
  ]


def test_with_the_averaging_outer_a_rebase_landing_keeps_the_workers_mean():
  ws = _workers_with_a_message_in_flight()
  before = np.mean([w.params for w in ws], axis=0)
  ref._land(ref.Setup(workers=M, sync_every=K, tau=2), ws, 2)
  np.testing.assert_allclose(np.mean([w.params for w in ws], axis=0), before, atol=1e-12)
  assert np.ptp([w.params for w in ws], axis=0).max() > 0  # the workers still differ


def test_a_streaming_landing_mixes_toward_the_synchronised_parameters():
  ws = _workers_with_a_message_in_flight()
  before = np.array([w.params for w in ws])
  synced = ws[0].anchor - np.mean([w.frozen[0] for w in ws], axis=0)
  ref._land(ref.Setup(workers=M, sync_every=K, tau=2, merge="streaming", merge_alpha=0.25), ws, 2)
  np.testing.assert_allclose([w.params for w in ws], 0.25 * before + 0.75 * synced, atol=1e-12)


def test_tau_zero_is_the_plain_round():
  plain = ref.run(ref.Setup(workers=M, sync_every=K, inner="adam"), PARAMS0, varying, STEPS)
  for t in range(K, STEPS + 1, K):  # every worker lands on the mean of the round
    params = _params(plain, t)
    np.testing.assert_allclose(params, np.broadcast_to(params[0], params.shape), atol=0)


@pytest.mark.parametrize("merge", ["eager", "delayed"])
def test_a_whole_round_in_flight_lands_one_round_late(merge):
  setup = ref.Setup(workers=M, sync_every=K, tau=K, merge=merge)
  history = ref.run(setup, PARAMS0, fixed, 3 * K)
  g_bar, lr = FIXED.mean(0), setup.learning_rate
  first = _params(history, K)
  if merge == "delayed":  # nothing has landed at the first boundary: back to the start
    np.testing.assert_allclose(first, np.broadcast_to(PARAMS0, first.shape), atol=1e-12)
    # at 2K, round 1's mean lands on the shared anchor
    np.testing.assert_allclose(_params(history, 2 * K)[0], PARAMS0 - K * lr * g_bar, atol=1e-12)
  else:  # each worker's own pseudo-gradient, 1/M of it, lands at once
    for m in range(M):
      np.testing.assert_allclose(first[m], PARAMS0 - K * lr * FIXED[m] / M, atol=1e-12)


FRAGMENT_K = 6  # two fragments frozen at t = 3 and 0 (mod 6): tau up to 2
FRAGMENT_OF = np.repeat([[0], [1], [1]], 2, axis=1)  # row 0 one fragment, rows 1-2 the other


@pytest.mark.parametrize("tau", [1, 2])
def test_with_fragments_each_fragment_rebases_onto_the_plain_streaming_round(tau):
  """Fragment f, frozen at t_f, holds the tau = 0 streaming values from its landing
  t_f + tau until its next freeze, with SGD and fixed gradients; the other fragment's
  elements are not touched by its landing."""
  setup = dict(workers=M, sync_every=FRAGMENT_K, fragment_of=FRAGMENT_OF)
  plain = ref.run(ref.Setup(**setup), PARAMS0, fixed, 3 * FRAGMENT_K)
  late = ref.run(ref.Setup(**setup, tau=tau), PARAMS0, fixed, 3 * FRAGMENT_K)
  compared = 0
  for f, offset in enumerate([FRAGMENT_K // 2, 0]):
    mask = FRAGMENT_OF == f
    for frozen_at in range(offset or FRAGMENT_K, 2 * FRAGMENT_K + 1, FRAGMENT_K):
      for t in range(frozen_at + tau, frozen_at + FRAGMENT_K):
        want = _params(plain, t)[:, mask]
        np.testing.assert_allclose(_params(late, t)[:, mask], want, rtol=0, atol=1e-12)
        compared += 1
      other = (
        _params(late, frozen_at + tau)[:, ~mask] - _params(late, frozen_at + tau - 1)[:, ~mask]
      )
      np.testing.assert_allclose(other, -0.05 * np.array(FIXED)[:, ~mask], atol=1e-12)
  assert compared == 2 * 2 * (FRAGMENT_K - tau)
