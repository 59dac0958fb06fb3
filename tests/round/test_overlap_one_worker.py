"""A whole round in flight with one worker (MATH.md §9): the eager merge's fresh
pseudo-gradient is then the whole mean, so eager must be the blocking round, for every
method and every part of its state (parameters, moments, bases); and with SGD inside and
a fixed gradient the delayed merge is the blocking round one round late. The rebase
merge with one worker and the averaging outer is the blocking round too.

Run as a user runs one worker: one simulated device under ``shard_map``, a regression,
K = 4, 24 steps.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lordo_jax
from tests.helpers import multiworker
from tests.helpers import workers
from tests.references import lordo_reference as ref

K, STEPS, LR = 4, 24, 1e-2
P, Q = 12, 8
DATA = ref.make_regression(P, Q, 1, STEPS, seed=3)
PARAMS = ref.initial_params(P, Q, 3)

METHODS = {
  "diloco": lambda **o: lordo_jax.diloco(LR, sync_every=K, axis_name=multiworker.AXIS, **o),
  "local_adam": lambda **o: lordo_jax.local_adam(LR, sync_every=K, axis_name=multiworker.AXIS, **o),
  "lordo": lambda **o: lordo_jax.lordo(LR, rank=2, sync_every=K, axis_name=multiworker.AXIS, **o),
  "lordo_svd": lambda **o: lordo_jax.lordo(
    LR, rank=2, sync_every=K, axis_name=multiworker.AXIS, projection="svd", **o
  ),
}


@functools.cache
def _run(method, **options):
  """The one worker's params and state after every step of ``METHODS[method](**options)``:
  one run, shared by the tests that read it (the blocking runs by several)."""
  one = multiworker.Workers(METHODS[method](**options), PARAMS, 1)
  history = []
  for t in range(STEPS):
    one.step(DATA["x"][t], DATA["y"][t])
    history.append((one.worker_params()[0], one.worker_state(0)))
  return history


CASES = [(m, "eager") for m in sorted(METHODS)] + [
  (m, "rebase") for m in ("local_adam", "lordo", "lordo_svd")
]


@pytest.mark.parametrize("method, merge", CASES)
def test_eager_and_rebase_with_one_worker_are_the_blocking_round(method, merge):
  """Eager's fresh pseudo-gradient is the whole mean; rebase keeps the worker's steps
  and adds the mean minus its own message, nothing, under the averaging outer (DiLoCo's
  Nesterov outer moves a rebased worker off the blocking round: not a case)."""
  blocking = _run(method)
  eager = _run(method, overlap="round", merge=merge)
  for t, ((want, want_state), (got, got_state)) in enumerate(
    zip(blocking, eager, strict=True), start=1
  ):
    for leaf in ("w", "b"):
      scale = np.max(np.abs(want[leaf] - PARAMS[leaf])) + 1e-12
      err = np.max(np.abs(got[leaf] - want[leaf])) / scale
      assert err < 1e-4, f"{method}, step {t}, {leaf}: rel err {err:.2e}"
    if method.startswith("lordo"):
      np.testing.assert_allclose(
        np.abs(lordo_jax.projections(got_state)["w"]),
        np.abs(lordo_jax.projections(want_state)["w"]),
        atol=1e-4,
        err_msg=f"{method}, basis after step {t}",
      )


# "damped" is the averaging outer's (LoRDO's default eager): DiLoCo's Nesterov outer warns.
CORRECTED_CASES = [(m, c) for m in ("diloco", "lordo") for c in ("step", "staleness")]


@pytest.mark.parametrize("method, correction", [*CORRECTED_CASES, ("lordo", "damped")])
def test_a_corrected_eager_round_with_one_worker_is_the_blocking_round(method, correction):
  """Each delay correction (MATH.md §9) leaves one worker's eager round as it was: the
  step's scale is 1 and the stale part, the mean minus the worker's own message, is
  nothing."""
  blocking = _run(method)
  corrected = _run(method, overlap="round", delay_correction=correction)
  for t, ((want, _), (got, _)) in enumerate(zip(blocking, corrected, strict=True), start=1):
    for leaf in ("w", "b"):
      scale = np.max(np.abs(want[leaf] - PARAMS[leaf])) + 1e-12
      err = np.max(np.abs(got[leaf] - want[leaf])) / scale
      assert err < 1e-4, f"{method}, {correction}, step {t}, {leaf}: rel err {err:.2e}"


CONSTANT = {"w": np.linspace(-1.0, 1.0, P * Q).reshape(P, Q), "b": np.linspace(0.5, -0.5, Q)}


def _boundaries(tx):
  """The one worker's params after each round's last step, the gradient fixed at
  :data:`CONSTANT` (it does not depend on the params)."""
  loss = lambda params, batch: sum(jnp.sum(params[k] * CONSTANT[k]) for k in params)  # noqa: E731
  params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), PARAMS)
  batches = [jnp.zeros((1, 1))] * STEPS
  history, _ = workers.run(tx, loss, params, batches, 1)
  return [jax.tree.map(lambda a: np.asarray(a[0], np.float64), p) for p, _ in history[K - 1 :: K]]


@pytest.mark.parametrize("method", ["diloco", "local_adam"])
def test_delayed_with_one_worker_is_the_blocking_round_one_round_late(method):
  """Nothing has landed at the first boundary, so the delayed anchor stays; from then
  on each boundary applies the pseudo-gradient the blocking round applied one boundary
  earlier. With a fixed gradient every round's pseudo-gradient is the same function of
  the inner optimizer's count alone (Adam's bias-corrected step is ``g / (|g| + eps)``),
  so the delayed run is the blocking run one round late, outer momentum included.
  LoRDO is left out: its delayed bases come from the round before the blocking's, and
  its rounds' pseudo-gradients depend on the bases."""
  blocking = _boundaries(METHODS[method]())
  # The delayed merge as it is (Kale et al.'s Algorithm 2): a delay correction scales it.
  delayed = _boundaries(METHODS[method](overlap="round", merge="delayed", delay_correction="none"))
  assert len(blocking) == STEPS // K
  np.testing.assert_allclose(delayed[0]["w"], PARAMS["w"], atol=1e-6)
  for n in range(1, len(blocking)):
    for leaf in ("w", "b"):
      scale = np.max(np.abs(blocking[n - 1][leaf] - PARAMS[leaf]))
      err = np.max(np.abs(delayed[n][leaf] - blocking[n - 1][leaf])) / scale
      assert err < 1e-5, f"{method}, boundary {n + 1}, {leaf}: rel err {err:.2e}"
