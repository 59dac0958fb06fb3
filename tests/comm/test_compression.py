"""Compressed synchronisation: codecs, error feedback, the ledger against the program.

* The codecs round within their stated bounds (int8: half a row scale; bfloat16:
  2^-9 relative); an int8 sync sends its moments in bfloat16, which keeps small
  entries that linear int8 would round to zero.
* Error feedback loses nothing: over many compressed means, the sum of the means
  returned plus the workers' mean final residual equals the sum of the true means,
  to float rounding, while the uncorrected sum drifts by far more.
* The ledger counts exactly the encoded blocks the compiled program exchanges
  (its all-to-all and all-gather operands), and compressed optimizers send the
  bytes of MATH.md §7 at 1 or 2 bytes per element (plus int8 row scales).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import lordo_jax
from lordo_jax.comm import _collectives as collectives
from lordo_jax.comm import _compression as compression
from tests.helpers import hlo
from tests.helpers import workers

M = 4
SHAPES = {"matrix": (12, 6), "vector": (7,), "kernel": (5, 2, 3), "short": (2, 9)}


def test_int8_rounds_each_row_within_half_its_scale():
  rows = np.random.default_rng(0).normal(size=(6, 50)).astype(np.float32) * np.arange(1, 7)[:, None]
  values, scales = compression.encode(jnp.asarray(rows), "int8")
  assert values.dtype == jnp.int8
  np.testing.assert_allclose(scales, np.abs(rows).max(axis=1) / 127, rtol=1e-6)
  decoded = np.asarray(compression.decode(values, scales))
  assert np.all(np.abs(decoded - rows) <= np.asarray(scales)[:, None] / 2 * (1 + 1e-5))
  np.testing.assert_array_equal(np.abs(np.asarray(values)).max(axis=1), 127)


def test_bfloat16_rounds_to_relative_precision():
  x = np.random.default_rng(2).normal(size=(8, 40)).astype(np.float32)
  decoded = np.asarray(compression.decode(*compression.encode(jnp.asarray(x), "bfloat16")))
  assert np.all(np.abs(decoded - x) <= np.abs(x) * 2.0**-8)


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_rows_round_trip(shape):
  x = jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape)
  rows, layout = compression.as_rows(x, M)
  assert rows.shape[0] % M == 0
  np.testing.assert_array_equal(compression.from_rows(rows, layout), x)


def _mean_program(codec, feedback=True):
  mesh = jax.make_mesh((M,), (workers.AXIS,))

  def body(tree, residual):
    tree, residual = jax.tree.map(lambda a: a[0], (tree, residual))
    mean, ledger, residual = collectives.counted_mean(
      tree,
      collectives.init_ledger(),
      workers.AXIS,
      compression_codec=codec,
      residual=residual if feedback else None,
    )
    return jax.tree.map(lambda a: a[None], (mean, residual if feedback else tree, ledger))

  step = jax.jit(
    jax.shard_map(body, mesh=mesh, in_specs=P(workers.AXIS), out_specs=P(workers.AXIS))
  )
  return functools.partial(workers.shard, mesh=mesh), step


@pytest.mark.parametrize("codec", ["int8", "bfloat16"])
def test_error_feedback_loses_nothing_over_many_means(codec):
  shard, step = _mean_program(codec)
  rng = np.random.default_rng(3)
  residual = {k: np.zeros((M, *s), np.float32) for k, s in SHAPES.items()}
  returned = {k: np.zeros(s) for k, s in SHAPES.items()}
  true = {k: np.zeros(s) for k, s in SHAPES.items()}
  for _ in range(25):
    x = {k: rng.normal(size=(M, *s)).astype(np.float32) for k, s in SHAPES.items()}
    # Wait on each step: jaxlib 0.10's CPU collectives deadlock with several in flight.
    mean, residual, _ = jax.device_get(jax.block_until_ready(step(shard(x), shard(residual))))
    for k in SHAPES:
      np.testing.assert_array_equal(mean[k], np.broadcast_to(mean[k][0], mean[k].shape))
      returned[k] += mean[k][0]
      true[k] += x[k].astype(np.float64).mean(axis=0)
  for k in SHAPES:
    drift = np.abs(returned[k] - true[k]).max()
    kept = np.abs(returned[k] + residual[k].astype(np.float64).mean(axis=0) - true[k]).max()
    assert kept < 1e-5, (k, kept)
    assert drift > 100 * kept, (k, drift, kept)  # the residual really carries something


def test_without_feedback_each_mean_is_within_the_rounding_bound():
  shard, step = _mean_program("int8", feedback=False)
  x = {
    k: np.random.default_rng(4).normal(size=(M, *s)).astype(np.float32) for k, s in SHAPES.items()
  }
  mean, _, _ = jax.device_get(step(shard(x), shard(x)))
  for k in SHAPES:
    # Two roundings of at most half a scale (max |row| / 127) each.
    bound = 2 * np.abs(x[k]).max() / 127
    assert np.abs(mean[k][0] - x[k].mean(axis=0)).max() <= bound


@pytest.mark.parametrize("codec,value_bytes", [("int8", 1), ("bfloat16", 2)])
def test_ledger_equals_the_encoded_blocks_the_program_exchanges(codec, value_bytes):
  shard, step = _mean_program(codec)
  x = {k: np.ones((M, *s), np.float32) for k, s in SHAPES.items()}
  _, _, ledger = jax.device_get(step(shard(x), shard(x)))
  elements, nbytes = collectives.ledger_total(ledger)
  lowered = step.lower(shard(x), shard(x))
  programs = {"lowered": lowered.as_text(dialect="hlo")}
  if codec == "int8":  # the CPU backend sends bfloat16 as float32, int8 as it is
    programs["compiled"] = lowered.compile().as_text()
  for name, text in programs.items():
    for op in ("all-to-all", "all-gather"):
      found = hlo.collectives_by_depth(text, op)
      assert sum(b for ops in found.values() for _, b in ops) == nbytes, (name, op)
    assert not hlo.collectives_by_depth(text), name  # no all-reduce at all
  # Rows padded to a multiple of M; short leaves are flattened into M rows.
  rows = {"matrix": (12, 6), "vector": (4, 2), "kernel": (8, 6), "short": (4, 5)}
  values = sum(r * c for r, c in rows.values())
  scales = sum(r for r, _ in rows.values()) if codec == "int8" else 0
  assert (elements, nbytes) == (values + scales, values * value_bytes + 4 * scales)


PARAMS = {"w": jnp.ones((16, 8)) * 0.1, "b": jnp.zeros(8)}


def loss(params, x):
  return jnp.sum(jnp.tanh(x @ params["w"] + params["b"]) ** 2)


def batches(steps):
  keys = jax.random.split(jax.random.key(5), steps)
  return [jax.random.normal(k, (M, 6, 16)) for k in keys]


@pytest.mark.parametrize(
  "build",
  [
    lambda c: lordo_jax.lordo(1e-2, rank=2, sync_every=3, axis_name=workers.AXIS, compression=c),
    lambda c: lordo_jax.diloco(1e-2, sync_every=3, axis_name=workers.AXIS, compression=c),
    lambda c: lordo_jax.ddp(1e-2, axis_name=workers.AXIS, compression=c),
  ],
  ids=["lordo", "diloco", "ddp"],
)
def test_compressed_optimizers_send_fewer_bytes_and_keep_workers_together(build):
  # Random weights, not PARAMS: with all-equal weights the pseudo-gradient's singular
  # values tie, so LoRDO's rank-2 basis (and the run) turns on float32 rounding: two
  # uncompressed float32 programs that fuse differently ended 2e-3 apart.
  params = {"w": 0.3 * jax.random.normal(jax.random.key(0), (16, 8)), "b": jnp.zeros(8)}
  steps = 6
  plain, _ = workers.run(build(None), loss, params, batches(steps), M)
  int8, _ = workers.run(build("int8"), loss, params, batches(steps), M)
  bf16, _ = workers.run(build("bfloat16"), loss, params, batches(steps), M)
  sent = {
    name: lordo_jax.communicated_bytes(run[-1][1])
    for name, run in (("f32", plain), ("int8", int8), ("bf16", bf16))
  }
  # bfloat16 sends the same elements at 2 bytes instead of 4; int8 one byte plus a
  # float32 scale per row (w: 16 rows, b: flattened into 4 rows of 2).
  assert sent["bf16"] * 2 == sent["f32"]
  assert sent["int8"] < sent["bf16"]
  # Compressed runs move the weights as the plain run does: the difference is under 5%
  # of the plain run's displacement (measured: at most 2.2%, DDP int8), and no entry is
  # more than 1.5 Adam steps (lr 1e-2) off (an entry whose gradient is near zero can
  # take one step of the other sign under int8 rounding; measured: 0.0094, DDP int8).
  reference = jax.device_get(plain[-1][0])
  moved = np.sqrt(sum(np.sum((reference[k] - np.asarray(params[k])) ** 2) for k in params))
  for run in (int8, bf16):
    final = jax.device_get(run[-1][0])  # step 6 ends a round: every worker agrees
    for leaf in final.values():
      np.testing.assert_allclose(leaf, np.broadcast_to(leaf[0], leaf.shape), rtol=0, atol=1e-6)
    apart = np.sqrt(sum(np.sum((final[k] - reference[k]) ** 2) for k in final))
    assert apart < 0.05 * moved, (apart, moved)
    for name in final:
      np.testing.assert_allclose(final[name], reference[name], atol=1.5e-2)


def test_compression_residual_is_host_memory_like_the_anchor():
  params = {"w": jax.ShapeDtypeStruct((64, 32), jnp.float32)}
  plain = lordo_jax.state_bytes(
    jax.eval_shape(lordo_jax.lordo(1e-3, rank=4, sync_every=8).init, params)
  )
  int8 = lordo_jax.state_bytes(
    jax.eval_shape(lordo_jax.lordo(1e-3, rank=4, sync_every=8, compression="int8").init, params)
  )
  assert int8["device"] == plain["device"] + 64 * 32 * 4  # Nothing placed on the host.
  assert int8["offloadable"] == plain["offloadable"] + 64 * 32 * 4


@pytest.mark.parametrize(
  "kwargs,pattern",
  [
    (dict(compression="int4"), r"compression='int4' .*'bfloat16', 'int8'"),
    (dict(compression="int8", fault_tolerant=True), r"fault_tolerant=True .*compression"),
  ],
)
def test_bad_compression_arguments_are_named(kwargs, pattern):
  with pytest.raises(ValueError, match=pattern):
    lordo_jax.lordo(1e-3, rank=2, sync_every=4, **kwargs)


def test_projected_low_rank_ddp_refuses_compression():
  with pytest.raises(ValueError, match=r"compression='int8' .*communicate='projected'"):
    lordo_jax.low_rank_ddp(1e-3, rank=2, communicate="projected", compression="int8")


def test_compressed_ddp_is_adamw_on_the_compressed_mean_with_one_worker():
  """One worker sends nothing, so compression changes nothing."""
  tx = lordo_jax.ddp(1e-2, compression="int8")
  ref = optax.adamw(1e-2, weight_decay=0.0)
  grads = {"w": jnp.linspace(-1, 1, 12).reshape(4, 3)}
  params = {"w": jnp.ones((4, 3))}
  got, _ = tx.update(grads, tx.init(params), params)
  want, _ = ref.update(grads, ref.init(params), params)
  np.testing.assert_allclose(got["w"], want["w"], rtol=1e-6)


COLUMN_SCALE = 10.0 ** -(jnp.arange(8.0) / 2)  # w's gradient columns span 7 decades


def column_scaled_loss(params, x):
  return jnp.sum(((x @ params["w"] + params["b"]) * COLUMN_SCALE) ** 2)


def test_an_int8_sync_sends_its_moments_in_bfloat16_and_keeps_small_entries():
  def build(codec):
    return lordo_jax.local_adam(1e-2, sync_every=3, axis_name=workers.AXIS, compression=codec)

  states = {}
  for codec in (None, "int8", "bfloat16"):
    history, _ = workers.run(build(codec), column_scaled_loss, PARAMS, batches(3), M)
    states[codec] = jax.device_get(history[-1][1])
  is_adam = lambda x: isinstance(x, optax.ScaleByAdamState)  # noqa: E731
  nu = {
    codec: np.asarray(
      next(x for x in jax.tree.leaves(state, is_leaf=is_adam) if is_adam(x)).nu["w"][0]
    )
    for codec, state in states.items()
  }
  # The second moment after the sync: 14 decades within each row of w, which int8
  # per row would round to zero below 1/254 of the row's largest entry.
  assert (nu[None].max(axis=1) / nu[None].min(axis=1)).min() > 1e12
  np.testing.assert_allclose(nu["int8"], nu[None], rtol=2**-7)
  # One sync of params (pseudo-gradient) and both moments, N elements each: float32
  # 4 bytes each, bfloat16 2; int8 sends the pseudo-gradient at 1 byte plus a float32
  # scale per row (w: 16 rows; b: 4 rows of 2) and the moments in bfloat16.
  n, rows = 16 * 8 + 8, 16 + 4
  sent = {codec: lordo_jax.communicated_bytes(state) for codec, state in states.items()}
  assert sent == {None: 3 * 4 * n, "bfloat16": 3 * 2 * n, "int8": n + 4 * rows + 2 * 2 * n}
