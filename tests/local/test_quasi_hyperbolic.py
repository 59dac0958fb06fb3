"""QHAdam on whole leaves (``quasi_hyperbolic.scale_by_qhadam``, the full-rank path's
``full_rank_nu``): Adam at nu = 1, the NumPy reference's full-rank path otherwise."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lordo_jax.local import _quasi_hyperbolic as quasi_hyperbolic
from lordo_jax.methods import local_step
from tests.references import lordo_reference as ref

STEPS = 6


def gradients():
  keys = jax.random.split(jax.random.key(3), STEPS)
  return [{"w": jax.random.normal(k, (5, 4)), "b": jax.random.normal(k, (4,)) * 3} for k in keys]


def run(tx):
  """The directions of ``tx`` over :func:`gradients`, and its final state."""
  state = tx.init(gradients()[0])
  directions = []
  for grads in gradients():
    updates, state = jax.jit(tx.update)(grads, state)
    directions.append(updates)
  return directions, state


def test_nu_one_is_optax_adam_bit_for_bit():
  adam, adam_state = run(optax.scale_by_adam())
  qhadam, qhadam_state = run(quasi_hyperbolic.scale_by_qhadam(qh_nu=1.0))
  pairs = zip(
    jax.tree.leaves((adam, adam_state)), jax.tree.leaves((qhadam, qhadam_state)), strict=True
  )
  for a, b in pairs:
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), strict=True)


@pytest.mark.parametrize("nu", [0.0, 0.7])
def test_matches_the_reference_full_rank_path(nu):
  directions, state = run(quasi_hyperbolic.scale_by_qhadam(b1=0.8, b2=0.99, eps=1e-6, qh_nu=nu))
  assert isinstance(state, optax.ScaleByAdamState)  # averaged by synchronize as Adam's
  assert int(state.count) == STEPS
  cfg = ref.Config(learning_rate=1.0, rank=1, sync_every=1, b1=0.8, b2=0.99, eps=1e-6)
  qh_cfg = ref.Config(**{**cfg.__dict__, "full_rank_nu": nu})
  for leaf in ("w", "b"):
    shape = gradients()[0][leaf].shape
    st, adam_st = (ref.AdamState(np.zeros(shape), np.zeros(shape)) for _ in range(2))
    largest_gap = 0.0
    for t, (grads, got) in enumerate(zip(gradients(), directions, strict=True), start=1):
      g = np.asarray(grads[leaf], np.float64)
      want = ref.adam_direction(g, st, t, qh_cfg)
      np.testing.assert_allclose(got[leaf], want, rtol=1e-5, atol=1e-6, err_msg=f"{leaf} {t}")
      largest_gap = max(largest_gap, np.max(np.abs(want - ref.adam_direction(g, adam_st, t, cfg))))
    assert largest_gap > 0.1  # QHAdam is not Adam here, so the comparison means something


def test_full_rank_adam_picks_qhadam_only_below_one():
  grads = gradients()[1]
  adam = local_step.full_rank_adam(0.9, 0.999, 1e-8, 1.0)
  qhadam = local_step.full_rank_adam(0.9, 0.999, 1e-8, 0.5)
  step = lambda tx: tx.update(grads, tx.init(grads))[0]["w"]  # noqa: E731
  np.testing.assert_array_equal(step(adam), step(optax.scale_by_adam()))
  # At step 1 m_hat = g, so any nu gives Adam's g / |g|; the second step differs.
  two = lambda tx: tx.update(grads, tx.update(gradients()[0], tx.init(grads))[1])[0]["w"]  # noqa: E731
  assert float(jnp.max(jnp.abs(two(adam) - two(qhadam)))) > 0.05
