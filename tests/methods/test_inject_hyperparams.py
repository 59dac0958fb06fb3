"""``optax.inject_hyperparams`` around every method: continuous hyperparameters only.

optax turns every numeric argument (defaults included) into an array in the state. The
integers that fix the program (rank, periods, iteration counts) have ``None`` defaults,
so only those a user passes need ``static_args``, and one error names all of them.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lordo_jax

PARAMS = {"w": jax.random.normal(jax.random.key(0), (16, 8)), "b": jnp.zeros(8)}
ADAM = {"learning_rate", "b1", "b2", "eps", "weight_decay"}
LOW_RANK = ADAM | {"omega", "mu", "qh_nu", "full_rank_nu"}  # The low-rank step's too.
ROUND = {"merge_alpha"}  # The round's continuous option (overlap's streaming merge).
# factory, the integers a user passes, the hyperparameters that become injectable.
CASES = {
  "lordo": (lordo_jax.lordo, dict(rank=2, sync_every=2), LOW_RANK | ROUND),
  "lordo_local_projection": (
    lordo_jax.lordo_local_projection,
    dict(rank=2, sync_every=2),
    LOW_RANK | ROUND,
  ),
  "low_rank_ddp": (lordo_jax.low_rank_ddp, dict(rank=2, refresh_every=3), LOW_RANK),
  "ddp": (lordo_jax.ddp, {}, ADAM),
  "diloco": (
    lordo_jax.diloco,
    dict(sync_every=2),
    ADAM | ROUND | {"outer_learning_rate", "outer_momentum"},
  ),
  "local_adam": (lordo_jax.local_adam, dict(sync_every=2), ADAM | ROUND),
  "desloc": (lordo_jax.desloc, dict(sync_every=2, first_moment_every=4), ADAM | ROUND),
}
STEPS = 6
SWITCH = 3  # The learning rate changes from 1e-2 to 4e-3 after this many steps.


def gradient(params, t):
  return jax.tree.map(lambda p: jnp.sin(p * (t + 1)) + 0.1 * p, params)


def run(tx, set_rate=None):
  """``STEPS`` jitted updates; ``set_rate(state, t)`` may change the state between."""
  update = jax.jit(tx.update)
  params, state = PARAMS, tx.init(PARAMS)
  for t in range(STEPS):
    if set_rate is not None:
      state = set_rate(state, t)
    updates, state = update(gradient(params, t), state, params)
    params = optax.apply_updates(params, updates)
  return params, state


@pytest.mark.parametrize("method", sorted(CASES))
def test_only_continuous_hyperparameters_are_injected(method):
  factory, integers, continuous = CASES[method]
  tx = optax.inject_hyperparams(factory, static_args=tuple(integers))(1e-2, **integers)
  assert set(tx.init(PARAMS).hyperparams) == continuous


@pytest.mark.parametrize("method", sorted(CASES))
def test_a_learning_rate_changed_mid_run_equals_the_same_schedule(method):
  factory, integers, _ = CASES[method]
  injected = optax.inject_hyperparams(factory, static_args=tuple(integers))(1e-2, **integers)

  def set_rate(state, t):
    if t == SWITCH:
      state.hyperparams["learning_rate"] = jnp.asarray(4e-3)
    return state

  params, state = run(injected, set_rate)
  schedule = optax.piecewise_constant_schedule(1e-2, {SWITCH: 0.4})
  expected, _ = run(factory(schedule, **integers))
  for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(expected), strict=True):
    # 4e-3 stored in float32 against the schedule's 1e-2 * 0.4: a rounding apart.
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
  assert optax.tree_utils.tree_get(state, "learning_rate") == pytest.approx(4e-3)
  # And the change mattered: a constant rate ends elsewhere.
  constant, _ = run(factory(1e-2, **integers))
  assert not np.allclose(np.asarray(constant["w"]), np.asarray(params["w"]), atol=1e-6)


@pytest.mark.parametrize("method", [m for m in sorted(CASES) if CASES[m][1]], ids=lambda m: m)
def test_one_error_names_every_integer_to_list_in_static_args(method):
  factory, integers, _ = CASES[method]
  with pytest.raises(ValueError) as error:
    optax.inject_hyperparams(factory)(1e-2, **integers).init(PARAMS)
  message = str(error.value)
  assert f"static_args={tuple(integers)!r}" in message
  for name in integers:
    assert f"{name}=Array(" in message


def test_a_sync_rule_is_a_static_arg_too():
  """inject_hyperparams takes a callable for a schedule: the rule must be static."""
  rule = lordo_jax.quadratic_sync_rule(2, 0.01, 1e-2)
  with pytest.raises(ValueError, match=r"static_args=\('rank', 'sync_every'\)"):
    optax.inject_hyperparams(lordo_jax.lordo)(1e-2, rank=2, sync_every=rule).init(PARAMS)
  tx = optax.inject_hyperparams(lordo_jax.lordo, static_args=("rank", "sync_every"))(
    1e-2, rank=2, sync_every=rule
  )
  params, _ = run(tx)
  expected, _ = run(lordo_jax.lordo(1e-2, rank=2, sync_every=rule))
  # Injected hyperparameters are arrays, not constants XLA folds: equal to rounding.
  np.testing.assert_allclose(np.asarray(params["w"]), np.asarray(expected["w"]), atol=1e-6)


def test_the_primitive_names_its_integers_too():
  with pytest.raises(ValueError, match=r"static_args=\('rank', 'refresh_every'\)"):
    optax.inject_hyperparams(lordo_jax.scale_by_low_rank_adam)(rank=2, refresh_every=4).init(
      {"w": jnp.ones((16, 8))}
    )


def test_a_scheduled_rate_is_read_from_hyperparams_as_the_optax_guide_says():
  """``state.hyperparams["learning_rate"]`` is the rate the last update used; optax's
  ``tree_get`` also finds the schedule's state under that name and raises."""
  schedule = optax.linear_schedule(1.0, 0.0, 10)
  tx = optax.inject_hyperparams(lordo_jax.lordo, static_args=("rank", "sync_every"))(
    learning_rate=schedule, rank=2, sync_every=4
  )
  params = {"w": jnp.ones((8, 8))}
  state = tx.init(params)
  assert float(state.hyperparams["learning_rate"]) == 1.0
  for t in range(3):
    _, state = tx.update(params, state, params)
    np.testing.assert_allclose(state.hyperparams["learning_rate"], schedule(t), rtol=1e-6)
  with pytest.raises(KeyError, match="multiple values for 'learning_rate'"):
    optax.tree_utils.tree_get(state, "learning_rate")
