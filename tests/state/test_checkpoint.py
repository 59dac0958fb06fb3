"""lordo_jax.checkpoint: a restart changes nothing, and a wrong restart says why.

Every run here is 4 workers under ``shard_map`` (or one worker under ``jit``) on a
small heterogeneous regression with two matrices (one projected on each side) and a
bias. A resumed run rebuilds everything from scratch: a new optimizer object, its
``init``, a new jitted step; only the checkpoint carries over. Two runs rebuilt from
the same seeds are bit-identical (checked in the ``straight`` fixture).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lordo_jax
from lordo_jax import checkpoint
from tests.helpers import workers

pytestmark = pytest.mark.timeout(300, method="thread")

M = 4  # workers
N = 10  # steps of a run
K = 4  # sync_every: syncs end steps 4 and 8
RESUME_AFTER = {"right_after_a_sync": 4, "mid_round": 6}


def init_params():
  k1, k2 = jax.random.split(jax.random.key(0))
  return {
    "w1": jax.random.normal(k1, (16, 12)) / 4,  # projected on the left
    "b1": jnp.zeros(12),
    "w2": jax.random.normal(k2, (12, 20)) / 4,  # projected on the right
  }


def loss_fn(params, batch):
  x, y = batch
  return jnp.mean((jnp.tanh(x @ params["w1"] + params["b1"]) @ params["w2"] - y) ** 2)


def batch(t: int):
  """Step t's data, one slice per worker; each worker has its own target map."""
  kx, kt = jax.random.split(jax.random.key(100 + t))
  x = jax.random.normal(kx, (M, 8, 16))
  maps = jax.random.normal(jax.random.key(7), (M, 16, 20)) / 4
  maps = maps + 0.3 * jax.random.normal(kt, (M, 16, 20)) / 4
  return x, jnp.einsum("mnp,mpq->mnq", x, maps)


OPTIMIZERS = {
  # Its initial bases are drawn from a seed (``init_projection="random"``).
  "lordo": lambda: lordo_jax.lordo(
    3e-2,
    rank=3,
    sync_every=K,
    axis_name=workers.AXIS,
    error_feedback=True,
    outer_optimizer=optax.sgd(0.7, momentum=0.9, nesterov=True),
    fault_tolerant=True,
    init_projection="random",
    seed=3,
  ),
  # DCT bases (r frequencies of a size), and a message in flight at step 6: frozen at
  # step 4, half its chunks sent (2 of 4; 2 of 3).
  "lordo_dct_overlap_round_int8": lambda: lordo_jax.lordo(
    3e-2,
    rank=3,
    sync_every=K,
    axis_name=workers.AXIS,
    projection="dct",
    overlap="round",
    compression="int8",
  ),
  "diloco_overlap_window_offload": lambda: lordo_jax.diloco(
    3e-2,
    sync_every=K,
    axis_name=workers.AXIS,
    overlap=3,
    merge="streaming",
    merge_alpha=0.5,
    offload=True,
  ),
  # Streaming with a window: fragments frozen at steps 3 and 6 (K = 6), each sending 2
  # chunks; at step 4 the first is in flight with 1 of its 2 chunks sent.
  "lordo_overlap_fragments_int8_offload": lambda: lordo_jax.lordo(
    3e-2,
    rank=3,
    sync_every=6,
    axis_name=workers.AXIS,
    overlap=2,
    fragments=2,
    compression="int8",
    offload=True,
  ),
  # One fragment: the per-fragment state is the streaming runs' above.
  "lordo_beyond": lambda: lordo_jax.lordo(
    3e-2,
    rank=3,
    sync_every=K,
    axis_name=workers.AXIS,
    two_sided=True,
    projection="randomized_svd",
    compression="int8",
  ),
}


class Run:
  """A freshly built optimizer, its state on M workers, and its jitted step."""

  def __init__(self, name: str):
    self.tx = OPTIMIZERS[name]()
    self.mesh = jax.make_mesh((M,), (workers.AXIS,), devices=jax.devices()[:M])
    self.step_fn = workers.make_step(self.tx, loss_fn, self.mesh)
    self.t = 0
    self.params, self.state = self.fresh()

  def fresh(self):
    """Params and ``tx.init(params)``, stacked and sharded over the workers."""
    params = init_params()
    stacked = workers.stack((params, self.tx.init(params)), M)
    return workers.shard(stacked, self.mesh)

  def step(self):
    self.params, self.state = self.step_fn(
      self.params, self.state, workers.shard(batch(self.t), self.mesh)
    )
    jax.block_until_ready((self.params, self.state))
    self.t += 1


def assert_trees_equal(actual, expected):
  """Same structure, and every leaf bit-identical (same dtype, shape and values)."""
  assert jax.tree.structure(actual) == jax.tree.structure(expected)
  paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(expected)]
  for path, a, e in zip(paths, jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
    a, e = jax.device_get(a), jax.device_get(e)
    assert a.dtype == e.dtype, path
    np.testing.assert_array_equal(a, e, err_msg=path, strict=True)


@pytest.fixture(
  scope="module",
  params=[
    "lordo",
    "lordo_dct_overlap_round_int8",
    "diloco_overlap_window_offload",
    "lordo_overlap_fragments_int8_offload",
  ],
)
def straight(request, tmp_path_factory):
  """N steps without a stop, checkpointing (asynchronously) after each k in RESUME_AFTER
  (and keeping what it saved); and a second run built anew (a new optimizer, its own
  init and step: nothing shared with the first) that each resume restores into.

  The second run first takes the first run's first K + 2 steps from its own init:
  two runs rebuilt from the same seeds are bit-identical (data, and the bases of
  ``init_projection="random"``), and they did something: the workers disagree there,
  mid-round."""
  directory = tmp_path_factory.mktemp(f"ckpt_{request.param}")
  run, again = Run(request.param), Run(request.param)
  saved = {}
  with checkpoint.Checkpointer(directory) as ckpt:
    for _ in range(N):
      run.step()
      if run.t <= K + 2:
        again.step()
        if run.t == K + 2:
          assert_trees_equal(again.params, run.params)
          assert_trees_equal(again.state, run.state)
          w1 = jax.device_get(run.params["w1"])
          assert not np.array_equal(w1[0], w1[1])
      if run.t in RESUME_AFTER.values():
        ckpt.save(run.t, run.params, run.state)
        saved[run.t] = (run.params, run.state)
  return request.param, directory, run, again, saved


def assert_dct_bases_refreshed(state):
  """The DCT bases of ``state`` (w1 16 x 12 on the left, w2 12 x 20 on the right) came
  back refreshed: their frequencies are no longer the first r."""
  bases = [
    b
    for b in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, lordo_jax.DCTBasis))
    if isinstance(b, lordo_jax.DCTBasis)
  ]
  assert sorted(b.size for b in bases) == [16, 20]
  assert any(not np.array_equal(jax.device_get(b.indices)[0], np.arange(3)) for b in bases)


@pytest.mark.parametrize("when", RESUME_AFTER)
def test_resume_is_bit_identical(straight, when):
  name, directory, reference, resumed, saved = straight
  k = RESUME_AFTER[when]
  params_like, state_like = resumed.fresh()
  resumed.params, resumed.state = checkpoint.restore(directory, k, params_like, state_like)
  resumed.t = k
  assert_trees_equal(resumed.params, saved[k][0])
  assert_trees_equal(resumed.state, saved[k][1])
  # The restored state landed where the training loop keeps it, with the loop's sharding.
  for restored, like in zip(
    jax.tree.leaves(resumed.state), jax.tree.leaves(state_like), strict=True
  ):
    assert restored.sharding == like.sharding
  assert int(jax.device_get(resumed.state.count)[0]) == k
  if name == "lordo_dct_overlap_round_int8":
    assert_dct_bases_refreshed(resumed.state)
  for _ in range(N - k):
    resumed.step()
  assert_trees_equal(resumed.params, reference.params)
  assert_trees_equal(resumed.state, reference.state)
  assert lordo_jax.communicated_bytes(resumed.state) == lordo_jax.communicated_bytes(
    reference.state
  )


def test_two_sided_compressed_state_resumes_bit_identically(tmp_path):
  """Two-sided bases and the compression residual come back, and the randomized SVD's
  draws after the resume (keyed by the restored step count) are the straight run's.
  (Per-fragment state: ``lordo_overlap_fragments_int8_offload`` above.)"""
  straight = Run("lordo_beyond")
  for _ in range(K + 1):  # mid-round, after a sync
    straight.step()
  checkpoint.save(tmp_path, straight.t, straight.params, straight.state)
  resumed = Run("lordo_beyond")
  resumed.params, resumed.state = checkpoint.restore(tmp_path, straight.t, *resumed.fresh())
  resumed.t = straight.t
  assert any(np.any(jax.device_get(r)) for r in jax.tree.leaves(resumed.state.residual))
  for _ in range(K):
    straight.step()
    resumed.step()
  assert_trees_equal(resumed.params, straight.params)
  assert_trees_equal(resumed.state, straight.state)


def test_single_device_resume_is_bit_identical(tmp_path):
  """One worker (``axis_name=None``) under plain ``jit``, unstacked state, bf16 error buffers."""

  def build():
    tx = lordo_jax.lordo(
      3e-2, rank=3, sync_every=K, error_feedback=True, error_feedback_dtype="bfloat16"
    )

    @jax.jit
    def step(params, state, data):
      grads = jax.grad(loss_fn)(params, data)
      updates, state = tx.update(grads, state, params)
      return optax.apply_updates(params, updates), state

    return tx, step

  def first(t):
    x, y = batch(t)
    return x[0], y[0]

  tx, step = build()
  params = init_params()
  state = tx.init(params)
  for t in range(N):
    params, state = jax.block_until_ready(step(params, state, first(t)))
    if t + 1 == 6:
      checkpoint.save(tmp_path, t + 1, params, state)

  tx2, step2 = build()
  params2, state2 = checkpoint.restore(tmp_path, None, init_params(), tx2.init(init_params()))
  for t in range(6, N):
    params2, state2 = jax.block_until_ready(step2(params2, state2, first(t)))
  assert_trees_equal(params2, params)
  assert_trees_equal(state2, state)


def test_restore_into_abstract_targets(saved_lordo):
  """``jax.eval_shape`` targets (no arrays allocated) work; no sharding means device 0."""
  tx = lordo_jax.lordo(3e-2, rank=3, sync_every=K)
  params_like = jax.eval_shape(init_params)
  state_like = jax.eval_shape(tx.init, params_like)
  params, state = checkpoint.restore(saved_lordo, 1, params_like, state_like)
  expected_params, expected_state = checkpoint.restore(
    saved_lordo, 1, init_params(), tx.init(init_params())
  )
  assert_trees_equal(params, expected_params)
  assert_trees_equal(state, expected_state)
  assert all(x.devices() == {jax.devices()[0]} for x in jax.tree.leaves(state))


@pytest.fixture(scope="module")
def saved_lordo(tmp_path_factory):
  """A rank-3 LoRDO checkpoint (single worker, after one step)."""
  directory = tmp_path_factory.mktemp("ckpt_rank3")
  tx = lordo_jax.lordo(3e-2, rank=3, sync_every=K)
  params = init_params()
  grads = jax.tree.map(lambda x: jnp.sin(3 * x), params)  # As in the per-group test below.
  _, state = jax.jit(tx.update)(grads, tx.init(params), params)
  checkpoint.save(directory, 1, params, state)
  return directory


def restore_error(directory, params, tx) -> str:
  with pytest.raises(checkpoint.CheckpointMismatchError) as error:
    checkpoint.restore(directory, 1, params, tx.init(params))
  return str(error.value)


def test_restore_into_another_rank_names_the_leaves_and_shapes(saved_lordo):
  message = restore_error(saved_lordo, init_params(), lordo_jax.lordo(3e-2, rank=2, sync_every=K))
  assert "another shape" in message
  # w1 (16 x 12), the first shape group, is projected on the left: basis 16 x r, moments r x 12.
  path = ".inner_state[0].inner_states['low_rank'].inner_state.moments.groups[0]"
  assert f"{path}.basis: float32(16, 3) in the checkpoint, float32(16, 2) in the target" in message
  assert f"{path}.mu: float32(3, 12) in the checkpoint, float32(2, 12) in the target" in message


@pytest.mark.parametrize(
  "other, root",
  [
    (lambda: lordo_jax.diloco(3e-2, sync_every=K), None),
    (lambda: optax.adamw(3e-2), "the checkpoint holds a SynchronizeState, the target is a tuple"),
  ],
  ids=["diloco", "adamw"],
)
def test_restore_into_another_method_names_missing_and_extra_leaves(saved_lordo, other, root):
  tx = other()
  message = restore_error(saved_lordo, init_params(), tx)
  assert "in the checkpoint but not in the target" in message
  assert "in the target but not in the checkpoint" in message
  assert "inner_states['low_rank'].inner_state.moments.groups[0].basis" in message  # lordo's
  target_paths = [
    jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(tx.init(init_params()))
  ]
  assert target_paths[0] in message  # the first of the target's own leaves is named
  if root is not None:
    assert root in message


def test_restore_into_another_model_names_the_params(saved_lordo):
  params = {**init_params(), "w1": jnp.zeros((16, 10))}
  message = restore_error(saved_lordo, params, lordo_jax.lordo(3e-2, rank=3, sync_every=K))
  assert "its params do not match" in message
  assert "['w1']: float32(16, 12) in the checkpoint, float32(16, 10) in the target" in message


def test_restore_of_a_missing_step_says_which_steps_exist(saved_lordo):
  with pytest.raises(FileNotFoundError, match=r"step 7 .*steps there: \[1\]"):
    checkpoint.restore(
      saved_lordo, 7, init_params(), lordo_jax.lordo(3e-2, rank=3, sync_every=K).init(init_params())
    )


def test_a_checkpoint_with_zero_size_error_placeholders_restores(tmp_path):
  """A state saved when a matrix without error feedback held a ``(0,)`` array as its
  error buffer (it holds ``()`` now) restores into today's state."""
  tx = lordo_jax.lordo(3e-2, rank=3, sync_every=K)  # error feedback off
  params = init_params()
  state = tx.init(params)
  is_moments = lambda x: isinstance(x, lordo_jax.LowRankMoments)  # noqa: E731
  matrices = [x for x in jax.tree.leaves(state, is_leaf=is_moments) if is_moments(x)]
  assert matrices and all(m.error == () for m in matrices)
  with_placeholders = jax.tree.map(
    lambda x: x._replace(error=jnp.zeros((0,), jnp.float32)) if is_moments(x) else x,
    state,
    is_leaf=is_moments,
  )
  checkpoint.save(tmp_path, 1, params, with_placeholders)
  _, restored = checkpoint.restore(tmp_path, 1, params, tx.init(params))
  assert_trees_equal(restored, state)


def test_a_checkpoint_of_the_state_per_matrix_restores_into_the_state_per_group(tmp_path):
  """A state saved when the low-rank state was stored per matrix (``moments`` a tree like
  the params, one ``LowRankMoments`` per matrix) restores into today's, stored per shape
  group: here two 16 x 12 matrices stacked in one group, and a 12 x 20 matrix alone."""
  tx = lordo_jax.lordo(3e-2, rank=3, sync_every=K, error_feedback=True)
  params = {**init_params(), "w3": jax.random.normal(jax.random.key(3), (16, 12))}
  grads = jax.tree.map(lambda x: jnp.sin(3 * x), params)
  _, state = jax.jit(tx.update)(grads, tx.init(params), params)
  is_grouped = lambda x: isinstance(x, checkpoint._StoredPerGroup)  # noqa: E731
  per_matrix = jax.tree.map(
    lambda x: x.matrices() if is_grouped(x) else x, state, is_leaf=is_grouped
  )
  grouped = [x for x in jax.tree.leaves(state, is_leaf=is_grouped) if is_grouped(x)]
  assert [m.mu.shape for m in grouped[0].groups] == [(2, 3, 12), (12, 3)]  # w1 and w3; w2
  paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(per_matrix)]
  assert any(p.endswith(".moments['w3'].mu") for p in paths)  # the older layout's keys
  checkpoint.save(tmp_path, 1, params, per_matrix)
  _, restored = checkpoint.restore(tmp_path, 1, params, tx.init(params))
  assert_trees_equal(restored, state)
