"""lordo_jax.checkpoint with Flax NNX: restore into the targets Flax users build.

One worker with ``sync_every=4`` trains a small MLP through ``nnx.Optimizer`` and is
saved at step 6, mid-round. The checkpoint is restored into a freshly built
``nnx.Optimizer`` (which holds its moments as NamedTuples, where the saved one held
dicts), into an abstract target from ``jax.eval_shape`` whose shardings name an
``AbstractMesh``, and into the plain optax state ``tx.init(params)``; each resumed
run equals the uninterrupted one after the round ends at step 8, bit for bit (the
abstract target's at float32 rounding: its own test says why).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import lordo_jax
from lordo_jax import checkpoint

pytestmark = pytest.mark.timeout(300, method="thread")

K = 4  # sync_every: a round ends at step 8
SAVED_AT = 6  # mid-round
N = 8


class MLP(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.up = nnx.Linear(8, 16, rngs=rngs)
    self.down = nnx.Linear(16, 8, rngs=rngs)

  def __call__(self, x):
    return self.down(nnx.gelu(self.up(x)))


def make_tx(rank=2):
  return lordo_jax.lordo(3e-2, rank=rank, sync_every=K, error_feedback=True)


def build(rank=2):
  model = MLP(nnx.Rngs(0))
  return model, nnx.Optimizer(model, make_tx(rank), wrt=nnx.Param)


def batch(t):
  kx, ky = jax.random.split(jax.random.key(t))
  return jax.random.normal(kx, (4, 8)), jax.random.normal(ky, (4, 8))


def loss_fn(model, x, y):
  return jnp.mean((model(x) - y) ** 2)


@nnx.jit
def train_step(model, optimizer, x, y):
  grads = nnx.grad(loss_fn)(model, x, y)
  optimizer.update(model, grads)


def run(model, optimizer, steps):
  for t in steps:
    train_step(model, optimizer, *batch(t))


def by_path(tree):
  """Leaves keyed by path, attributes and dict keys spelled alike (NamedTuple or dict)."""

  def name(entry):
    return str(getattr(entry, "name", getattr(entry, "key", getattr(entry, "idx", entry))))

  return {
    "/".join(name(e) for e in path): leaf
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
  }


def assert_bit_identical(a, b):
  leaves_a, leaves_b = by_path(a), by_path(b)
  assert leaves_a.keys() == leaves_b.keys()
  for path, x in leaves_a.items():
    np.testing.assert_array_equal(np.asarray(x), np.asarray(leaves_b[path]), err_msg=path)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """The checkpoint at step 6 and the uninterrupted run's state after step 8."""
  directory = tmp_path_factory.mktemp("nnx")
  model, optimizer = build()
  run(model, optimizer, range(SAVED_AT))
  checkpoint.save(directory, SAVED_AT, nnx.state(model), nnx.state(optimizer))
  at_save = nnx.as_pure(optimizer.opt_state)
  whole_at_save = nnx.as_pure(nnx.state(optimizer))
  run(model, optimizer, range(SAVED_AT, N))
  return directory, at_save, nnx.state(model), nnx.state(optimizer), whole_at_save


def test_restores_into_a_fresh_optimizer(saved):
  directory, _, model_ref, optimizer_ref, _ = saved
  model, optimizer = build()  # never updated: its moments are NamedTuples
  params, state = checkpoint.restore(directory, SAVED_AT, nnx.state(model), nnx.state(optimizer))
  nnx.update(model, params)
  nnx.update(optimizer, state)
  run(model, optimizer, range(SAVED_AT, N))
  assert_bit_identical(nnx.state(model), model_ref)
  assert_bit_identical(nnx.state(optimizer), optimizer_ref)


def test_restores_into_an_abstract_target_on_an_abstract_mesh(saved):
  """Restored exactly; the resumed run within float32 rounding of the uninterrupted one.

  An optimizer updated with arrays restored into abstract targets is traced by
  ``nnx.jit`` into another program than the uninterrupted run's (the same values, avals
  and shardings: measured), and XLA fuses it otherwise, by the CPU it compiles for. The
  restore itself is compared bit for bit; the run after it leaf by leaf within
  :data:`ROUNDING` of the leaf's largest magnitude (:func:`assert_close`).
  """
  directory, _, model_ref, optimizer_ref, whole_at_save = saved
  model, optimizer = build()
  abstract_mesh = jax.make_mesh((1,), ("data",)).abstract_mesh
  replicated = jax.sharding.NamedSharding(abstract_mesh, jax.P())
  targets = jax.tree.map(
    lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=replicated),
    jax.eval_shape(lambda: (nnx.state(model), nnx.state(optimizer))),
  )
  params, state = checkpoint.restore(directory, SAVED_AT, *targets)
  assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(state))
  assert_bit_identical(nnx.as_pure(state), whole_at_save)
  nnx.update(model, params)
  nnx.update(optimizer, state)
  run(model, optimizer, range(SAVED_AT, N))
  assert_close(nnx.state(model), model_ref)
  assert_close(nnx.state(optimizer), optimizer_ref)


# Two programs of the same arithmetic, fused differently, two steps and a round's refresh
# after the restore: each leaf within 1e-5 of its largest magnitude (about 80 float32
# ulps). Elementwise relative error is no measure here: a refreshed basis is computed from
# the round's mean, and its small entries carry the rounding of its large ones. Seen: an
# error buffer's 2 of 128 elements 7.5e-9 apart on one CPU; on another a basis's 2 of 32
# entries 1.9e-7 apart (4.5e-6 of the entry, 6e-7 of the basis's largest).
ROUNDING = 1e-5


def assert_close(a, b):
  """Each leaf of ``a`` within :data:`ROUNDING` of ``b``'s largest magnitude (normwise)."""
  leaves_a, leaves_b = by_path(a), by_path(b)
  assert leaves_a.keys() == leaves_b.keys()
  for path, x in leaves_a.items():
    want = np.asarray(leaves_b[path])
    scale = float(np.max(np.abs(want), initial=0.0))
    np.testing.assert_allclose(np.asarray(x), want, rtol=0, atol=ROUNDING * scale, err_msg=path)


def test_restores_into_the_plain_optax_state(tmp_path, saved):
  """Saved as ``nnx.as_pure(optimizer.opt_state)``, restored into ``tx.init(params)``.

  The resumed optax loop is compared with the same loop started from the
  uninterrupted run's state at step 6 (never written to disk).
  """
  directory, at_save, _, _, _ = saved
  model, optimizer = build()
  run(model, optimizer, range(SAVED_AT))
  graphdef, params = nnx.split(model, nnx.Param)
  checkpoint.save(tmp_path, SAVED_AT, nnx.as_pure(params), nnx.as_pure(optimizer.opt_state))

  tx = make_tx()
  fresh = nnx.as_pure(nnx.state(MLP(nnx.Rngs(0)), nnx.Param))
  restored_params, restored = checkpoint.restore(tmp_path, SAVED_AT, fresh, tx.init(fresh))
  assert type(restored) is type(tx.init(fresh))
  assert_bit_identical(restored, at_save)

  @jax.jit
  def optax_step(params, state, x, y):
    grads = jax.grad(lambda p: loss_fn(nnx.merge(graphdef, p), x, y))(params)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  def finish(params, state):
    for t in range(SAVED_AT, N):
      params, state = optax_step(params, state, *batch(t))
    return params, state

  assert_bit_identical(finish(restored_params, restored), finish(nnx.as_pure(params), at_save))


def test_another_rank_names_the_leaves_in_one_screen(saved):
  directory = saved[0]
  model, optimizer = build(rank=3)
  with pytest.raises(checkpoint.CheckpointMismatchError) as raised:
    checkpoint.restore(directory, SAVED_AT, nnx.state(model), nnx.state(optimizer))
  message = str(raised.value)
  assert "another shape or dtype (another rank?)" in message
  lines = message.splitlines()  # The basis of the kernels' shape group (stored per group).
  assert any("basis" in line and "float32(16, 2) in the checkpoint" in line for line in lines)
  assert len(message.splitlines()) <= 24  # one screen
  assert raised.value.__cause__ is None


def test_another_method_names_the_leaves_in_one_screen(saved):
  directory = saved[0]
  model = MLP(nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, optax.adamw(3e-2), wrt=nnx.Param)
  with pytest.raises(checkpoint.CheckpointMismatchError) as raised:
    checkpoint.restore(directory, SAVED_AT, nnx.state(model), nnx.state(optimizer))
  message = str(raised.value)
  assert "leaves in the checkpoint but not in the target (another method?)" in message
  assert "leaves in the target but not in the checkpoint (another method?)" in message
  assert len(message.splitlines()) <= 24  # one screen
