"""``update(..., round_phase=...)``: local steps compiled without the round, round
boundaries without its conditional.

The phased run (each update given ``lordo_jax.round_phase``'s phase, three programs)
equals the one-program run to float32 rounding, on one device and on 8 workers under
``shard_map``; the local program holds no conditional and copies no
state, the boundary program of one fragment no conditional of the round, the first
program none where no round can end at it (read from the compiled HLO: the copies the
round's conditionals cost a GPU step); a program run at an
update of another phase returns NaN updates instead of skipping or adding a round."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import lordo_jax

pytestmark = pytest.mark.timeout(300)

K = 4
STEPS = 13
# Float32 by name, not weakly typed as ``jnp.full``'s Python float makes them: a step's
# outputs are not, so weak parameters would compile each program twice (at the first
# update and after it), and the HLO read below would be a program the runs never ran.
PARAMS = {
  "w": jnp.full((16, 12), 0.1, jnp.float32),
  "b": jnp.zeros((12,), jnp.float32),
  "v": jnp.full((12, 16), 0.2, jnp.float32),
}


def gradient(t: int, params=PARAMS, workers: int | None = None):
  """A different random gradient at every step (and worker)."""
  key = jax.random.key(t)
  shape = lambda x: x.shape if workers is None else (workers, *x.shape)  # noqa: E731
  return {
    name: jax.random.normal(jax.random.fold_in(key, i), shape(x))
    for i, (name, x) in enumerate(sorted(params.items()))
  }


METHODS = {
  "lordo": lambda axis: lordo_jax.lordo(1e-2, rank=4, sync_every=K, axis_name=axis),
  "lordo_fragments": lambda axis: lordo_jax.lordo(
    1e-2, rank=4, sync_every=K, axis_name=axis, fragments=2
  ),
  # Options that change the round, two to a run: the SVD's refresh with int8 messages;
  # the fault-tolerant round as an optax user clips and tunes the rate (the phase passes
  # through a chain and inject_hyperparams).
  "lordo_svd_int8": lambda axis: lordo_jax.lordo(
    1e-2, rank=4, sync_every=K, axis_name=axis, projection="svd", compression="int8"
  ),
  "lordo_fault_tolerant_chain_inject_hyperparams": lambda axis: optax.chain(
    optax.clip_by_global_norm(1.0),
    optax.inject_hyperparams(
      lordo_jax.lordo, static_args=("rank", "sync_every", "axis_name", "fault_tolerant")
    )(learning_rate=1e-2, rank=4, sync_every=K, axis_name=axis, fault_tolerant=True),
  ),
  "local_adam": lambda axis: lordo_jax.local_adam(1e-2, sync_every=K, axis_name=axis),
  "diloco": lambda axis: lordo_jax.diloco(1e-2, sync_every=K, axis_name=axis),
  "desloc": lambda axis: lordo_jax.desloc(1e-2, sync_every=K, axis_name=axis),
}
FRAGMENTS = {"lordo_fragments": 2}
# The boundary program fuses its round with its local step, which the one program's
# conditional keeps apart (and, behind a clip, the clip's scale): XLA rounds the two
# programs' float32 arithmetic its own ways (1 ulp seen, of a parameter or of a
# difference of two near 1e-3).
RTOL, ATOL = 1e-6, 1e-7


def step_of(tx):
  def step(params, state, grads, phase):
    extra = {} if phase is None else {"round_phase": phase}
    updates, state = tx.update(grads, state, params, **extra)
    return optax.apply_updates(params, updates), state

  return step


def assert_identical(a, b, rtol=0.0, atol=0.0):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


@functools.cache
def program_of(method: str):
  """``METHODS[method]`` on one device and its step, jitted as a training loop runs it
  (parameters and state donated, the phase static): one program per phase, shared by
  the runs and the compiled HLO read below."""
  tx = METHODS[method](None)
  return tx, jax.jit(step_of(tx), donate_argnums=(0, 1), static_argnums=3)


def fresh(tree):
  """A copy of ``tree``'s arrays in buffers of their own, to donate."""
  return jax.tree.map(lambda x: x.copy() if isinstance(x, jax.Array) else x, tree)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_phased_run_is_the_one_program_run_to_float32_rounding(method):
  tx, step = program_of(method)
  runs = {}
  for phased in (False, True):
    params, state = fresh(PARAMS), fresh(tx.init(PARAMS))
    phases = []
    for t in range(STEPS):
      fragments = FRAGMENTS.get(method, 1)
      phase = lordo_jax.round_phase(t, sync_every=K, fragments=fragments) if phased else None
      phases.append(phase)
      params, state = step(params, state, gradient(t), phase)
    runs[phased] = (params, state)
  assert phases.count("local") >= STEPS // 2  # The phased run did take the local program.
  assert_identical(runs[False], runs[True], rtol=RTOL, atol=ATOL)
  assert int(lordo_jax.step_count(runs[True][1])) == STEPS


def test_a_phased_run_on_8_workers_under_shard_map_is_the_one_program_run():
  workers = 8
  mesh = jax.make_mesh((workers,), ("workers",))
  tx = METHODS["lordo"]("workers")
  sharding = jax.sharding.NamedSharding(mesh, P("workers"))

  def stacked(tree, copies=True):
    grow = lambda x: jnp.broadcast_to(x, (workers, *x.shape)) if copies else x  # noqa: E731
    return jax.tree.map(lambda x: jax.device_put(grow(x), sharding), tree)

  def body(params, state, grads, phase):
    squeeze = lambda t: jax.tree.map(lambda x: x[0], t)  # noqa: E731
    params, state = step_of(tx)(squeeze(params), squeeze(state), squeeze(grads), phase)
    return jax.tree.map(lambda x: x[None], (params, state))

  def make(phase):
    return jax.jit(
      jax.shard_map(
        lambda p, s, g: body(p, s, g, phase),
        mesh=mesh,
        in_specs=P("workers"),
        out_specs=P("workers"),
      )
    )

  programs = {phase: make(phase) for phase in (None, "first", "local", "boundary")}
  runs = {}
  for phased in (False, True):
    params, state = stacked(PARAMS), stacked(tx.init(PARAMS))
    for t in range(STEPS):
      phase = lordo_jax.round_phase(t, sync_every=K) if phased else None
      params, state = jax.block_until_ready(
        programs[phase](params, state, stacked(gradient(t, workers=workers), copies=False))
      )
    runs[phased] = (params, state)
  # To float32 rounding (XLA fuses the two programs' local steps differently here, and
  # three refreshes of the bases carry a last-bit difference on to 1e-5).
  assert_identical(runs[False], runs[True], rtol=1e-4, atol=1e-6)
  # The workers agree after the last sync (step 12) and part on step 13.
  assert float(np.ptp(np.asarray(runs[True][0]["w"]), axis=0).max()) > 0


def hlo_of(method, phase) -> str:
  tx, step = program_of(method)
  return step.lower(PARAMS, tx.init(PARAMS), gradient(0), phase).compile().as_text()


def copied_elements(hlo: str) -> int:
  """Elements copied by the copies of the entry computation."""
  entry = hlo[hlo.index("\nENTRY") :]
  total = 0
  for dims in re.findall(r"= [a-z0-9]+\[([\d,]*)\]\{?[\d,]*\}? copy\(", entry):
    total += int(np.prod([int(d) for d in dims.split(",") if d]))
  return total


@pytest.mark.parametrize("method", ["lordo", "local_adam"])
def test_the_local_program_holds_no_conditional_and_copies_no_state(method):
  local, whole = hlo_of(method, "local"), hlo_of(method, None)
  assert " conditional(" in whole and copied_elements(whole) > 0  # What the phase removes.
  assert " conditional(" not in local
  assert copied_elements(local) == 0


@pytest.mark.parametrize("method", ["lordo", "diloco", "lordo_fragments"])
def test_the_boundary_program_holds_no_conditional_of_the_round(method):
  """With one fragment the boundary runs its round unconditionally: the only
  conditionals left are the refresh's (the orthonormalisation's fallback, run when a
  factorization fails). With fragments the program does not know whose round ends:
  each keeps its conditional. (What it saves on a GPU, the copies of the state through
  a branch, is read from the GPU program: tests/local/test_step_launches_target.py.)"""
  boundary, whole = hlo_of(method, "boundary"), hlo_of(method, None)
  count = lambda hlo: hlo.count(" conditional(")  # noqa: E731
  if method == "lordo_fragments":
    assert count(boundary) >= FRAGMENTS[method]
    return
  # The one program's round (and first bases) are conditionals the boundary has not.
  assert count(boundary) <= count(whole) - (2 if method == "lordo" else 1)
  if method == "diloco":
    assert count(boundary) == 0


@pytest.mark.parametrize("method", ["lordo", "diloco"])
def test_the_first_program_holds_a_round_only_where_one_can_end(method):
  """At K > 1 no round ends at the first update: the first program is the first bases
  (LoRDO's conditional on the count) and the local step, with no conditional of the
  round. At K = 1 a round ends there: the first program is the one program."""
  count = lambda hlo: hlo.count(" conditional(")  # noqa: E731
  first, whole = hlo_of(method, "first"), hlo_of(method, None)
  assert count(first) <= count(whole) - 1
  if method == "diloco":
    assert count(first) == 0
  every_step = {
    "lordo": lambda: lordo_jax.lordo(1e-2, rank=4, sync_every=1, axis_name=None),
    "diloco": lambda: lordo_jax.diloco(1e-2, sync_every=1, axis_name=None),
  }[method]()
  compiled = {
    phase: jax.jit(functools.partial(every_step.update, round_phase=phase))
    .lower(gradient(0), every_step.init(PARAMS), PARAMS)
    .compile()
    .as_text()
    for phase in ("first", None)
  }
  assert count(compiled["first"]) == count(compiled[None]) > 0


def test_a_program_run_at_an_update_of_another_phase_returns_nan_updates():
  """Read from the parameters a step returns from finite ones (the run's programs)."""
  tx, step = program_of("lordo")

  def finite(params):
    return all(bool(jnp.isfinite(p).all()) for p in jax.tree.leaves(params))

  params, state = PARAMS, fresh(tx.init(PARAMS))
  # Update K (t = K - 1) ends a round: run as local there, and as a boundary at t = 1.
  phases = ["first", "boundary", "local", "local"]
  for t, phase in enumerate(phases):
    stepped, state = step(fresh(params), state, gradient(t), phase)
    assert finite(stepped) == (t not in (1, K - 1)), t
    params = stepped if finite(stepped) else params  # Go on from finite parameters.
  # The first program (no round in it at K > 1) run at update 5 is refused too.
  stepped, _ = step(fresh(params), state, gradient(4), "first")
  assert all(bool(jnp.isnan(p).all()) for p in jax.tree.leaves(stepped))
  # The first update, run as local or as a boundary, is refused the same way (its
  # bases are due), also when K = 1 ends a round there.
  every_step = lordo_jax.lordo(1e-2, rank=4, sync_every=1, axis_name=None)
  every_step_update = jax.jit(functools.partial(every_step.update, round_phase="boundary"))
  for stepped in [
    step(fresh(PARAMS), fresh(tx.init(PARAMS)), gradient(0), "local")[0],
    step(fresh(PARAMS), fresh(tx.init(PARAMS)), gradient(0), "boundary")[0],
    every_step_update(gradient(0), every_step.init(PARAMS), PARAMS)[0],
  ]:
    assert all(bool(jnp.isnan(u).all()) for u in jax.tree.leaves(stepped))


def test_round_phase_follows_fragments_and_a_period_function():
  assert [lordo_jax.round_phase(s, sync_every=4, fragments=2) for s in range(8)] == [
    "first",  # The first update.
    "boundary",  # t = 2: fragment 0 syncs (offset 2).
    "local",
    "boundary",  # t = 4: fragment 1 (offset 0).
    "local",
    "boundary",
    "local",
    "boundary",
  ]
  rule = lordo_jax.quadratic_sync_rule(2, 0.5, 1e-3)
  ends = set(lordo_jax.sync_steps(rule, 40))
  phases = [lordo_jax.round_phase(s, sync_every=rule) for s in range(40)]
  assert phases[0] == "first"
  assert [s + 1 for s, p in enumerate(phases) if p == "boundary"] == sorted(ends - {1})


@pytest.mark.parametrize(
  ("kwargs", "error", "match"),
  [
    (dict(step=-1, sync_every=4), TypeError, "non-negative Python int"),
    (dict(step=jnp.int32(3), sync_every=4), TypeError, "non-negative Python int"),
    (dict(step=3, sync_every=4, fragments=0), ValueError, "fragments=0"),
  ],
)
def test_round_phase_refuses_what_it_cannot_count(kwargs, error, match):
  with pytest.raises(error, match=match):
    lordo_jax.round_phase(**kwargs)


def test_update_refuses_a_phase_that_is_not_one_and_a_phase_with_overlap():
  tx = METHODS["lordo"](None)
  with pytest.raises(ValueError, match=r"round_phase='sync' is not a phase"):
    tx.update(gradient(0), tx.init(PARAMS), PARAMS, round_phase="sync")
  overlapped = lordo_jax.diloco(1e-2, sync_every=K, axis_name=None, overlap=1)
  with pytest.raises(ValueError, match=r"pass overlap_phase instead"):
    overlapped.update(gradient(0), overlapped.init(PARAMS), PARAMS, round_phase="local")
