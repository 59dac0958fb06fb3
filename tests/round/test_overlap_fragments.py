"""Streaming with a message in flight (``fragments=F``, ``overlap=tau``) against the
float64 reference of MATH.md §9 (``tests/references/overlap_reference.py``) on 4 workers.

Each fragment is frozen at its own offset of the round and lands tau steps later with
its own outer state; one fragment's message at a time is in flight, in one buffer laid
out for the widest fragment, so one program sends every chunk.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lordo_jax
from lordo_jax.comm import _chunks as chunks_lib
from lordo_jax.round import _periods as periods
from tests.helpers import hlo
from tests.helpers import workers
from tests.references import overlap_reference as ref

M, K, STEPS, LR = 4, 6, 20, 0.05
RNG = np.random.default_rng(3)
CENTRES = RNG.normal(size=(M, 6, 3))
PARAMS0 = RNG.normal(size=(6, 3))
LEAVES = {"a": slice(0, 2), "b": slice(2, 4), "c": slice(4, 6)}  # rows of PARAMS0
TWO = {"a": 0, "b": 0, "c": 1}  # fragment of each leaf: frozen at t = 3 and 0 (mod 6)


def _labels(of_leaf: dict) -> np.ndarray:
  """The reference's fragment of every element, from each leaf's."""
  labels = np.zeros(PARAMS0.shape, int)
  for leaf, rows in LEAVES.items():
    labels[rows] = of_leaf[leaf]
  return labels


def reference_grads(m, t, params):
  return CENTRES[m] * np.cos(t) + 0.3 * params


def _split(x):
  return {leaf: x[..., rows, :] for leaf, rows in LEAVES.items()}


def _joined(tree) -> np.ndarray:
  return np.concatenate([np.asarray(tree[leaf]) for leaf in LEAVES], axis=-2)


def _step(tx, params, state, centre, t, phase=None):
  grads = jax.tree.map(lambda c, p: c * jnp.cos(t) + 0.3 * p, _split(centre), params)
  updates, state = tx.update(grads, state, params, overlap_phase=phase)
  return optax.apply_updates(params, updates), state


def library_run(tx, phase=lambda step: None, centres=CENTRES, step=_step):
  """Every worker's params (rows of PARAMS0) after each step, and the last state."""
  programs = {}
  params = workers.stack(_split(jnp.asarray(PARAMS0, jnp.float32)), M)
  state = workers.stack(tx.init(jax.tree.map(lambda x: x[0], params)), M)
  history = []
  for t in range(1, STEPS + 1):
    p = phase(t - 1)
    if p not in programs:
      programs[p] = workers.on_workers(functools.partial(step, tx, phase=p), M)
    # Each step waits for its outputs (jaxlib 0.10 CPU: no two executions in flight).
    out = programs[p](params, state, jnp.asarray(centres), jnp.full((M,), t, jnp.float32))
    params, state = jax.block_until_ready(out)
    history.append(_joined(params))
  return history, state


def _close(library, reference, atol):
  for t, (a, b) in enumerate(zip(library, reference, strict=True), start=1):
    np.testing.assert_allclose(a, [w.params for w in b], rtol=0, atol=atol, err_msg=f"step {t}")


def _landings(setup) -> int:
  """How many fragment landings the reference makes in STEPS steps."""
  history = ref.run(setup, PARAMS0, reference_grads, STEPS)
  anchors = [h[0].anchor for h in history]
  return sum(not np.array_equal(a, b) for a, b in zip(anchors, anchors[1:], strict=False))


def _fragments(spec):
  """The ``fragments`` option of ``spec``: an int as it is; ``(leaf, fragment)`` pairs as a
  function of the params that gives them."""
  return spec if isinstance(spec, int) else lambda params: dict(spec)


@functools.cache
def adam_run(tau, merge, alpha, fragments):
  """``library_run`` of Local Adam with ``overlap=tau`` and ``_fragments(fragments)``, each
  step's phase traced: one run, shared by the tests that read it."""
  tx = lordo_jax.local_adam(
    LR,
    sync_every=K,
    axis_name=workers.AXIS,
    overlap=tau,
    merge=merge,
    merge_alpha=alpha,
    fragments=_fragments(fragments),
  )
  return tx, library_run(tx)


PAIRS_TWO = tuple(TWO.items())
# ``fragments``: an int, or the (leaf, fragment) pairs a function of the params gives.
CASES = pytest.mark.parametrize(
  "tau, merge, alpha, fragments, labels",
  [
    (1, "rebase", 0.0, PAIRS_TWO, TWO),
    (2, "rebase", 0.0, PAIRS_TWO, TWO),
    (2, "streaming", 0.5, (("a", 1), ("b", 0), ("c", 0)), {"a": 1, "b": 0, "c": 0}),
    (1, "streaming", 0.0, 3, {"a": 0, "b": 1, "c": 2}),  # equal leaves: one each
  ],
  ids=["tau1-rebase-F2", "tau2-rebase-F2", "tau2-streaming-F2", "tau1-streaming0-F3"],
)


@CASES
def test_sgd_with_a_nesterov_outer_equals_the_reference(tau, merge, alpha, fragments, labels):
  if isinstance(fragments, int):
    assert periods.fragment_labels(_split(PARAMS0), fragments) == list(labels.values())
  outer = optax.sgd(0.7, momentum=0.9, nesterov=True)
  tx = lordo_jax.synchronize(
    optax.sgd(LR),
    sync_every=K,
    axis_name=workers.AXIS,
    first_moment_every=None,
    second_moment_every=None,
    outer_optimizer=outer,
    overlap=tau,
    merge=merge,
    merge_alpha=alpha,
    fragments=_fragments(fragments),
  )
  setup = ref.Setup(
    workers=M,
    sync_every=K,
    tau=tau,
    merge=merge,
    merge_alpha=alpha,
    learning_rate=LR,
    outer_learning_rate=0.7,
    outer_momentum=0.9,
    fragment_of=_labels(labels),
  )
  assert _landings(setup) >= 2 * len(set(labels.values()))  # every fragment lands twice
  library, _ = library_run(tx)
  _close(library, ref.run(setup, PARAMS0, reference_grads, STEPS), atol=2e-5)


@CASES
def test_local_adams_moments_corrected_per_fragment_equal_the_reference(
  tau, merge, alpha, fragments, labels
):
  setup = ref.Setup(
    workers=M,
    sync_every=K,
    tau=tau,
    merge=merge,
    merge_alpha=alpha,
    inner="adam",
    learning_rate=LR,
    fragment_of=_labels(labels),
  )
  _, (library, _) = adam_run(tau, merge, alpha, fragments)
  _close(library, ref.run(setup, PARAMS0, reference_grads, STEPS), atol=5e-5)


def test_the_reference_with_fragments_is_the_libraries_plain_streaming_at_tau_zero():
  """The reference's fragment schedule, checked against the library's streaming without
  overlap (tested on its own in ``test_streaming.py``)."""
  tx = lordo_jax.local_adam(LR, sync_every=K, axis_name=workers.AXIS, fragments=lambda p: TWO)
  setup = ref.Setup(workers=M, sync_every=K, inner="adam", learning_rate=LR)
  library, _ = library_run(tx)
  streamed = dataclasses.replace(setup, fragment_of=_labels(TWO))
  expected = ref.run(streamed, PARAMS0, reference_grads, STEPS)
  _close(library, expected, atol=5e-5)
  unstreamed = ref.run(setup, PARAMS0, reference_grads, STEPS)
  assert np.abs(library[-1] - [w.params for w in unstreamed[-1]]).max() > 1e-3


def _phase(tau, fragments):
  return lambda step: lordo_jax.overlap_phase(step, sync_every=K, overlap=tau, fragments=fragments)


@pytest.mark.parametrize("tau", [1, 2])
def test_the_static_phase_gives_the_traced_paths_numbers_and_bytes(tau):
  # The traced run is the one the reference test's tau-rebase-F2 cases above checked.
  tx, (traced, traced_state) = adam_run(tau, "rebase", 0.0, PAIRS_TWO)
  static, static_state = library_run(tx, _phase(tau, 2))
  np.testing.assert_array_equal(np.stack(static), np.stack(traced))
  assert workers.ledger_numbers(static_state.ledger) == workers.ledger_numbers(traced_state.ledger)


@functools.cache
def diloco_run(tau):
  """DiLoCo with ``overlap=tau`` and 2 fragments, and its ``library_run``, each step's
  phase traced: one run, shared by the tests that read it."""
  tx = lordo_jax.diloco(LR, sync_every=K, axis_name=workers.AXIS, overlap=tau, fragments=2)
  return tx, library_run(tx)


def test_a_phase_computed_without_the_fragments_is_never_a_wrong_number():
  """The phase of one fragment (``fragments`` left out) marks only the last fragment's
  sends: the others' chunks go back inside a conditional, with the same numbers and
  bytes as the traced path."""
  tau = 2
  marked = [s + 1 for s in range(STEPS) if _phase(tau, 1)(s) == "send"]
  sends = [s + 1 for s in range(STEPS) if _phase(tau, 2)(s) == "send"]
  assert set(marked) < set(sends)
  tx, (traced, traced_state) = diloco_run(tau)
  wrong, wrong_state = library_run(tx, _phase(tau, 1))
  np.testing.assert_array_equal(np.stack(wrong), np.stack(traced))
  assert workers.ledger_numbers(wrong_state.ledger) == workers.ledger_numbers(traced_state.ledger)


def test_the_phase_of_every_step_with_fragments():
  """Two fragments of a 6-step round, frozen at t = 3 and 6 (1-based): each sends its
  tau chunks in the steps after its freeze, the first from step 4."""
  phases = [lordo_jax.overlap_phase(s, sync_every=6, overlap=2, fragments=2) for s in range(14)]
  sends = [s + 1 for s, p in enumerate(phases) if p == "send"]
  assert sends == [4, 5, 7, 8, 10, 11, 13, 14]


def test_each_chunk_is_the_widest_fragments_width_and_the_ledger_counts_it():
  tau = 2
  _, (_, state) = diloco_run(tau)
  elements, nbytes, calls = workers.ledger_numbers(state.ledger)
  sends = [t for t in range(1, STEPS + 1) if _phase(tau, 2)(t - 1) == "send"]
  widest = max(12, 6)  # fragment_labels(…, 2): leaves a, b (12 values) and c (6)
  assert calls == len(sends) == 12 and elements == calls * -(-widest // tau)
  assert nbytes == 4 * elements
  # The message in flight and its means hold the widest fragment, not the model (18).
  for buffer in jax.tree.leaves(state.in_flight[:2]):  # DiLoCo's: the pseudo-gradient's
    assert buffer.shape[1:] == (tau, -(-widest // tau))


def _fixed_grads_step(tx, params, state, centre, t, phase=None):
  updates, state = tx.update(jax.tree.map(lambda c: c * jnp.cos(t), _split(centre)), state, params)
  return optax.apply_updates(params, updates), state


@functools.cache
def _fixed_grads_state(tau, compression):
  """The last state of SGD inside on :func:`_fixed_grads_step`'s gradients, fragments
  ``TWO`` (the uncompressed run shared by both codecs)."""
  tx = lordo_jax.synchronize(
    optax.sgd(LR),
    sync_every=K,
    axis_name=workers.AXIS,
    first_moment_every=None,
    second_moment_every=None,
    overlap=tau,
    fragments=lambda p: TWO,
    compression=compression,
  )
  return library_run(tx, step=_fixed_grads_step)[1]


@pytest.mark.parametrize("codec", ["int8", "bfloat16"])
def test_compressed_fragments_lose_nothing_their_residuals_do_not_hold(codec):
  """SGD inside on gradients that ignore the parameters: every pseudo-gradient is the
  same with and without compression, so the anchor minus the workers' mean residual of
  each fragment (its own rows of the residual) is the uncompressed anchor."""
  tau = 2
  anchors = []
  for compression in (None, codec):
    state = _fixed_grads_state(tau, compression)
    anchor = _joined(jax.tree.map(lambda x: np.asarray(x[0], np.float64), state.anchor))
    if compression:
      fed = np.mean(state.in_flight.residual, axis=0)  # rows: fragment 0's, fragment 1's
      for f, fragment in enumerate(({"a": 0, "b": 0}, {"c": 0})):
        like = ({k: PARAMS0[LEAVES[k]].astype(np.float32) for k in fragment},)
        (held,) = chunks_lib.thaw((fed[f * tau : (f + 1) * tau],), like)
        assert max(np.abs(v).max() for v in held.values()) > 1e-6  # something held back
        for leaf, value in held.items():
          anchor[LEAVES[leaf]] -= value
    anchors.append(anchor)
  np.testing.assert_allclose(anchors[1], anchors[0], atol=2e-6)


METHODS = pytest.mark.parametrize(
  "method",
  [
    functools.partial(lordo_jax.diloco, LR, sync_every=4),
    functools.partial(lordo_jax.lordo, LR, rank=2, sync_every=4, init_projection="random"),
  ],
  ids=["diloco", "lordo"],
)


def _compiled_step(tx, phase):
  params = workers.stack({"w": jnp.ones((16, 8)), "b": jnp.zeros(8)}, M)
  state = workers.stack(tx.init(jax.tree.map(lambda x: x[0], params)), M)
  mesh = jax.make_mesh((M,), (workers.AXIS,))

  def one(p, s, g):
    updates, s = tx.update(g, s, p, overlap_phase=phase)
    return optax.apply_updates(p, updates), s

  body = lambda p, s, g: jax.tree.map(  # noqa: E731
    lambda x: x[None], one(*jax.tree.map(lambda x: x[0], (p, s, g)))
  )
  spec = jax.sharding.PartitionSpec(workers.AXIS)
  step = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec), keep_unused=True)
  text = step.lower(*workers.shard((params, state, params), mesh)).compile().as_text()
  n_params, n_state = len(jax.tree.leaves(params)), len(jax.tree.leaves(state))
  return text, set(range(n_params)) | set(range(n_params + n_state, 2 * n_params + n_state))


@METHODS
@pytest.mark.parametrize("compression", [None, "int8"])
def test_with_fragments_the_send_program_sends_one_chunk_of_carried_state(method, compression):
  tx = method(axis_name=workers.AXIS, overlap=1, fragments=2, compression=compression)
  text, computed = _compiled_step(tx, "send")
  ops = ("all-reduce",) if compression is None else ("all-to-all", "all-gather")
  for op in ops:
    assert hlo.overlappable(text, computed, op)
  local, computed = _compiled_step(tx, "local")  # the traced path: inside a conditional
  assert not hlo.overlappable(local, computed)


@pytest.mark.parametrize(
  "build, refused",
  [
    (dict(sync_every=6, fragments=3, overlap=2), "a fragment syncs every 2 steps"),
    (dict(sync_every=4, fragments=2, overlap=2), "Use overlap < 2"),
    (dict(sync_every=6, fragments=2, overlap="round"), "fragments=2 is not available"),
  ],
)
def test_a_window_longer_than_the_fragments_spacing_is_refused(build, refused):
  with pytest.raises(ValueError, match=refused):
    lordo_jax.diloco(LR, **build)


def test_a_phase_asked_for_a_window_longer_than_the_spacing_is_refused():
  with pytest.raises(ValueError, match="overlap_phase: overlap=2 with fragments=3"):
    lordo_jax.overlap_phase(0, sync_every=6, overlap=2, fragments=3)


def test_fragments_of_a_function_are_checked_against_the_window_at_init():
  tx = lordo_jax.diloco(LR, sync_every=6, overlap=2, fragments=lambda p: {"a": 0, "b": 1, "c": 2})
  with pytest.raises(ValueError, match="a fragment syncs every 2 steps"):
    tx.init(_split(jnp.asarray(PARAMS0)))
