"""The compiled-program check of overlap (``tests/helpers/hlo.py``), with its controls.

A collective can hide under a step's forward/backward pass only if, in the step's
optimised HLO, it sits at the top level of the entry computation and depends on no
entry parameter that holds the step's gradients or parameters (MATH.md §4: today's
round is a ``lax.cond``). These tests show the check tells the two apart: a
collective of state carried in passes; one of the gradients, one in a conditional,
and the library's current sync are reported as not overlappable. The programs are
lowered and compiled only, never run, so no execution is ever in flight.
"""

import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec as P

import lordo_jax
from tests.helpers import hlo

WORKERS = 4
PARAMS, CARRIED, GRADS = 0, 1, 2  # the entry parameters of the toy step below


def _mesh():
  return jax.make_mesh((WORKERS,), ("workers",))


def _compiled(body, *args) -> str:
  """The optimised HLO of ``body`` under ``shard_map`` over the workers, each argument
  (a pytree) split over them along its leading axis; entry parameters in their order."""
  mesh = _mesh()
  specs = jax.tree.map(lambda _: P("workers"), args)
  placed = jax.device_put(args, jax.tree.map(lambda s: jax.NamedSharding(mesh, s), specs))
  shard = jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P("workers"))
  return jax.jit(shard, keep_unused=True).lower(*placed).compile().as_text()


def _toy(sent):
  """A step of ``params`` (its compute, a matmul) that averages ``sent(carried, grads)``."""

  def body(params, carried, grads):
    local = jnp.tanh(params @ params.T).sum() + grads
    return params - 0.1 * local + jax.lax.pmean(sent(carried, grads), "workers")

  x = jnp.ones((4 * WORKERS, 8))
  return _compiled(body, x, x, x)


def test_a_collective_of_state_carried_in_is_overlappable():
  text = _toy(lambda carried, grads: carried * 2.0)
  assert hlo.collective_inputs(text) == [{CARRIED}]
  assert hlo.overlappable(text, {PARAMS, GRADS})


def test_a_collective_of_the_gradients_is_flagged():
  text = _toy(lambda carried, grads: grads * 2.0)
  assert hlo.collective_inputs(text) == [{GRADS}]
  assert not hlo.overlappable(text, {PARAMS, GRADS})


def test_a_collective_in_a_conditional_is_not_overlappable():
  def sent(carried, grads):
    averaged = lambda: jax.lax.pcast(jax.lax.pmean(carried, "workers"), "workers", to="varying")  # noqa: E731
    return jax.lax.cond(carried[0, 0] > 0, averaged, lambda: carried)

  def body(params, carried, grads):
    return params - 0.1 * grads + sent(carried, grads)

  x = jnp.ones((4 * WORKERS, 8))
  text = _compiled(body, x, x, x)
  assert hlo.collectives_by_depth(text).keys() == {1}
  assert not hlo.overlappable(text, {PARAMS, GRADS})


def test_todays_round_is_not_overlappable_for_lordo_and_diloco():
  """Every collective of the library's sync sits in the round's ``lax.cond``."""
  params = {"w": jnp.ones((WORKERS, 16, 8)), "b": jnp.zeros((WORKERS, 8))}
  for tx in (
    lordo_jax.lordo(1e-2, rank=2, sync_every=4, axis_name="workers"),
    lordo_jax.diloco(1e-2, sync_every=4, axis_name="workers"),
  ):
    # Waited on: the only program this test runs (one device, no collective).
    state = jax.block_until_ready(jax.vmap(tx.init)(params))

    def body(params, state, grads, tx=tx):
      one = lambda x: x[0]  # noqa: E731
      updates, state = tx.update(
        jax.tree.map(one, grads), jax.tree.map(one, state), jax.tree.map(one, params)
      )
      new = optax.apply_updates(jax.tree.map(one, params), updates)
      return jax.tree.map(lambda x: x[None], (new, state))

    text = _compiled(body, params, state, params)
    depths = hlo.collectives_by_depth(text)
    assert depths and 0 not in depths, depths  # all in the round's conditional
    grads = set(
      range(len(jax.tree.leaves((params, state))), len(jax.tree.leaves((params, state, params))))
    )
    assert not hlo.overlappable(text, grads)


def test_the_reader_knows_every_way_xla_prints_the_workers_groups():
  """jaxlib 0.10 prints a collective's groups explicitly, newer XLA as an iota or over
  named mesh axes; all three name the worker axis of a (4, 2) mesh, and the fsdp
  axis is another set of groups."""
  workers = frozenset({frozenset({0, 2, 4, 6}), frozenset({1, 3, 5, 7})})
  assert hlo.replica_groups("x, replica_groups={{0,2,4,6},{1,3,5,7}}, y") == workers
  assert hlo.replica_groups("x, replica_groups=[2,4]<=[4,2]T(1,0), y") == workers
  assert (
    hlo.replica_groups("x, replica_groups=mesh['workers'=4,'fsdp'=2] {'workers'}, y") == workers
  )
  fsdp = frozenset(frozenset({2 * i, 2 * i + 1}) for i in range(4))
  assert hlo.replica_groups("x, replica_groups=[4,2]<=[8], y") == fsdp
  assert hlo.replica_groups("x, replica_groups=mesh['workers'=4,'fsdp'=2] {'fsdp'}, y") == fsdp
