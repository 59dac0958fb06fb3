"""``lordo_jax.warm_start_state``: a fresh state with another run's inner optimizer state.

On hand-made states (a low-rank DDP state with every leaf set, and a fresh LoRDO state):
every inner optimizer state moves (per-matrix basis, moments, error buffer; Adam's
moments of the full-rank leaves; every step counter) and nothing else does (LoRDO's
anchor, ledger and round counters stay fresh); another optimizer, model or rank is
refused with a message that says what to change. The LM job's warm start, built on
it, is checked end to end in ``tests/integration/test_lm_warm_start.py``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lordo_jax
from lordo_jax.state import _warm_start as warm_start


def assert_trees_equal(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y), strict=True)


def matrices(state):
  """Every low-rank matrix's state in ``state``, in tree order."""
  leaves = jax.tree.leaves(state, is_leaf=warm_start.is_matrix_state)
  return [leaf for leaf in leaves if warm_start.is_matrix_state(leaf)]


def tiny_states(error_feedback: bool):
  """A low-rank DDP state with every leaf set, and a fresh LoRDO state."""
  params = {"w": jnp.ones((16, 8)), "v": jnp.ones((8, 12)), "b": jnp.zeros(8)}
  lr = optax.linear_schedule(1e-2, 1e-3, 10)  # its state holds a step count
  ddp = lordo_jax.low_rank_ddp(lr, rank=2, refresh_every=4, error_feedback=True)
  lordo = lordo_jax.lordo(
    lr, rank=2, sync_every=4, error_feedback=error_feedback, init_projection="random"
  )
  set_all = lambda x: x + (7 if jnp.issubdtype(x.dtype, jnp.integer) else 1.5)  # noqa: E731
  source = jax.tree.map(set_all, ddp.init(params))
  return source, lordo.init(jax.tree.map(lambda x: x + 3.0, params))


@pytest.mark.parametrize("moments", warm_start.MOMENTS)
@pytest.mark.parametrize("error_feedback", [True, False])
def test_moves_the_inner_optimizer_state_only(error_feedback, moments):
  source, target = tiny_states(error_feedback)
  moved = lordo_jax.warm_start_state(source, target, moments=moments)
  old, fresh, new = map(warm_start.inner_states, (source, target, moved))
  assert [type(s).__name__ for s in new] == [
    "ScaleByAdamState",
    "LowRankAdamState",
    "ScaleByScheduleState",
  ]
  for o, n in zip(old, new, strict=True):
    assert int(n.count) == int(o.count) == 7  # every counter continues
  full_old, full_fresh, full_new = old[0], fresh[0], new[0]
  kept = full_old if moments == "keep" else full_fresh
  assert_trees_equal((full_new.mu, full_new.nu), (kept.mu, kept.nu))
  old_m, fresh_m, new_m = map(matrices, (source, target, moved))
  assert len(new_m) == len(old_m) == 2
  for o, f, n in zip(old_m, fresh_m, new_m, strict=True):
    np.testing.assert_array_equal(n.basis, o.basis, strict=True)
    kept = o if moments == "keep" else f
    np.testing.assert_array_equal(n.mu, kept.mu, strict=True)
    np.testing.assert_array_equal(n.nu, kept.nu, strict=True)
    expected = o.error if error_feedback else f.error  # (0,) without error feedback
    np.testing.assert_array_equal(n.error, expected, strict=True)
    if moments == "reset":
      assert not np.any(n.mu) and not np.any(n.nu)
  # LoRDO's own: the anchor (the parameters it was built from), ledger, round counters.
  assert_trees_equal(moved.anchor, target.anchor)
  assert_trees_equal(
    (moved.count, moved.ledger, moved.syncs, moved.next_sync),
    (target.count, target.ledger, target.syncs, target.next_sync),
  )
  assert int(moved.count) == 0 and lordo_jax.communicated_bytes(moved) == 0


def test_refuses_another_optimizer():
  source, _ = tiny_states(True)
  params = {"w": jnp.ones((16, 8))}
  fewer = lordo_jax.lordo(optax.linear_schedule(1e-2, 1e-3, 10), rank=2, sync_every=4)
  for other in (params | {"b": jnp.zeros(8)}, params | {"v": jnp.ones((8, 12))}):
    with pytest.raises(ValueError, match="of the same model, rank and"):
      lordo_jax.warm_start_state(source, fewer.init(other))
  ddp = lordo_jax.ddp(optax.linear_schedule(1e-2, 1e-3, 10))
  with pytest.raises(ValueError, match="same inner optimizer"):
    lordo_jax.warm_start_state(source, ddp.init(params))
  with pytest.raises(ValueError, match="'keep', 'reset'"):
    lordo_jax.warm_start_state(source, source, moments="zero")


def test_refuses_another_rank_or_side():
  source, _ = tiny_states(True)
  params = {"w": jnp.ones((16, 8)), "v": jnp.ones((8, 12)), "b": jnp.zeros(8)}
  lr = optax.linear_schedule(1e-2, 1e-3, 10)
  rank3 = lordo_jax.lordo(lr, rank=3, sync_every=4, error_feedback=True)
  with pytest.raises(ValueError, match="basis is shaped .* of the same rank and projection"):
    lordo_jax.warm_start_state(source, rank3.init(params))
  # galore_std moves v's (8 x 12) basis from its 12-side to its 8-side (and w's too).
  std = lordo_jax.lordo(lr, rank=2, sync_every=4, error_feedback=True, side="galore_std")
  with pytest.raises(ValueError, match=r"basis is shaped \(12, 2\), the target's \(8, 2\)"):
    lordo_jax.warm_start_state(source, std.init(params))
