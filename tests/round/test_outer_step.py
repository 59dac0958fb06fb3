"""lordo_jax.round._outer_step: the pseudo-gradient and the outer optimizer's step.

The expected anchors are computed in NumPy: with ``optax.sgd(1.0)`` the new anchor
is the workers' mean, anchor - mean_m(anchor - theta_m); with Nesterov momentum
(DiLoCo's outer optimizer) the recursion m <- g + b m, theta <- theta - lr (g + b m)
is written out here.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lordo_jax.round import _outer_step as outer_step

pytestmark = pytest.mark.timeout(120, method="thread")

M = 4
RNG = np.random.default_rng(0)
ANCHOR = {
  "a": RNG.standard_normal((3, 2)).astype(np.float32),
  "b": RNG.standard_normal(4).astype(np.float32),
}
LOCAL = [jax.tree.map(lambda x: x + 0.1 * RNG.standard_normal(x.shape), ANCHOR) for _ in range(M)]
LR, MOMENTUM = 0.7, 0.9


def nesterov():
  return outer_step.outer_transform(optax.sgd(LR, momentum=MOMENTUM, nesterov=True))


def traces(state) -> list:
  """The momentum trees (``optax.TraceState.trace``) inside an outer state."""
  is_trace = lambda x: isinstance(x, optax.TraceState)  # noqa: E731
  return [s.trace for s in jax.tree.leaves(state, is_leaf=is_trace) if is_trace(s)]


def test_pseudo_gradient_is_anchor_minus_local_on_the_fragment():
  delta = outer_step.pseudo_gradient(ANCHOR, LOCAL[0], None)
  for name in ANCHOR:
    np.testing.assert_allclose(delta[name], ANCHOR[name] - LOCAL[0][name], rtol=1e-6)
  delta = outer_step.pseudo_gradient(ANCHOR, LOCAL[0], {"a": False, "b": True})
  assert isinstance(delta["a"], optax.MaskedNode)
  np.testing.assert_allclose(delta["b"], ANCHOR["b"] - LOCAL[0]["b"], rtol=1e-6)


def test_default_outer_step_lands_on_the_workers_mean():
  outer = outer_step.outer_transform(None)
  mean_delta = {
    name: np.mean([ANCHOR[name] - local[name] for local in LOCAL], axis=0) for name in ANCHOR
  }
  (state,) = outer_step.init_outer_states(outer, ANCHOR, [None])
  anchor, _ = jax.jit(outer_step.outer_step, static_argnums=(0, 1))(
    outer, None, ANCHOR, mean_delta, state, jnp.float32(1.0)
  )
  for name in ANCHOR:
    mean_params = np.mean([local[name] for local in LOCAL], axis=0)
    np.testing.assert_allclose(anchor[name], mean_params, rtol=1e-6, atol=1e-6)
    assert anchor[name].dtype == ANCHOR[name].dtype


def test_nesterov_outer_steps_match_numpy():
  outer = nesterov()
  (state,) = outer_step.init_outer_states(outer, ANCHOR, [None])
  anchor = ANCHOR
  ref_anchor = {k: v.astype(np.float64) for k, v in ANCHOR.items()}
  ref_trace = {k: np.zeros(v.shape) for k, v in ANCHOR.items()}
  for t in range(3):
    delta = {k: RNG.standard_normal(v.shape).astype(np.float32) for k, v in ANCHOR.items()}
    anchor, state = outer_step.outer_step(outer, None, anchor, delta, state, jnp.float32(1.0))
    for k in ANCHOR:
      g = delta[k].astype(np.float64)
      ref_trace[k] = g + MOMENTUM * ref_trace[k]
      ref_anchor[k] = ref_anchor[k] - LR * (g + MOMENTUM * ref_trace[k])
      np.testing.assert_allclose(anchor[k], ref_anchor[k], rtol=1e-5, atol=1e-5, err_msg=f"{t}")
      np.testing.assert_allclose(traces(state)[0][k], ref_trace[k], rtol=1e-5, atol=1e-6)


def test_a_fragment_step_touches_only_its_leaves_and_its_outer_state():
  outer = nesterov()
  masks = [{"a": True, "b": False}, {"a": False, "b": True}]
  states = outer_step.init_outer_states(outer, ANCHOR, masks)
  assert len(states) == 2
  g1, g2 = (
    {"a": RNG.standard_normal((3, 2)).astype(np.float32), "b": optax.MaskedNode()} for _ in range(2)
  )
  anchor, state0 = ANCHOR, states[0]
  for g in (g1, g2):
    anchor, state0 = outer_step.outer_step(outer, masks[0], anchor, g, state0, jnp.float32(1.0))
  np.testing.assert_array_equal(anchor["b"], ANCHOR["b"])  # the other fragment's leaf
  trace0 = traces(state0)[0]
  assert isinstance(trace0["b"], optax.MaskedNode)
  np.testing.assert_allclose(trace0["a"], g2["a"] + MOMENTUM * g1["a"], rtol=1e-6)
  m1 = g1["a"].astype(np.float64)
  m2 = g2["a"] + MOMENTUM * m1
  expected_a = ANCHOR["a"] - LR * (g1["a"] + MOMENTUM * m1) - LR * (g2["a"] + MOMENTUM * m2)
  np.testing.assert_allclose(anchor["a"], expected_a, rtol=1e-5, atol=1e-5)
  # Fragment 1's first step starts from its own (zero) momentum, not fragment 0's.
  gb = {"a": optax.MaskedNode(), "b": RNG.standard_normal(4).astype(np.float32)}
  anchor1, state1 = outer_step.outer_step(outer, masks[1], anchor, gb, states[1], jnp.float32(1.0))
  np.testing.assert_array_equal(anchor1["a"], anchor["a"])
  np.testing.assert_allclose(traces(state1)[0]["b"], gb["b"], rtol=1e-6)
  np.testing.assert_allclose(
    anchor1["b"], ANCHOR["b"] - LR * (1 + MOMENTUM) * gb["b"], rtol=1e-5, atol=1e-6
  )


def test_fraction_zero_keeps_anchor_and_outer_state():
  outer = nesterov()
  (state,) = outer_step.init_outer_states(outer, ANCHOR, [None])
  delta = {k: np.ones(v.shape, np.float32) for k, v in ANCHOR.items()}
  _, state = outer_step.outer_step(outer, None, ANCHOR, delta, state, jnp.float32(1.0))
  anchor, kept = outer_step.outer_step(outer, None, ANCHOR, delta, state, jnp.float32(0.0))
  for k in ANCHOR:
    np.testing.assert_array_equal(anchor[k], ANCHOR[k])
    np.testing.assert_array_equal(traces(kept)[0][k], traces(state)[0][k])
  # Any share of workers above zero takes the step.
  anchor, moved = outer_step.outer_step(outer, None, ANCHOR, delta, state, jnp.float32(0.25))
  assert not np.allclose(anchor["a"], ANCHOR["a"])
  np.testing.assert_allclose(traces(moved)[0]["a"], 1 + MOMENTUM, rtol=1e-6)


def test_outer_state_is_float32_for_bfloat16_params():
  params = {"a": jnp.ones((3, 2), jnp.bfloat16)}
  (state,) = outer_step.init_outer_states(nesterov(), params, [None])
  assert traces(state)[0]["a"].dtype == jnp.float32
