"""How ``scale_by_low_rank_adam`` computes its step: state shapes and the compiled step.

The maths is checked against the NumPy reference in ``test_reference.py``; these
tests hold the layout choices that keep the step fast (see the module docstring of
:mod:`lordo_jax.local._low_rank_adam`): moments in MATH.md §2's frame, a state that can be
donated, and a compiled local step that never transposes or copies a full matrix; and
its type: an ``optax.GradientTransformationExtraArgs`` whose entry points (``refresh``,
``refresh_due``, ``project``, ``step``) travel with it.
"""

import copy
import pickle
import re

import jax
import jax.numpy as jnp
import optax
import pytest

import lordo_jax

P, Q, RANK = 48, 160, 8  # Projected on the right (p < q): Q is q x r.


def low_rank_step(**options):
  return optax.chain(
    lordo_jax.scale_by_low_rank_adam(RANK, omega=0.7, init_projection="random", **options),
    optax.scale_by_learning_rate(1e-3),
  )


@pytest.mark.parametrize("shape", [(P, Q), (Q, P)])
def test_state_shapes_follow_spec_section_2(shape):
  tx = low_rank_step(error_feedback=True)
  (state, _) = tx.init({"w": jnp.zeros(shape)})
  m = state.moments.matrices()["w"]
  left = shape[0] >= shape[1]
  assert m.basis.shape == (max(shape), RANK)
  assert m.mu.shape == m.nu.shape == ((RANK, shape[1]) if left else (shape[0], RANK))
  assert m.error.shape == shape


@pytest.mark.parametrize("projection", lordo_jax.local._projection.METHODS)
def test_the_state_can_be_donated(projection):
  tx = low_rank_step(projection=projection)
  params = {"w": jnp.ones((P, Q))}
  step = jax.jit(
    lambda p, s, g: (lambda u, s: (optax.apply_updates(p, u), s))(*tx.update(g, s, p)),
    donate_argnums=(0, 1),
  )
  params, state = step(params, tx.init(params), {"w": jnp.ones((P, Q))})
  params, state = step(params, state, {"w": jnp.ones((P, Q))})
  assert bool(jnp.all(jnp.isfinite(params["w"])))


@pytest.mark.parametrize("projection", lordo_jax.local._projection.METHODS)
@pytest.mark.parametrize("shape", [(P, Q), (Q, P)])
def test_the_local_step_never_transposes_or_copies_a_matrix(projection, shape):
  tx = low_rank_step(projection=projection)
  params = {"w": jnp.zeros(shape)}

  def step(p, s, g):
    updates, s = tx.update(g, s, p)
    return optax.apply_updates(p, updates), s

  hlo = jax.jit(step, donate_argnums=(0, 1)).lower(params, tx.init(params), params)
  text = hlo.compile().as_text()
  full = rf"f32\[{shape[0]},{shape[1]}\]|f32\[{shape[1]},{shape[0]}\]"
  moved = [
    line for line in text.splitlines() if re.search(rf"= ({full})\S* (transpose|copy)\(", line)
  ]
  assert not moved, moved


def test_tree_map_params_maps_the_moments_of_every_group():
  # optax.tree_utils.tree_map_params calls init on a placeholder: the state per shape
  # group it gives must be a prefix of the real one, its function mapping the moments.
  tx = low_rank_step(error_feedback=True)
  params = {"a": jnp.ones((P, Q)), "b": jnp.ones((P, Q)), "c": jnp.ones((Q, P))}
  _, state = tx.update(params, tx.init(params), params)
  mapped = optax.tree_utils.tree_map_params(tx, lambda v: v + 1, state)
  assert len(state[0].moments.groups) == 2
  assert mapped[0].count == state[0].count
  new, old = mapped[0].moments, state[0].moments
  assert jax.tree.all(jax.tree.map(lambda n, o: jnp.array_equal(n, o + 1), new, old))


def _entry_point(*args, **kwargs):  # A module-level function: pickles by name.
  del args, kwargs


def _entry_points(tx) -> tuple:
  return tx.refresh, tx.refresh_due, tx.project, tx.step


def test_it_is_an_optax_gradient_transformation_with_extra_args():
  tx = lordo_jax.scale_by_low_rank_adam(rank=2)
  assert isinstance(tx, optax.GradientTransformation)
  assert isinstance(tx, optax.GradientTransformationExtraArgs)
  assert isinstance(tx, lordo_jax.LowRankAdam)
  assert optax.with_extra_args_support(tx) is tx  # optax.partition takes it as it is.
  init, update = tx  # Unpacks as optax's two functions.
  params = {"w": jnp.ones((8, 4))}
  grads = {"w": jnp.arange(32.0).reshape(8, 4)}
  updates, _ = update(grads, init(params), params, unknown_extra_arg=1)  # Ignored.
  assert updates["w"].shape == (8, 4)


def test_the_entry_points_survive_tree_maps_copies_and_replace():
  tx = lordo_jax.scale_by_low_rank_adam(rank=2, refresh_every=3)
  assert jax.tree.leaves(tx) == [tx.init, tx.update, *_entry_points(tx)]
  for other in (
    jax.tree.map(lambda f: f, tx),
    jax.tree.unflatten(*reversed(jax.tree.flatten(tx))),
    copy.copy(tx),
    copy.deepcopy(tx),
    tx._replace(),
    tx._replace(update=tx.update),
  ):
    assert type(other) is lordo_jax.LowRankAdam
    assert tuple(other) == tuple(tx)
    assert _entry_points(other) == _entry_points(tx)
  replaced = tx._replace(step=_entry_point)
  assert replaced.step is _entry_point and replaced.project is tx.project
  with pytest.raises(ValueError, match="no function"):
    tx._replace(steps=_entry_point)
  # The copy works: its project and step are the original's.
  params = {"w": jnp.ones((8, 4))}
  grads = {"w": jnp.arange(32.0).reshape(8, 4)}
  twin = copy.deepcopy(tx)
  state = twin.init(params)
  state = twin.refresh(state, grads, first=True)
  direct, _ = tx.step(grads, state, tx.project(grads, state))
  via_copy, _ = twin.step(grads, state, twin.project(grads, state))
  assert jnp.array_equal(direct["w"], via_copy["w"])


def test_the_entry_points_survive_pickling():
  # Its own closures pickle only with a pickler of closures (as optax.adam's): pickle
  # gets every function by keyword, and a LowRankAdam of picklable functions round-trips.
  tx = lordo_jax.scale_by_low_rank_adam(rank=2)
  _, (cls, args, kwargs), *_ = tx.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
  assert cls is lordo_jax.LowRankAdam
  assert args == (tx.init, tx.update)
  names = ("refresh", "refresh_due", "project", "step")
  assert kwargs == dict(zip(names, _entry_points(tx), strict=True))
  named = lordo_jax.LowRankAdam(
    _entry_point,
    _entry_point,
    refresh=_entry_point,
    refresh_due=_entry_point,
    project=_entry_point,
    step=_entry_point,
  )
  restored = pickle.loads(pickle.dumps(named))
  assert type(restored) is lordo_jax.LowRankAdam
  assert _entry_points(restored) == (_entry_point,) * 4
