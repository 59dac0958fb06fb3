"""A message in chunks (``lordo_jax/comm/_chunks.py``): laid out and back exactly, each
part in its own dtype, the chunks' means are the mean's chunks bit for bit, each chunk is
counted as it travels, and a chunk of carried state is a collective that can overlap its
step's compute (``tests/helpers/hlo.py``).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from lordo_jax.comm import _chunks as chunks_lib
from lordo_jax.comm import _collectives as collectives
from tests.helpers import hlo

WORKERS = 4


def _tree(seed=0):
  rng = np.random.default_rng(seed)
  return {
    "w": jnp.asarray(rng.normal(size=(3, 5)), jnp.float32),
    "b": jnp.asarray(rng.normal(size=(7,)), jnp.float32),
    "h": jnp.asarray(rng.normal(size=(2, 2, 2)), jnp.bfloat16),
  }


@pytest.mark.parametrize("chunks", [1, 3, 4, 30, 40])
def test_freeze_then_thaw_is_the_tree_and_the_padding_is_zero(chunks):
  tree = _tree()
  (buffer,) = chunks_lib.freeze((tree,), chunks)
  size = chunks_lib.chunk_size(tree, chunks)
  assert buffer.shape == (chunks, size) and size == -(-30 // chunks)
  assert buffer.dtype == jnp.float32  # float32 and bfloat16 leaves: the widest
  (back,) = chunks_lib.thaw((buffer,), (tree,))
  for name in tree:
    assert back[name].dtype == tree[name].dtype
    np.testing.assert_array_equal(
      np.asarray(back[name], np.float32), np.asarray(tree[name], np.float32)
    )
  np.testing.assert_array_equal(buffer.reshape(-1)[30:], 0.0)


def test_each_part_has_a_buffer_of_contiguous_rows():
  first, second, empty = _tree(0), {"u": jnp.arange(10.0)}, ()
  buffers = chunks_lib.freeze((first, empty, second), 4)
  assert chunks_lib.widths((first, empty, second), 4) == (8, 0, 3)
  assert buffers[0].shape == (4, 8) and buffers[1] is None and buffers[2].shape == (4, 3)
  np.testing.assert_array_equal(buffers[2].reshape(-1)[:10], np.arange(10.0))
  np.testing.assert_array_equal(buffers[0], chunks_lib.freeze((first,), 4)[0])
  back = chunks_lib.thaw(buffers, (first, empty, second))
  assert back[1] == () and np.array_equal(back[2]["u"], np.arange(10.0))


def test_a_part_is_held_in_its_leaves_dtype_or_the_one_given():
  """A bfloat16 part stays bfloat16 (exactly, and half the bytes of float32); wider
  columns (a fragment's, padded to the widest) are zeros and thaw back the same."""
  half = {"w": jnp.asarray(np.random.default_rng(1).normal(size=(3, 5)), jnp.bfloat16)}
  moments = {"nu": jnp.ones((4,), jnp.float32)}
  buffers = chunks_lib.freeze((half, moments), 2, columns=(9, 2))
  assert [b.dtype for b in buffers] == [jnp.bfloat16, jnp.float32]
  assert buffers[0].shape == (2, 9) and buffers[0].nbytes == 2 * 2 * 9
  np.testing.assert_array_equal(buffers[0][:, 8:], 0)
  back, _ = chunks_lib.thaw(buffers, (half, moments))
  assert back["w"].dtype == jnp.bfloat16 and np.array_equal(back["w"], half["w"])
  as_float32 = jax.tree.map(lambda x: x.astype(jnp.float32), half)
  given = chunks_lib.freeze((as_float32, moments), 2, dtypes=(jnp.bfloat16, None))
  assert [b.dtype for b in given] == [jnp.bfloat16, jnp.float32]
  np.testing.assert_array_equal(given[0], chunks_lib.freeze((half,), 2)[0])


def _mesh():
  return jax.make_mesh((WORKERS,), ("workers",))


def _per_worker(fn, *args):
  """``fn`` on each worker's slice of ``args`` (leading axis), one jitted shard_map."""
  mesh = _mesh()
  spec = P("workers")
  placed = jax.device_put(args, jax.NamedSharding(mesh, spec))
  step = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=spec, out_specs=spec))
  return jax.device_get(jax.block_until_ready(step(*placed)))


def test_the_chunks_means_are_the_means_chunks_bit_for_bit_and_each_is_counted():
  trees = [_tree(seed) for seed in range(WORKERS)]
  stacked = jax.tree.map(lambda *x: jnp.stack(x), *trees)
  chunks = 3

  def body(tree):
    tree = jax.tree.map(lambda x: x[0], tree)
    (buffer,) = chunks_lib.freeze((tree,), chunks)
    ledger, rows = collectives.init_ledger(), []
    for j in range(chunks):
      chunk = chunks_lib.row((buffer,), jnp.int32(j))
      (mean,), ledger, _ = chunks_lib.chunk_mean(chunk, ledger, "workers")
      rows.append(mean)
    whole, _ = collectives.counted_pmean(buffer, collectives.init_ledger(), "workers")
    return jax.tree.map(lambda x: x[None], (jnp.stack(rows), whole, ledger))

  rows, whole, ledger = _per_worker(body, stacked)
  np.testing.assert_array_equal(rows, whole)
  size = chunks_lib.chunk_size(trees[0], chunks)
  one = jax.tree.map(lambda x: x[0], ledger)
  assert collectives.ledger_total(one) == (chunks * size, chunks * size * 4)


def test_a_compressed_chunk_feeds_its_first_parts_rounding_back_into_its_own_row_only():
  stacked = jnp.asarray(np.random.default_rng(3).normal(size=(WORKERS, 4, 16)), jnp.float32)

  def body(buffer):
    buffer = buffer[0]
    residual, index = jnp.zeros((4, 12), jnp.float32), jnp.int32(2)
    row = chunks_lib.row(buffer, index)
    means, ledger, fed = chunks_lib.chunk_mean(
      (row[:12], row[12:]),
      collectives.init_ledger(),
      "workers",
      codecs=("int8", "bfloat16"),
      residual=chunks_lib.row(residual, index),
    )
    residual = chunks_lib.with_row(residual, fed, index)
    return jax.tree.map(lambda x: x[None], (jnp.concatenate(means), residual, ledger))

  mean, residual, ledger = _per_worker(body, stacked)
  exact = stacked[:, 2].mean(0)
  np.testing.assert_allclose(mean[0, :12], exact[:12], atol=0.05)  # int8: absolute steps
  np.testing.assert_allclose(mean[0, 12:], exact[12:], rtol=2**-7)  # bfloat16: relative
  assert np.abs(mean[0, 12:] - exact[12:]).max() > 0  # rounded, not sent in float32
  assert np.abs(residual[:, 2]).max() > 0
  np.testing.assert_array_equal(np.delete(residual, 2, axis=1), 0.0)
  # int8 values and one float32 scale per row of each worker's shard, bfloat16 values.
  one = jax.tree.map(lambda x: x[0], ledger)
  assert collectives.ledger_total(one)[1] == 12 + 4 * WORKERS + 2 * 4


def _step_hlo(message_of) -> str:
  """A worker's step: a matmul of its params, and the mean of one chunk of a message."""
  chunks = 4

  def body(params, buffer, count, grads):
    params, buffer, count, grads = params[0], buffer[0], count[0], grads[0]
    message = message_of(buffer, grads, chunks)
    chunk = chunks_lib.row(message, count % chunks)
    (mean,), _, _ = chunks_lib.chunk_mean(chunk, collectives.init_ledger(), "workers")
    local = params - 0.1 * (jnp.tanh(params @ params.T).sum() + grads)
    return jax.tree.map(lambda x: x[None], (local, mean))

  params = jnp.ones((WORKERS, 8, 8))
  buffer = jnp.ones((WORKERS, chunks, 16))
  count = jnp.zeros((WORKERS,), jnp.int32)
  mesh = _mesh()
  spec = P("workers")
  step = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec), keep_unused=True)
  placed = jax.device_put((params, buffer, count, params), jax.NamedSharding(mesh, spec))
  return step.lower(*placed).compile().as_text()


PARAMS, BUFFER, COUNT, GRADS = 0, 1, 2, 3


def test_a_chunk_of_a_carried_message_can_overlap_the_step():
  text = _step_hlo(lambda buffer, grads, chunks: (buffer,))
  assert hlo.collective_inputs(text) == [{BUFFER, COUNT}]
  assert hlo.overlappable(text, {PARAMS, GRADS})


def test_a_chunk_of_a_message_made_this_step_cannot():
  text = _step_hlo(lambda buffer, grads, chunks: chunks_lib.freeze((grads,), chunks))
  assert not hlo.overlappable(text, {PARAMS, GRADS})
