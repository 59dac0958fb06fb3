"""A slot that leaves for whole rounds and joins again, inside a fixed mesh of 4 workers.

LoRDO, fault_tolerant=True, K = 4, error feedback on (the one per-worker float state):
worker 3 passes worker_present=False on every step of rounds 2 and 3 (it still steps on
its own data) and is present from round 4. After every boundary all four slots hold the
same anchor, moments, bases and counters, the absent slot none of its own error
feedback; the averages are checked against its own-data runs of one worker alone and a
run of workers 0-2 on three devices, and the ledger against the compiled program's
all-reduces (:func:`test_the_ledger_counts_what_every_slot_sends_absent_or_not`).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import lordo_jax
from tests.helpers import hlo
from tests.helpers import workers

pytestmark = pytest.mark.timeout(300)

M, K, ROUNDS, OUT, ABSENT_ROUNDS = 4, 4, 4, 3, (2, 3)
AWAY = tuple(range(K + 1, 3 * K + 1))  # the steps of rounds 2 and 3, when slot OUT is away
PARAMS = {"w": jnp.zeros((16, 8)), "b": jnp.zeros(8)}
TARGET = jax.random.normal(jax.random.key(0), (16, 8))


def optimizer(axis_name):
  return lordo_jax.lordo(
    3e-2, rank=2, sync_every=K, axis_name=axis_name, fault_tolerant=True, error_feedback=True
  )


def loss(params, x):
  return jnp.mean((x @ params["w"] + params["b"] - x @ TARGET) ** 2)


def batch(t):
  """Step t's inputs of the 4 slots: slot m's drawn around m / 2 (their gradients differ)."""
  return np.asarray(
    jax.random.normal(jax.random.key(t), (M, 8, 16)) + np.arange(M)[:, None, None] / 2
  )


def present(slot, t, away=AWAY) -> bool:
  """Whether ``slot`` passes worker_present=True at step t, slot OUT being away at ``away``."""
  return not (slot == OUT and t in away)


def counted(r) -> list[int]:
  """The slots in round r's averages (in the run with absences)."""
  return [m for m in range(M) if present(m, r * K)]


def body(tx, params, state, x, here):
  grads = jax.grad(loss)(params, x)
  updates, state = tx.update(grads, state, params, worker_present=here)
  return optax.apply_updates(params, updates), state


@functools.cache
def compiled(n: int):
  """The jitted step of n slots (the first n devices) and its mesh."""
  mesh = jax.make_mesh((n,), (workers.AXIS,), devices=jax.devices()[:n])
  tx = optimizer(workers.AXIS)

  def one(*args):
    args = jax.tree.map(lambda a: a[0], args)
    return jax.tree.map(lambda a: a[None], body(tx, *args))

  specs = P(workers.AXIS)
  return jax.jit(jax.shard_map(one, mesh=mesh, in_specs=specs, out_specs=specs)), mesh


def start():
  return workers.stack(PARAMS, M), workers.stack(optimizer(workers.AXIS).init(PARAMS), M)


def run(params, state, rounds, slots=tuple(range(M)), away=AWAY):
  """The stacked (params, state) on the host after each of ``rounds``, from stacked
  ``params`` and ``state`` at the start of the first; worker i is slot ``slots[i]``."""
  step, mesh = compiled(len(slots))
  params, state = workers.shard((params, state), mesh)
  after = []
  for r in rounds:
    for t in range((r - 1) * K + 1, r * K + 1):
      here = np.array([present(s, t, away) for s in slots])
      inputs = workers.shard((batch(t)[list(slots)], here), mesh)
      params, state = jax.block_until_ready(step(params, state, *inputs))
    after.append(jax.device_get((params, state)))
  return after


@functools.cache
def with_absences():
  return run(*start(), range(1, ROUNDS + 1))


@functools.cache
def everyone_present():
  return run(*start(), range(1, ROUNDS + 1), away=())


def slot(tree, m):
  return jax.tree.map(lambda a: a[m], tree)


def low_rank(state):
  """The stacked low-rank moments of ``w`` (basis, mu, nu, error) and the other leaves'
  Adam state."""
  inner = state.inner_state[0].inner_states
  return inner["low_rank"].inner_state.moments.matrices()["w"], inner["full_rank"].inner_state


def _is_error(path) -> bool:
  return any(getattr(k, "name", None) == "error" for k in path)


def test_after_each_boundary_every_slot_holds_the_synchronised_state():
  for r, (params, state) in enumerate(with_absences(), 1):
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
      if not _is_error(path):  # anchor, moments, bases, counters, ledger, faults
        assert (leaf == leaf[:1]).all(), f"round {r}: {jax.tree_util.keystr(path)}"
    for name, p in params.items():  # landed on the anchor, to float rounding (MATH.md 4.7)
      a = state.anchor[name]
      assert np.abs(p - a).max() <= np.finfo(np.float32).eps * np.abs(a).max(), (r, name)
    errors = low_rank(state)[0].error
    norms = np.abs(errors).reshape(M, -1).max(axis=1)
    out = [m for m in range(M) if m not in counted(r)]
    assert (norms[out] == 0).all(), f"round {r}: the absent slot kept its error feedback"
    assert (norms[counted(r)] > 1e-4).all()
    np.testing.assert_array_equal(state.faults.round_ok, [True] * M)


@functools.cache
def alone():
  """The jitted step of one worker with no worker axis."""
  return jax.jit(functools.partial(body, optimizer(None)))


def one_worker_round(params, state, r, m):
  """Slot m's parameters after round r, stepped alone (no mean) from its ``params`` and
  ``state``: the round of one worker syncs with itself and lands on its own theta_m."""
  step = alone()
  for t in range((r - 1) * K + 1, r * K + 1):
    params, state = jax.block_until_ready(step(params, state, batch(t)[m], True))
  return jax.device_get(params)


def test_the_mean_leaves_the_absent_slot_out_and_counts_it_again_when_it_joins():
  """The synchronised parameters (outer SGD(1)) are the mean of the present slots' own
  round, each computed alone: without slot 3 in rounds 2-3, with it again in round 4."""
  history = with_absences()
  for r in range(2, ROUNDS + 1):
    params, state = history[r - 2]
    own = [one_worker_round(slot(params, m), slot(state, m), r, m) for m in range(M)]
    anchor = history[r - 1][1].anchor
    for name in PARAMS:
      thetas = np.stack([o[name] for o in own])
      np.testing.assert_allclose(anchor[name][0], thetas[counted(r)].mean(0), atol=1e-6)
      other = thetas[:OUT].mean(0) if r not in ABSENT_ROUNDS else thetas.mean(0)
      assert np.abs(anchor[name][0] - other).max() > 1e-3, f"round {r}, {name}"


def test_while_it_is_out_the_others_train_as_three_workers_would():
  """Rounds 2-3 of slots 0-2 run again on a mesh of three, from round 1's boundary:
  the same anchor, bases, moments and error buffers (to the rounding of a mean over 4
  with weight 3/4 against one over 3), and the same ledger."""
  params, state = with_absences()[0]
  three = run(slot(params, slice(0, OUT)), slot(state, slice(0, OUT)), ABSENT_ROUNDS, (0, 1, 2))
  for r, (_, alone) in zip(ABSENT_ROUNDS, three, strict=True):
    _, four = with_absences()[r - 1]
    for got, expected in [(four.anchor, alone.anchor), (low_rank(four), low_rank(alone))]:
      for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(g[:OUT], e, rtol=1e-5, atol=1e-5, err_msg=f"round {r}")
    for g, e in zip(jax.tree.leaves(four.ledger), jax.tree.leaves(alone.ledger), strict=True):
      np.testing.assert_array_equal(g[:OUT], e)
    np.testing.assert_array_equal(alone.faults.excluded, [0] * OUT)


def test_the_loss_falls_and_only_the_absences_are_counted():
  x = np.concatenate(list(batch(1000)))
  losses = [float(loss(PARAMS, x))]
  losses += [float(loss(slot(state.anchor, 0), x)) for _, state in with_absences()]
  assert np.isfinite(losses).all() and all(np.diff(losses) < 0), losses
  excluded = [state.faults.excluded.tolist() for _, state in with_absences()]
  assert excluded == [[0] * M, [1] * M, [2] * M, [2] * M]
  assert [int(state.faults.empty_syncs[0]) for _, state in with_absences()] == [0] * ROUNDS
  assert int(everyone_present()[-1][1].faults.excluded[0]) == 0


def test_the_ledger_counts_what_every_slot_sends_absent_or_not():
  """The ledger counts, per worker, the payload of each all-reduce the program runs. In
  a fixed mesh an absent slot is in every all-reduce (replica group {0,1,2,3}: presence
  is a runtime value, the groups are compiled), sending zeros and weight 0, as many
  bytes as a present one: the wire's traffic, hence the ledger, is that of a run with
  everyone present, and every slot's ledger is the same. What carried present workers'
  values is recovered from faults.excluded: of the M copies of each sync's payload S,
  ``excluded`` were zeros, so M * ledger - excluded * S bytes (first gradient included).
  Counting only present slots would make the ledger disagree with the program."""
  absent, full = with_absences(), everyone_present()
  for (_, a), (_, f) in zip(absent, full, strict=True):
    for got, expected in zip(jax.tree.leaves(a.ledger), jax.tree.leaves(f.ledger), strict=True):
      np.testing.assert_array_equal(got, expected)
  step, mesh = compiled(M)
  params, state = start()
  inputs = workers.shard((params, state, batch(1), np.ones(M, bool)), mesh)
  text = step.lower(*inputs).compile().as_text()
  lines = [line for line in text.splitlines() if " all-reduce(" in line]
  # Every all-reduce (XLA may combine the round's messages into fewer) spans the mesh.
  assert lines and {hlo.replica_groups(line) for line in lines} == {
    frozenset({frozenset(range(M))})
  }
  payloads = [b for ops in hlo.collectives_by_depth(text).values() for _, b in ops]
  sent = [lordo_jax.communicated_bytes(state) for _, state in absent]
  per_sync = set(np.diff(sent).tolist())
  assert len(per_sync) == 1  # rounds with and without slot 3 send the same
  (per_sync,) = per_sync
  first = sent[0] - per_sync  # the first gradient, sent once at step 1
  # Round 1 runs every all-reduce once; the ledger counts each message's float32 weight,
  # and where XLA combines two messages that share one it sends it once (4 bytes fewer).
  assert sent[0] - sum(payloads) in (0, 4) and first in payloads
  assert [int(s.ledger.all_reduces[0]) for _, s in absent] == [3, 5, 7, 9]
  excluded = int(absent[-1][1].faults.excluded[0])
  here = [len(counted(r)) for r in range(1, ROUNDS + 1)]
  assert M * sent[-1] - excluded * per_sync == M * first + per_sync * sum(here)


def test_the_flag_that_counts_is_the_one_at_the_step_that_ends_a_round():
  """Away only on the boundary steps 8 and 12: the same run, bit for bit (the guide
  says so)."""
  boundaries = run(*start(), range(1, ROUNDS + 1), away=(2 * K, 3 * K))
  for got, expected in zip(boundaries, with_absences(), strict=True):
    for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
      np.testing.assert_array_equal(g, e)
