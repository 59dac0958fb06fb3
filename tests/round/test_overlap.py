"""A whole round in flight (``overlap="round"``) against the float64 reference of
MATH.md §9 (``tests/references/overlap_reference.py``), on 4 workers, and in the compiled program.

Every step's chunk is one collective at the top level of the step's program that
reads only the state carried in (``tests/helpers/hlo.py``), and the ledger counts it.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lordo_jax
from lordo_jax.comm import _chunks as chunks_lib
from tests.helpers import hlo
from tests.helpers import workers
from tests.references import overlap_reference as ref

M, K, STEPS, LR = 4, 3, 10, 0.05
RNG = np.random.default_rng(0)
CENTRES = RNG.normal(size=(M, 6, 3))
PARAMS0 = RNG.normal(size=(6, 3))


def reference_grads(m, t, params):
  return CENTRES[m] * np.cos(t) + 0.3 * params


def library_run(tx, phase=lambda step: None) -> list[np.ndarray]:
  """Every worker's params after each step: grads as ``reference_grads`` gives them;
  ``phase(step)`` is each update's static ``overlap_phase`` (one program per phase)."""
  programs = {}
  params = workers.stack(jnp.asarray(PARAMS0, jnp.float32), M)
  state = workers.stack(tx.init(params[0]), M)
  centres = jnp.asarray(CENTRES, jnp.float32)
  history = []
  for t in range(1, STEPS + 1):
    p = phase(t - 1)
    if p not in programs:
      programs[p] = workers.on_workers(functools.partial(_step, tx, phase=p), M)
    # Each step waits for its outputs (jaxlib 0.10 CPU: no two executions in flight).
    step = programs[p](params, state, centres, jnp.full((M,), t, jnp.float32))
    params, state = jax.block_until_ready(step)
    history.append(np.asarray(params))
  return history, state


@functools.cache
def traced_run(method: str, **options):
  """``library_run`` of ``lordo_jax.<method>(LR, sync_every=K, axis_name=workers.AXIS,
  **options)``, each step's phase traced: one run, shared by the tests that read it."""
  tx = getattr(lordo_jax, method)(LR, sync_every=K, axis_name=workers.AXIS, **options)
  return library_run(tx)


def _step(tx, params, state, centre, t, phase=None):
  grads = centre * jnp.cos(t) + 0.3 * params
  updates, state = tx.update(grads, state, params, overlap_phase=phase)
  return optax.apply_updates(params, updates), state


def _sgd_inside(**options):
  """``synchronize`` of SGD on 4 workers, averaging no moments, with ``options``."""
  return lordo_jax.synchronize(
    optax.sgd(LR),
    sync_every=K,
    axis_name=workers.AXIS,
    first_moment_every=None,
    second_moment_every=None,
    **options,
  )


def _close(library, reference, atol=2e-5):
  for t, (a, b) in enumerate(zip(library, reference, strict=True), start=1):
    want = np.array([w.params for w in b])
    np.testing.assert_allclose(a, want, rtol=0, atol=atol, err_msg=f"step {t}")


@pytest.mark.parametrize("merge", ["eager", "delayed", "rebase"])
@pytest.mark.parametrize("outer_momentum", [0.0, 0.9])
def test_sgd_inside_equals_the_reference(merge, outer_momentum):
  outer = optax.sgd(
    0.7 if outer_momentum else 1.0, momentum=outer_momentum or None, nesterov=bool(outer_momentum)
  )
  correction = {} if merge == "rebase" else {"delay_correction": "none"}  # Kale et al.'s
  tx = _sgd_inside(outer_optimizer=outer, overlap="round", merge=merge, **correction)
  setup = ref.Setup(
    workers=M,
    sync_every=K,
    tau=K,
    merge=merge,
    learning_rate=LR,
    outer_learning_rate=0.7 if outer_momentum else 1.0,
    outer_momentum=outer_momentum,
  )
  library, _ = library_run(tx)
  _close(library, ref.run(setup, PARAMS0, reference_grads, STEPS))


def _local_adam_setup(tau, merge, alpha=0.0) -> ref.Setup:
  """The reference of ``local_adam`` at its defaults: a whole round merged eager takes
  its averaging outer ``"damped"`` (MATH.md §9)."""
  correction = "damped" if merge == "eager" else "none"
  return ref.Setup(
    workers=M,
    sync_every=K,
    tau=tau,
    merge=merge,
    inner="adam",
    learning_rate=LR,
    merge_alpha=alpha,
    delay_correction=correction,
  )


@pytest.mark.parametrize("merge", ["eager", "delayed", "rebase", "streaming"])
def test_local_adam_with_its_moments_corrected_equals_the_reference(merge):
  alpha = 0.5 if merge == "streaming" else 0.0
  tx = lordo_jax.local_adam(
    LR, sync_every=K, axis_name=workers.AXIS, overlap="round", merge=merge, merge_alpha=alpha
  )
  library, _ = library_run(tx)
  _close(
    library, ref.run(_local_adam_setup(K, merge, alpha), PARAMS0, reference_grads, STEPS), atol=5e-5
  )


def test_every_step_sends_one_chunk_and_the_ledger_counts_it():
  _, state = traced_run("diloco", overlap="round")
  elements, nbytes, calls = workers.ledger_numbers(state.ledger)
  chunk = -(-PARAMS0.size // K)
  assert calls == STEPS and elements == STEPS * chunk and nbytes == 4 * elements


def _compiled_step(tx, phase=None) -> tuple[str, set[int]]:
  params = workers.stack({"w": jnp.ones((16, 8)), "b": jnp.zeros(8)}, M)
  state = workers.stack(tx.init(jax.tree.map(lambda x: x[0], params)), M)
  mesh = jax.make_mesh((M,), (workers.AXIS,))
  body = lambda p, s, g: jax.tree.map(  # noqa: E731
    lambda x: x[None], _one(tx, *jax.tree.map(lambda x: x[0], (p, s, g)), phase)
  )
  spec = jax.sharding.PartitionSpec(workers.AXIS)
  step = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec), keep_unused=True)
  args = workers.shard((params, state, params), mesh)
  text = step.lower(*args).compile().as_text()
  n_params, n_state = len(jax.tree.leaves(params)), len(jax.tree.leaves(state))
  computed = set(range(n_params)) | set(range(n_params + n_state, 2 * n_params + n_state))
  return text, computed


def _one(tx, params, state, grads, phase):
  updates, state = tx.update(grads, state, params, overlap_phase=phase)
  return optax.apply_updates(params, updates), state


METHODS = pytest.mark.parametrize(
  "method",
  [
    functools.partial(lordo_jax.diloco, LR, sync_every=K),
    functools.partial(lordo_jax.lordo, LR, rank=2, sync_every=K, init_projection="random"),
  ],
  ids=["diloco", "lordo"],
)


@pytest.mark.parametrize(
  "options, refused",
  [
    (dict(fragments=2), "fragments=2 is not available with overlap='round'"),
    (dict(fault_tolerant=True), "fault_tolerant=True is not available"),
    (dict(merge="rebased"), "merge='rebased' is not accepted"),
  ],
)
def test_what_a_round_in_flight_does_not_take_is_refused_by_name(options, refused):
  with pytest.raises(ValueError, match=refused):
    lordo_jax.diloco(LR, sync_every=K, overlap="round", **options)


def test_desloc_moment_periods_and_a_merge_without_overlap_are_refused():
  with pytest.raises(ValueError, match="moments averaged every"):
    lordo_jax.desloc(LR, sync_every=K, overlap="round")
  with pytest.raises(ValueError, match="merge='eager' needs an overlap"):
    lordo_jax.diloco(LR, sync_every=K, merge="eager")


@pytest.mark.parametrize("tau", [1, 2])
@pytest.mark.parametrize("merge, alpha", [("rebase", 0.0), ("streaming", 0.0), ("streaming", 0.5)])
def test_a_window_of_tau_steps_equals_the_reference(tau, merge, alpha):
  outer = optax.sgd(0.7, momentum=0.9, nesterov=True)
  tx = _sgd_inside(outer_optimizer=outer, overlap=tau, merge=merge, merge_alpha=alpha)
  setup = ref.Setup(
    workers=M,
    sync_every=K,
    tau=tau,
    merge=merge,
    merge_alpha=alpha,
    learning_rate=LR,
    outer_learning_rate=0.7,
    outer_momentum=0.9,
  )
  library, _ = library_run(tx)
  _close(library, ref.run(setup, PARAMS0, reference_grads, STEPS))


@pytest.mark.parametrize("tau", [1, 2])
def test_a_window_with_local_adams_moments_equals_the_reference(tau):
  setup = ref.Setup(workers=M, sync_every=K, tau=tau, inner="adam", learning_rate=LR)
  library, _ = traced_run("local_adam", overlap=tau)  # the default merge, rebase
  _close(library, ref.run(setup, PARAMS0, reference_grads, STEPS), atol=5e-5)


def test_a_window_sends_tau_chunks_a_round():
  tau = 2
  _, state = traced_run("diloco", overlap=tau)
  elements, _, calls = workers.ledger_numbers(state.ledger)
  sent_steps = [t for t in range(K + 1, STEPS + 1) if (t - 1) % K < tau]  # 4, 5, 7, 8, 10
  assert calls == len(sent_steps) == 5 and elements == 5 * -(-PARAMS0.size // tau)


@pytest.mark.parametrize(
  "options, refused",
  [
    (dict(overlap=3), "overlap=3 is not accepted with sync_every=3"),
    (dict(overlap=1, merge="eager"), "merge='eager' is not accepted"),
    (dict(overlap=1, merge_alpha=0.5), "merge_alpha=0.5 needs merge='streaming'"),
    (dict(overlap=1, merge="streaming", merge_alpha=1.0), "merge_alpha=1.0 is not accepted"),
  ],
)
def test_a_window_refuses_what_it_cannot_do(options, refused):
  with pytest.raises(ValueError, match=refused):
    lordo_jax.diloco(LR, sync_every=K, **options)


def _phase_of(tau):
  return lambda step: lordo_jax.overlap_phase(step, sync_every=K, overlap=tau)


@pytest.mark.parametrize("tau", [1, 2])
def test_the_static_phase_gives_the_traced_paths_numbers(tau):
  """The streaming merge's; the window's default (rebase): test_overlap_fragments.py."""
  options = {"merge": "streaming", "merge_alpha": 0.5}
  tx = lordo_jax.local_adam(LR, sync_every=K, axis_name=workers.AXIS, overlap=tau, **options)
  traced, traced_state = traced_run("local_adam", overlap=tau, **options)
  static, static_state = library_run(tx, _phase_of(tau))
  np.testing.assert_array_equal(np.stack(static), np.stack(traced))
  assert workers.ledger_numbers(static_state.ledger) == workers.ledger_numbers(traced_state.ledger)


@pytest.mark.parametrize("wrong", ["send", "local"])
def test_a_wrong_phase_costs_bytes_never_numbers(wrong):
  tau = 2
  tx = lordo_jax.diloco(LR, sync_every=K, axis_name=workers.AXIS, overlap=tau)
  traced, traced_state = traced_run("diloco", overlap=tau)
  wrong_run, wrong_state = library_run(tx, lambda step: wrong)
  np.testing.assert_array_equal(np.stack(wrong_run), np.stack(traced))
  calls = workers.ledger_numbers(wrong_state.ledger)[2]
  assert calls == (STEPS if wrong == "send" else workers.ledger_numbers(traced_state.ledger)[2])


@METHODS
def test_a_window_sends_its_chunk_outside_any_conditional_in_the_send_program(method):
  tx = method(axis_name=workers.AXIS, overlap=2)
  text, computed = _compiled_step(tx, "send")
  assert hlo.overlappable(text, computed)
  assert len(hlo.collective_inputs(text)) == 1
  local, computed = _compiled_step(tx, "local")  # the traced path: inside a conditional
  assert hlo.collectives_by_depth(local).keys() == {1}
  assert not hlo.overlappable(local, computed)


def test_the_phase_of_every_step():
  assert [lordo_jax.overlap_phase(s, sync_every=3, overlap=2) for s in range(8)] == [
    *["local"] * 3,
    "send",
    "send",
    "local",
    "send",
    "send",
  ]
  assert lordo_jax.overlap_phase(5, sync_every=3, overlap="round") == "send"
  assert lordo_jax.overlap_phase(5, sync_every=3, overlap=None) == "local"
  with pytest.raises(TypeError, match="must be a non-negative Python int"):
    jax.jit(lambda s: lordo_jax.overlap_phase(s, sync_every=3, overlap=2))(1)


@pytest.mark.parametrize(
  "overlap, phase, refused",
  [
    (2, "sending", "overlap_phase='sending' is not a phase"),
    (None, "send", "built with overlap=None"),
    ("round", "local", "overlap_phase='local' with overlap='round'"),
  ],
)
def test_a_phase_that_does_not_fit_is_refused(overlap, phase, refused):
  tx = lordo_jax.diloco(LR, sync_every=K, overlap=overlap)
  params = {"w": jnp.ones(3)}
  with pytest.raises(ValueError, match=refused):
    tx.update(params, tx.init(params), params, overlap_phase=phase)


def _fixed_grads_step(tx, params, state, centre, t):
  updates, state = tx.update(centre * jnp.cos(t), state, params)
  return optax.apply_updates(params, updates), state


@functools.cache
def _fixed_grads_state(overlap, merge, compression):
  """The state after 4 rounds of SGD inside on :func:`_fixed_grads_step`'s gradients (the
  uncompressed run shared by both codecs)."""
  tx = _sgd_inside(overlap=overlap, merge=merge, compression=compression)
  step = workers.on_workers(functools.partial(_fixed_grads_step, tx), M)
  params = workers.stack(jnp.asarray(PARAMS0, jnp.float32), M)
  state = workers.stack(tx.init(params[0]), M)
  for t in range(1, 4 * K + 1):
    params, state = step(params, state, jnp.asarray(CENTRES), jnp.full((M,), t, jnp.float32))
  return state


@pytest.mark.parametrize("codec", ["int8", "bfloat16"])
@pytest.mark.parametrize("overlap, merge", [("round", "delayed"), (2, "streaming")])
def test_compressed_chunks_lose_nothing_the_residual_does_not_hold(codec, overlap, merge):
  """SGD inside on gradients that ignore the parameters: every pseudo-gradient is the
  same with and without compression, so the anchor minus the workers' mean residual
  (per chunk, MATH.md §9) is the uncompressed anchor, to float rounding."""
  anchors = []
  for compression in (None, codec):
    state = _fixed_grads_state(overlap, merge, compression)
    anchor = np.asarray(state.anchor[0], np.float64)
    if compression:
      flight = state.in_flight
      (fed,) = chunks_lib.thaw((np.mean(flight.residual, axis=0),), (PARAMS0.astype(np.float32),))
      assert np.abs(fed).max() > 1e-6  # something was rounded and held back
      anchor = anchor - fed
    anchors.append(anchor)
  np.testing.assert_allclose(anchors[1], anchors[0], atol=2e-6)


@METHODS
@pytest.mark.parametrize("overlap, phase", [("round", None), (2, "send")])
def test_compressed_chunks_are_top_level_collectives_of_carried_state(method, overlap, phase):
  tx = method(axis_name=workers.AXIS, overlap=overlap, compression="int8")
  text, computed = _compiled_step(tx, phase)
  for op in ("all-to-all", "all-gather"):  # the reduce-scatter and the all-gather
    assert hlo.overlappable(text, computed, op)
  assert "all-reduce" not in text


# A window's (tau = 2, rebase): matched exactly by test_overlap_compressed_reference.py.
@pytest.mark.parametrize("overlap, merge", [("round", "eager")])
def test_int8_chunks_with_bfloat16_moments_stay_near_the_reference(overlap, merge):
  tx = lordo_jax.local_adam(
    LR, sync_every=K, axis_name=workers.AXIS, overlap=overlap, merge=merge, compression="int8"
  )
  tau = K if overlap == "round" else overlap
  library, _ = library_run(tx)
  expected = ref.run(_local_adam_setup(tau, merge), PARAMS0, reference_grads, STEPS)
  gap = max(
    np.abs(lib[m] - w.params).max()
    for lib, ws in zip(library, expected, strict=True)
    for m, w in enumerate(ws)
  )
  assert 0 < gap < 3e-3  # int8's steps of 1/127 of a row's largest, fed back


def test_the_phase_reaches_the_method_through_a_chain_and_inject_hyperparams():
  """An extra argument of the step: through ``optax.chain`` (a transformation before the
  method) and ``inject_hyperparams``; a bad phase is refused through both."""
  params = {"w": jnp.ones((4, 3))}
  made = {
    "chain": optax.chain(
      optax.clip_by_global_norm(1.0), lordo_jax.diloco(LR, sync_every=K, overlap=2)
    ),
    "inject": optax.inject_hyperparams(lordo_jax.diloco, static_args=("sync_every", "overlap"))(
      learning_rate=LR, sync_every=K, overlap=2
    ),
  }
  for tx in made.values():
    state, update = tx.init(params), jax.jit(tx.update, static_argnames="overlap_phase")
    for step in range(2 * K):
      phase = lordo_jax.overlap_phase(step, sync_every=K, overlap=2)
      updates, state = update(params, state, params, overlap_phase=phase)
    assert int(lordo_jax.step_count(state)) == 2 * K
    with pytest.raises(ValueError, match="overlap_phase='soon' is not a phase"):
      tx.update(params, state, params, overlap_phase="soon")
