"""The message in flight travels in the parameters' precision (MATH.md §9): a bfloat16
model's round with ``overlap=1`` or ``overlap="round"`` sends what its blocking round
sends (the pseudo-gradient in bfloat16, LoRDO's moments in float32), in the ledger and
in the program (``tests/helpers/hlo.py``); the mean that lands is the blocking round's, bit for
bit; and its buffers take bfloat16's memory. A float32 model's is unchanged (the float64
references of ``test_overlap*.py``).

On 4 workers, ``w`` 16 x 8 and ``b`` 8: a pseudo-gradient of 136 elements, and LoRDO's
rank-2 moments of 48 (``mu`` and ``nu`` of ``w``'s 2 x 8 coordinates and of ``b``), each
a multiple of K = 4 chunks, so no chunk is padded.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lordo_jax
from tests.helpers import hlo
from tests.helpers import workers

M, K, LR = 4, 4, 0.05
DELTA, MOMENTS = 16 * 8 + 8, 2 * (2 * 8 + 8)
RNG = np.random.default_rng(0)
PARAMS0 = {"w": RNG.normal(size=(16, 8)), "b": RNG.normal(size=(8,))}
CENTRES = {k: RNG.normal(size=(M, *v.shape)) for k, v in PARAMS0.items()}

METHODS = {
  "diloco": (functools.partial(lordo_jax.diloco, LR, sync_every=K), 0),
  "lordo": (
    functools.partial(lordo_jax.lordo, LR, rank=2, sync_every=K, init_projection="random"),
    MOMENTS,
  ),
}
OVERLAPS = pytest.mark.parametrize("overlap", [1, "round"])


@functools.cache
def _tx(method, **options):
  """``METHODS[method]`` on the workers with ``options``: one optimizer per configuration,
  so that the runs and the programs read below share their compiled steps."""
  return METHODS[method][0](axis_name=workers.AXIS, **options)


def _grads(params, centre, t):
  return jax.tree.map(lambda c, p: (c * jnp.cos(t) + 0.3 * p).astype(p.dtype), centre, params)


def _step(tx, params, state, centre, t, phase=None):
  updates, state = tx.update(_grads(params, centre, t), state, params, overlap_phase=phase)
  return optax.apply_updates(params, updates), state


@functools.cache
def _program(tx, step, phase, compiler_options=()):
  """``step`` of ``tx`` at ``phase``, written for one worker, jitted on 4 (as
  ``workers.on_workers`` does, every argument kept) and compiled with ``compiler_options``
  (pairs); and its mesh. One program per configuration: a run's step is the program
  whose text is read below."""
  mesh = jax.make_mesh((M,), (workers.AXIS,))
  spec = jax.sharding.PartitionSpec(workers.AXIS)
  fn = functools.partial(step, tx, phase=phase)
  body = lambda *args: jax.tree.map(  # noqa: E731
    lambda x: x[None], fn(*jax.tree.map(lambda x: x[0], args))
  )
  mapped = jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec)
  return mesh, jax.jit(mapped, keep_unused=True, compiler_options=dict(compiler_options) or None)


def _run(tx, dtype, steps, overlap=None, step=_step, compiler_options=None):
  """Every step's (params, state) of ``tx`` on 4 workers, params in ``dtype``, each step
  ``step``; each step's ``overlap_phase`` static (one program per phase)."""
  history = []
  params = workers.stack(jax.tree.map(lambda x: jnp.asarray(x, dtype), PARAMS0), M)
  state = workers.stack(tx.init(jax.tree.map(lambda x: x[0], params)), M)
  centres = jax.tree.map(lambda c: jnp.asarray(c, jnp.float32), CENTRES)
  for t in range(1, steps + 1):
    phase = (
      None if overlap is None else lordo_jax.overlap_phase(t - 1, sync_every=K, overlap=overlap)
    )
    mesh, program = _program(tx, step, phase, tuple((compiler_options or {}).items()))
    args = workers.shard((params, state, centres, jnp.full((M,), t, jnp.float32)), mesh)
    params, state = jax.device_get(jax.block_until_ready(program(*args)))
    history.append((params, state))
  return history


def _round_bytes(history) -> tuple[int, int]:
  """(elements, bytes) a worker sent in the third round: from step 2K + 1 to 3K + 1
  (the blocking sync at 3K; overlap=1's chunk of the message frozen at 3K, sent at
  3K + 1; the round's K chunks at 2K + 2 .. 3K + 1)."""
  before = workers.ledger_numbers(history[2 * K][1].ledger)
  after = workers.ledger_numbers(history[3 * K][1].ledger)
  return after[0] - before[0], after[1] - before[1]


@functools.cache
def _blocking_round_bytes(method, dtype) -> tuple[int, int]:
  """:func:`_round_bytes` of ``method``'s blocking round (shared by both overlaps)."""
  return _round_bytes(_run(_tx(method), dtype, 3 * K + 1))


@pytest.mark.parametrize("method", sorted(METHODS))
@OVERLAPS
def test_a_round_in_flight_sends_the_blocking_rounds_bytes(method, overlap):
  """bfloat16 parameters, so each part's width shows: the pseudo-gradient in the
  parameters' dtype (2 bytes), the moments in float32 (their state's, 4). float32
  parameters' chunks, 4 bytes an element: ``test_overlap.py`` and
  ``test_overlap_fragments.py``."""
  _, moments = METHODS[method]
  blocking = _blocking_round_bytes(method, jnp.bfloat16)
  flight = _round_bytes(_run(_tx(method, overlap=overlap), jnp.bfloat16, 3 * K + 1, overlap))
  assert blocking == (DELTA + moments, 2 * DELTA + 4 * moments)
  assert flight == blocking


def _compiled(tx, dtype, phase):
  """The lowered (before XLA's passes) and compiled texts of one sending step: the
  program of :func:`_run`'s step at ``phase`` (compiled there if the run came first)."""
  params = workers.stack(jax.tree.map(lambda x: jnp.asarray(x, dtype), PARAMS0), M)
  state = workers.stack(tx.init(jax.tree.map(lambda x: x[0], params)), M)
  centres = jax.tree.map(lambda c: jnp.asarray(c, jnp.float32), CENTRES)
  mesh, step = _program(tx, _step, phase)
  lowered = step.lower(*workers.shard((params, state, centres, jnp.ones((M,))), mesh))
  n_params, n_state = len(jax.tree.leaves(params)), len(jax.tree.leaves(state))
  computed = set(range(n_params)) | {n_params + n_state + i for i in range(n_params + 1)}
  return lowered.as_text(dialect="hlo"), lowered.compile().as_text(), computed


@pytest.mark.parametrize("method", sorted(METHODS))
@OVERLAPS
def test_the_program_sends_the_chunk_in_bfloat16_and_the_moments_in_float32(method, overlap):
  """The all-reduces of a sending step: what the program asks to send is read before
  XLA's passes (the CPU backend widens a bfloat16 all-reduce to float32, a GPU's NCCL
  does not), where and how much from the compiled program. The blocking round's program
  sends the same bytes in its sync's conditional."""
  _, moments = METHODS[method]
  chunks = K if overlap == "round" else overlap
  lowered, compiled, computed = _compiled(_tx(method, overlap=overlap), jnp.bfloat16, "send")
  sent = hlo.collectives_by_depth(lowered)
  assert sent.keys() == {0}  # one chunk a step, outside any conditional
  # Its parts: the pseudo-gradient's slice, 2 bytes an element, and the moments', 4.
  want = [(DELTA // chunks, 2 * DELTA // chunks)] + (
    [(moments // chunks, 4 * moments // chunks)] if moments else []
  )
  assert sorted(sent[0], reverse=True) == want
  assert hlo.overlappable(compiled, computed)
  assert len(hlo.collective_inputs(compiled)) == 1  # one all-reduce of both parts
  (on_cpu,) = hlo.collectives_by_depth(compiled)[0]
  assert on_cpu[0] == (DELTA + moments) // chunks
  blocking, _, _ = _compiled(_tx(method), jnp.bfloat16, None)
  synced = [b for ops in hlo.collectives_by_depth(blocking).values() for _, b in ops]
  assert sum(synced) == chunks * sum(b for _, b in sent[0]) == 2 * DELTA + 4 * moments


def _fixed_grads_step(tx, params, state, centre, t, phase=None):
  """SGD's gradient that ignores the parameters: each round's pseudo-gradient is the
  same whether or not a mean landed."""
  grads = jax.tree.map(lambda c, p: (c * jnp.cos(t)).astype(p.dtype), centre, params)
  updates, state = tx.update(grads, state, params, overlap_phase=phase)
  return optax.apply_updates(params, updates), state


_SGD = functools.partial(
  lordo_jax.synchronize,
  optax.sgd(LR),
  sync_every=K,
  axis_name=workers.AXIS,
  first_moment_every=None,
  second_moment_every=None,
)
LANDINGS = pytest.mark.parametrize(
  "overlap, merge, late", [(1, "rebase", 1), ("round", "delayed", K)]
)


@LANDINGS
def test_the_chunks_are_averaged_in_bfloat16(overlap, merge, late):
  """The means that land are the workers' frozen bfloat16 messages summed and rounded
  to bfloat16 once, as a bfloat16 pmean rounds them, not a float32 mean."""
  flight = _run(
    _SGD(overlap=overlap, merge=merge), jnp.bfloat16, K + late, overlap, step=_fixed_grads_step
  )
  frozen, no_moments = flight[K - 1][1].in_flight.message  # at the boundary, per worker
  landed, _ = flight[K + late - 1][1].in_flight.means
  assert no_moments is None  # SGD inside: no moment is averaged
  assert frozen.dtype == landed.dtype == jnp.bfloat16
  total = np.sum(np.asarray(frozen, np.float64), axis=0)  # exact: 4 bfloat16 numbers
  want = (total / M).astype(np.float32).astype(jnp.bfloat16)
  for m in range(M):
    np.testing.assert_array_equal(np.asarray(landed[m], np.float32), np.asarray(want, np.float32))
  assert np.any(np.asarray(want, np.float32) != (total / M).astype(np.float32))  # rounded


@LANDINGS
def test_the_landed_bfloat16_mean_is_the_blocking_rounds_bit_for_bit(overlap, merge, late):
  """SGD inside on fixed gradients, bfloat16 parameters: the first round's mean, averaged
  in bfloat16 a chunk at a time, moves the anchor where the blocking round's pmean does,
  ``late`` steps later. Bit for bit where XLA rounds every bfloat16 operation
  (``xla_allow_excess_precision`` off; on by default, it may keep a fused chain of
  operations in float32, and the two programs fuse theirs differently)."""
  exact = {"xla_allow_excess_precision": False}
  blocking = _run(_SGD(), jnp.bfloat16, K, step=_fixed_grads_step, compiler_options=exact)
  flight = _run(
    _SGD(overlap=overlap, merge=merge),
    jnp.bfloat16,
    K + late,
    overlap,
    step=_fixed_grads_step,
    compiler_options=exact,
  )
  want, got = blocking[K - 1][1].anchor, flight[K + late - 1][1].anchor
  assert {x.dtype for x in jax.tree.leaves(got)} == {jnp.dtype(jnp.bfloat16)}
  for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
    np.testing.assert_array_equal(np.asarray(b, np.float32), np.asarray(a, np.float32))
  assert not np.array_equal(
    np.asarray(got["w"], np.float32), np.asarray(flight[0][1].anchor["w"], np.float32)
  )  # it moved


@pytest.mark.parametrize("method", sorted(METHODS))
def test_the_message_in_flight_takes_the_parameters_memory(method):
  """The message and its means: the pseudo-gradient's buffers in the parameters' dtype,
  the moments' in float32, so a bfloat16 model holds half of float32's for the first."""
  make, moments = METHODS[method]
  for dtype, size in ((jnp.bfloat16, 2), (jnp.float32, 4)):
    params = jax.tree.map(lambda x, d=dtype: jax.ShapeDtypeStruct(x.shape, d), PARAMS0)
    state = jax.eval_shape(make(overlap="round").init, params)
    buffers = jax.tree.leaves((state.in_flight.message, state.in_flight.means))
    assert sum(x.size * x.dtype.itemsize for x in buffers) == 2 * (size * DELTA + 4 * moments)
