"""lordo_jax.round._averaging: the three means of a round, run on simulated workers.

Each strategy's mean is compared with the NumPy mean over the workers (the present
ones for ``OfPresentWorkers``), and its ledger with the message sizes counted by
hand from the leaves' shapes, dtypes and (compressed) row blocks.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lordo_jax.comm import _collectives as collectives
from lordo_jax.round import _averaging as averaging
from tests.helpers import workers

pytestmark = pytest.mark.timeout(180, method="thread")

M = 4
AXIS = workers.AXIS
SHAPES = {"w": (6, 3), "b": (5,)}  # 23 elements


def per_worker(seed: int, scale: float = 1.0) -> dict:
  """A float32 tree per worker, stacked: {"w": (M, 6, 3), "b": (M, 5)}."""
  rng = np.random.default_rng(seed)
  return {k: (scale * rng.standard_normal((M, *s))).astype(np.float32) for k, s in SHAPES.items()}


def first_worker(tree: dict) -> dict:
  """Worker 0's tree (the params' shapes)."""
  return {name: x[0] for name, x in tree.items()}


def run_mean(strategy_mean, tree, present):
  """``strategy_mean(tree, present, empty ledger)`` on every worker."""

  def one(tree, present):
    return strategy_mean(tree, present, collectives.init_ledger())

  return workers.on_workers(one, M)(tree, present)


EVERYONE = np.ones(M, bool)


@pytest.mark.parametrize("field", ["gradient_mean", "moment_mean"])
def test_plain_mean_is_the_numpy_mean_and_counts_the_tree(field):
  tree = per_worker(0)
  mean, fraction, ledger = run_mean(getattr(averaging.Averaging(AXIS), field), tree, EVERYONE)
  for name in SHAPES:
    for m in range(M):  # every worker holds the same mean
      np.testing.assert_allclose(mean[name][m], tree[name].mean(axis=0), rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(fraction, [1.0] * M)
  assert workers.ledger_numbers(ledger) == (23, 23 * 4, 1)


def test_plain_mean_counts_bytes_in_the_dtype_sent():
  tree = {"w": per_worker(1)["w"].astype(jnp.bfloat16), "b": per_worker(1)["b"]}
  _, _, ledger = run_mean(averaging.Averaging(AXIS).gradient_mean, tree, EVERYONE)
  assert workers.ledger_numbers(ledger) == (23, 18 * 2 + 5 * 4, 1)


def test_plain_pseudo_gradient_mean_passes_the_residual_on():
  tree = per_worker(2)

  def one(tree):
    mean, fraction, ledger, residual = averaging.Averaging(AXIS).pseudo_gradient_mean(
      tree, True, collectives.init_ledger(), (), None
    )
    assert residual == ()
    return mean, fraction

  mean, fraction = workers.on_workers(one, M)(tree)
  np.testing.assert_allclose(mean["w"][0], tree["w"].mean(axis=0), rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(fraction, [1.0] * M)
  assert averaging.Averaging(AXIS).init_residual(tree) == ()


def test_present_workers_mean_leaves_out_the_absent_even_when_not_finite():
  tree = per_worker(3)
  tree["w"][1, 0, 0] = np.nan  # worker 1 is absent: its NaN must not reach the mean
  tree["b"][1] = np.inf
  present = np.array([True, False, True, True])
  mean, fraction, ledger = run_mean(averaging.OfPresentWorkers(AXIS).gradient_mean, tree, present)
  for name in SHAPES:
    expected = tree[name][present].astype(np.float64).mean(axis=0)
    for m in range(M):
      np.testing.assert_allclose(mean[name][m], expected, rtol=1e-6, atol=1e-6)
    # Not the mean over everyone with the absent worker's values zeroed.
    assert not np.allclose(mean[name][0], tree[name][present].sum(axis=0) / M, atol=1e-3)
  np.testing.assert_array_equal(fraction, [0.75] * M)
  # One message: the tree and the presence weight, a float32 scalar.
  assert workers.ledger_numbers(ledger) == (23 + 1, 23 * 4 + 4, 1)


def test_present_workers_mean_with_nobody_present_is_zero_with_fraction_zero():
  tree = per_worker(4)
  mean, fraction, _ = run_mean(
    averaging.OfPresentWorkers(AXIS).moment_mean, tree, np.zeros(M, bool)
  )
  np.testing.assert_array_equal(fraction, [0.0] * M)
  for name in SHAPES:
    np.testing.assert_array_equal(mean[name], np.zeros_like(tree[name]))


def test_admit_takes_presence_and_finiteness_only_for_present_workers():
  tree = per_worker(5)
  tree["b"][2, 3] = np.nan
  present = np.array([True, True, True, False])

  def one(tree, present):
    return (
      averaging.OfPresentWorkers(AXIS).admit(present, tree),
      averaging.Averaging(AXIS).admit(present, tree),
    )

  tolerant, plain = workers.on_workers(one, M)(tree, present)
  np.testing.assert_array_equal(tolerant, [True, True, False, False])
  np.testing.assert_array_equal(plain, present)  # presence not tracked: as given


def test_unless_empty():
  averaged = {"x": jnp.arange(3.0), "y": jnp.ones(2)}
  own = {"x": -jnp.arange(3.0), "y": jnp.zeros(2)}
  kept = averaging.unless_empty(jnp.float32(0.0), averaged, own)
  taken = averaging.unless_empty(jnp.float32(0.25), averaged, own)
  for name in averaged:
    np.testing.assert_array_equal(kept[name], own[name])
    np.testing.assert_array_equal(taken[name], averaged[name])


# Hand count of a compressed message on M = 4 workers. "w" (6, 3) keeps its rows,
# padded to 8 rows: 24 values (int8: and 8 float32 row scales). "b" (5,) is flattened
# into 4 rows of ceil(5 / 4) = 2: 8 values (int8: and 4 scales).
COMPRESSED_LEDGER = {
  "bfloat16": (24 + 8, (24 + 8) * 2, 1),
  "int8": (24 + 8 + 8 + 4, (24 + 8) * 1 + (8 + 4) * 4, 1),
}


@pytest.mark.parametrize("codec", ["bfloat16", "int8"])
def test_compressed_error_feedback_loses_nothing_over_syncs(codec):
  """sum_t mean-sent_t + mean_m e_m == sum_t mean_m delta_{m,t} (float rounding)."""
  strategy = averaging.Compressed(AXIS, codec)
  deltas = [per_worker(10 + t, scale=1.0 + t) for t in range(5)]

  def one(delta, residual):
    mean, fraction, ledger, residual = strategy.pseudo_gradient_mean(
      delta, True, collectives.init_ledger(), residual, None
    )
    return mean, fraction, ledger, residual

  step = workers.on_workers(one, M)
  residual = jax.tree.map(
    lambda x: np.stack([x] * M), strategy.init_residual(first_worker(deltas[0]))
  )
  for name in SHAPES:
    assert residual[name].dtype == np.float32 and not residual[name].any()
  sent = {name: np.zeros(SHAPES[name]) for name in SHAPES}
  true = {name: np.zeros(SHAPES[name]) for name in SHAPES}
  for delta in deltas:
    mean, fraction, ledger, residual = step(delta, residual)
    np.testing.assert_array_equal(fraction, [1.0] * M)
    assert workers.ledger_numbers(ledger) == COMPRESSED_LEDGER[codec]
    for name in SHAPES:
      np.testing.assert_array_equal(mean[name], np.stack([mean[name][0]] * M))  # all agree
      sent[name] += mean[name][0].astype(np.float64)
      true[name] += delta[name].astype(np.float64).mean(axis=0)
  for name in SHAPES:
    carried = residual[name].astype(np.float64).mean(axis=0)
    np.testing.assert_allclose(sent[name] + carried, true[name], rtol=0, atol=1e-4)
    # The residual matters: what was sent alone is off by much more than that.
    assert np.max(np.abs(sent[name] - true[name])) > 1e-3


def test_compressed_residual_of_leaves_outside_the_fragment_waits():
  strategy = averaging.Compressed(AXIS, "int8")
  delta = per_worker(20)
  old = per_worker(21, scale=0.01)
  keep = {"w": True, "b": False}

  def one(delta, residual):
    delta = {"w": delta["w"], "b": optax.MaskedNode()}
    mean, _, ledger, residual = strategy.pseudo_gradient_mean(
      delta, True, collectives.init_ledger(), residual, keep
    )
    return mean["w"], ledger, residual

  mean, ledger, residual = workers.on_workers(one, M)(delta, old)
  np.testing.assert_array_equal(residual["b"], old["b"])  # untouched, for its own sync
  assert not np.allclose(residual["w"], old["w"])
  # The fragment's identity: mean sent + mean residual == true mean + mean old residual.
  np.testing.assert_allclose(
    mean[0] + residual["w"].mean(axis=0),
    delta["w"].mean(axis=0) + old["w"].mean(axis=0),
    rtol=0,
    atol=1e-5,
  )
  assert workers.ledger_numbers(ledger) == (24 + 8, 24 + 8 * 4, 1)  # only "w" is sent


@pytest.mark.parametrize("codec", ["bfloat16", "int8"])
def test_compressed_plain_and_moment_means_codecs_and_ledgers(codec):
  strategy = averaging.Compressed(AXIS, codec)
  tree = per_worker(30)
  mean, fraction, ledger = run_mean(strategy.gradient_mean, tree, EVERYONE)
  assert workers.ledger_numbers(ledger) == COMPRESSED_LEDGER[codec]
  np.testing.assert_array_equal(fraction, [1.0] * M)
  for name in SHAPES:
    np.testing.assert_allclose(mean[name][0], tree[name].mean(axis=0), rtol=0, atol=0.05)
  # The moments go in bfloat16 whatever the pseudo-gradient's codec: 2 bytes a value.
  moments, _, ledger = run_mean(strategy.moment_mean, tree, EVERYONE)
  assert workers.ledger_numbers(ledger) == COMPRESSED_LEDGER["bfloat16"]
  for name in SHAPES:
    np.testing.assert_allclose(moments[name][0], tree[name].mean(axis=0), rtol=0.02, atol=0.02)


def test_choose_picks_the_strategy_of_the_options():
  tree = per_worker(40)
  expected = {
    (False, None): (23, 23 * 4, 1),  # plain
    (True, None): (24, 24 * 4, 1),  # of present workers: + the weight
    (False, "bfloat16"): COMPRESSED_LEDGER["bfloat16"],
    (False, "int8"): COMPRESSED_LEDGER["int8"],
  }
  for (tolerant, codec), numbers in expected.items():
    strategy = averaging.choose(AXIS, fault_tolerant=tolerant, compression=codec)
    _, _, ledger = run_mean(strategy.gradient_mean, tree, EVERYONE)
    assert workers.ledger_numbers(ledger) == numbers, (tolerant, codec)
    residual = strategy.init_residual(first_worker(tree))
    assert (residual == ()) == (codec is None)


def test_one_worker_means_are_the_identity_and_send_nothing():
  tree = first_worker(per_worker(50))
  for strategy in (averaging.Averaging(None), averaging.Compressed(None, "int8")):
    mean, fraction, ledger = strategy.gradient_mean(tree, True, collectives.init_ledger())
    for name in SHAPES:
      np.testing.assert_array_equal(mean[name], tree[name])
    assert float(fraction) == 1.0
    assert collectives.ledger_total(ledger) == (0, 0)
