"""Every method where a Flax user puts it: ``nnx.Optimizer`` and Linen's ``TrainState``.

``nnx.Optimizer`` keeps the state ``init`` gives in Flax Variables and writes each
update's state back into them; the state keeps its structure, so the step compiles once
(as AdamW's does). Each run here is compared with the same optimizer in a plain optax
loop on a dict of arrays: bit for bit under ``jit``, to float32 rounding in eager mode.
LoRDO's ablations keep LoRDO's state, leaf for leaf (checked here), so Flax holds them
as it holds LoRDO's, which runs. The state readers take ``optimizer.opt_state`` as it is.
"""

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen
from flax import nnx
from flax.training import train_state
from jax.sharding import PartitionSpec as P

import lordo_jax

STEPS = 5  # Two rounds of sync_every=2 and a step past the last sync.
EAGER_STEPS = 3  # Op by op: the first update, a round of sync_every=2 and a step past it.
INPUTS = jax.random.normal(jax.random.key(1), (8, 16))
TARGETS = jax.random.normal(jax.random.key(2), (8, 4))

METHODS = {
  "lordo": lambda: lordo_jax.lordo(1e-2, rank=2, sync_every=2),
  "lordo_dct": lambda: lordo_jax.lordo(1e-2, rank=2, sync_every=2, projection="dct"),
  "lordo_two_sided": lambda: lordo_jax.lordo(1e-2, rank=2, sync_every=2, two_sided=True),
  "low_rank_ddp": lambda: lordo_jax.low_rank_ddp(1e-2, rank=2, refresh_every=2),
  "low_rank_ddp_projected": lambda: lordo_jax.low_rank_ddp(
    1e-2, rank=2, refresh_every=2, communicate="projected"
  ),
  "ddp": lambda: lordo_jax.ddp(1e-2),
  "diloco": lambda: lordo_jax.diloco(1e-2, sync_every=2),
  "local_adam": lambda: lordo_jax.local_adam(1e-2, sync_every=2),
  "desloc": lambda: lordo_jax.desloc(1e-2, sync_every=2),
}


# LoRDO's ablations: LoRDO's state (:func:`test_the_lordo_ablations_keep_lordos_state`), so
# Flax's Variables hold them as they hold LoRDO's, whose runs the tests below compare.
ABLATIONS = {
  "lordo_local_projection": lambda: lordo_jax.lordo_local_projection(1e-2, rank=2, sync_every=2),
  "lordo_global_projection_only": lambda: lordo_jax.lordo_global_projection_only(
    1e-2, rank=2, sync_every=2
  ),
}


class MLP(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.up = nnx.Linear(16, 32, rngs=rngs)
    self.down = nnx.Linear(32, 4, rngs=rngs)

  def __call__(self, x):
    return self.down(jax.nn.relu(self.up(x)))


def nnx_loss(model, x=INPUTS, y=TARGETS):
  return jnp.mean((model(x) - y) ** 2)


@functools.cache
def plain_run(method):
  """The reference: ``METHODS[method]`` in a jitted optax loop on the model's parameters
  as a dict; the parameters and the state after ``STEPS``, and the parameters after
  ``EAGER_STEPS``."""
  tx = METHODS[method]()
  graphdef, params = nnx.split(MLP(nnx.Rngs(0)), nnx.Param)

  def loss(p):
    return nnx_loss(nnx.merge(graphdef, p))

  @jax.jit
  def step(p, state):
    updates, state = tx.update(jax.grad(loss)(p), state, p)
    return optax.apply_updates(p, updates), state

  p = nnx.to_pure_dict(params)
  state = tx.init(p)
  for t in range(STEPS):
    p, state = step(p, state)
    if t + 1 == EAGER_STEPS:
      at_eager_steps = p
  return p, state, at_eager_steps


def plain_params_after(method):
  return plain_run(method)[0]


@functools.cache
def nnx_jit_run(method):
  """``METHODS[method]`` in ``nnx.Optimizer``, ``STEPS`` steps under ``nnx.jit``; the
  model, the optimizer and the number of traces of the step."""
  model = MLP(nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, METHODS[method](), wrt=nnx.Param)
  traces = []

  @nnx.jit
  def step(model, optimizer):
    traces.append(1)  # Runs once per trace: each trace is a compilation.
    optimizer.update(model, nnx.grad(nnx_loss)(model))

  for _ in range(STEPS):
    step(model, optimizer)
  return model, optimizer, len(traces)


def params_of(model):
  return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def assert_trees_equal(a, b, atol=0.0):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=atol)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_nnx_optimizer_under_nnx_jit_equals_the_optax_loop_and_compiles_once(method):
  model, optimizer, traces = nnx_jit_run(method)
  assert_trees_equal(params_of(model), plain_params_after(method))
  assert int(optimizer.step[...]) == STEPS
  assert traces == 1, "the state changed its structure or types after an update"


def avals(tree):
  """What ``jit`` keys a program on: each leaf's path, shape, dtype and weak type."""
  return [
    (jax.tree_util.keystr(path), x.shape, x.dtype, x.weak_type)
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]
  ]


@pytest.mark.parametrize("ablation", sorted(ABLATIONS))
def test_the_lordo_ablations_keep_lordos_state(ablation):
  """Before and after an update: the tree and leaves of LoRDO's state (traced, not run)."""
  params = nnx.to_pure_dict(nnx.split(MLP(nnx.Rngs(0)), nnx.Param)[1])
  want = jax.eval_shape(METHODS["lordo"]().init, params)
  tx = ABLATIONS[ablation]()
  before = jax.eval_shape(tx.init, params)
  after = jax.eval_shape(lambda state: tx.update(params, state, params)[1], before)
  for state in (before, after):
    assert jax.tree.structure(state) == jax.tree.structure(want)
    assert avals(state) == avals(want)


@pytest.mark.parametrize("method", ["lordo", "low_rank_ddp_projected"])
def test_nnx_optimizer_eager_equals_the_optax_loop(method):
  model = MLP(nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, METHODS[method](), wrt=nnx.Param)
  for _ in range(EAGER_STEPS):
    optimizer.update(model, nnx.grad(nnx_loss)(model))
  assert int(optimizer.step[...]) == EAGER_STEPS
  # Op by op against one fused program: equal to float32 rounding, not bit for bit.
  assert_trees_equal(params_of(model), plain_run(method)[2], atol=1e-5)


def test_state_readers_take_the_nnx_optimizers_state_as_it_is_and_give_plain_values():
  _, optimizer, _ = nnx_jit_run("lordo")
  _, plain, _ = plain_run("lordo")
  state = optimizer.opt_state
  count = lordo_jax.step_count(state)
  assert isinstance(count, jax.Array) and count.dtype == jnp.int32 and int(count) == STEPS
  for reader in (
    lordo_jax.communicated_elements,
    lordo_jax.communicated_bytes,
    lordo_jax.all_reduce_count,
  ):
    got = reader(state)
    assert type(got) is int and got == reader(plain), reader.__name__  # 0: one worker
  assert lordo_jax.state_bytes(state) == lordo_jax.state_bytes(plain)
  for got, want in zip(
    jax.tree.leaves(lordo_jax.projections(state)),
    jax.tree.leaves(lordo_jax.projections(plain)),
    strict=True,
  ):
    assert isinstance(got, jax.Array)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)


def test_a_plain_loop_on_flax_variables_equals_the_loop_on_a_dict():
  """``tx.init`` and ``tx.update`` on ``nnx.State`` holding ``nnx.Param``s (no
  ``nnx.as_pure``): the updates come back in that structure, the run is the dict's."""
  tx = METHODS["lordo"]()
  graphdef, params = nnx.split(MLP(nnx.Rngs(0)), nnx.Param)
  grad = jax.grad(lambda p: nnx_loss(nnx.merge(graphdef, p)))
  state, update = tx.init(params), jax.jit(tx.update)
  for _ in range(STEPS):
    updates, state = update(grad(params), state, params)
    assert jax.tree.structure(updates) == jax.tree.structure(params)
    params = optax.apply_updates(params, updates)
  assert_trees_equal(nnx.to_pure_dict(params), plain_params_after("lordo"), atol=1e-5)


def test_nnx_optimizer_split_merge_under_jax_jit_equals_the_optax_loop():
  model = MLP(nnx.Rngs(0))
  graphdef, state = nnx.split((model, nnx.Optimizer(model, METHODS["lordo"](), wrt=nnx.Param)))

  @jax.jit
  def step(state):
    model, optimizer = nnx.merge(graphdef, state)
    optimizer.update(model, nnx.grad(nnx_loss)(model))
    return nnx.state((model, optimizer))

  for _ in range(STEPS):
    state = step(state)
  model, _ = nnx.merge(graphdef, state)
  assert_trees_equal(params_of(model), plain_params_after("lordo"))
  # The state init gives is the state each update writes back: one program.
  assert step._cache_size() == 1


# On the workers: LoRDO, and LoRDO streamed in two fragments whose messages travel in
# int8 one step (overlap=1), with the steps' static phase (fragments sync at steps 2 and
# 4 and land at 3 and 5), refreshed by SVD: half the program of the default refresh,
# which the first case runs on the workers.
ON_WORKERS = {
  "lordo": (dict(sync_every=2), {}),
  "lordo_overlap_fragments_int8": (
    dict(sync_every=4, overlap=1, fragments=2, compression="int8", projection="svd"),
    dict(sync_every=4, overlap=1, fragments=2),
  ),
}


@pytest.mark.parametrize("config", sorted(ON_WORKERS))
def test_nnx_optimizer_one_copy_per_worker_under_shard_map_equals_the_optax_workers(config):
  """The Flax guide's NNX pattern: model and optimizer split, stacked, stepped per worker;
  with an int overlap, each step jitted with its ``overlap_phase`` static."""
  workers = 4
  mesh = jax.make_mesh((workers,), ("workers",))
  split = jax.NamedSharding(mesh, P("workers"))
  options, phase_of = ON_WORKERS[config]
  make = lambda: lordo_jax.lordo(1e-2, rank=2, axis_name="workers", **options)  # noqa: E731
  phases = [lordo_jax.overlap_phase(t, **phase_of) if phase_of else None for t in range(STEPS)]
  assert not phase_of or phases == ["local", "local", "send", "local", "send"]
  model = MLP(nnx.Rngs(0))
  graphdef, state = nnx.split((model, nnx.Optimizer(model, make(), wrt=nnx.Param)))

  def per_worker(tree):  # Split as the step returns it (P("workers", None, ...)): one program.
    stacked = lambda a: jnp.stack([a] * workers)  # noqa: E731
    spec = lambda a: jax.NamedSharding(mesh, P("workers", *[None] * a.ndim))  # noqa: E731
    return jax.tree.map(lambda a: jax.device_put(stacked(a), spec(a)), tree)

  inputs = [jax.random.normal(jax.random.key(10 + t), (workers, 8, 16)) for t in range(STEPS)]

  def nnx_worker(state, x, phase=None):
    state, x = jax.tree.map(lambda a: a[0], (state, x))
    model, optimizer = nnx.merge(graphdef, state)
    extra = {} if phase is None else {"overlap_phase": phase}
    optimizer.update(model, nnx.grad(nnx_loss)(model, x), **extra)
    return jax.tree.map(lambda a: a[None], nnx.state((model, optimizer)))

  tx = make()
  model_graph, params = nnx.split(MLP(nnx.Rngs(0)), nnx.Param)
  params = nnx.to_pure_dict(params)

  def optax_worker(p, opt_state, x, phase=None):
    p, opt_state, x = jax.tree.map(lambda a: a[0], (p, opt_state, x))
    grads = jax.grad(lambda q: nnx_loss(nnx.merge(model_graph, q), x))(p)
    extra = {} if phase is None else {"overlap_phase": phase}
    updates, opt_state = tx.update(grads, opt_state, p, **extra)
    return jax.tree.map(lambda a: a[None], (optax.apply_updates(p, updates), opt_state))

  def shard_map(f, phase):  # one program per phase, the phase static
    body = lambda *args: f(*args, phase=phase)  # noqa: E731
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("workers"), out_specs=P("workers")))

  programs = {
    phase: (shard_map(nnx_worker, phase), shard_map(optax_worker, phase)) for phase in phases
  }
  state, p, opt_state = per_worker(state), per_worker(params), per_worker(tx.init(params))
  for x, phase in zip(inputs, phases, strict=True):
    nnx_step, optax_step = programs[phase]
    state = jax.block_until_ready(nnx_step(state, jax.device_put(x, split)))
    p, opt_state = jax.block_until_ready(optax_step(p, opt_state, jax.device_put(x, split)))
  model, optimizer = nnx.merge(graphdef, state)
  assert_trees_equal(params_of(model), p)
  assert all(nnx_step._cache_size() == 1 for nnx_step, _ in programs.values())  # one per phase
  sent = lordo_jax.communicated_bytes(optimizer.opt_state)
  assert sent == lordo_jax.communicated_bytes(opt_state) > 0


class LinenMLP(linen.Module):
  @linen.compact
  def __call__(self, x):
    return linen.Dense(4)(jax.nn.relu(linen.Dense(32)(x)))


@pytest.mark.parametrize("method", ["lordo", "low_rank_ddp_projected", "diloco"])
def test_linen_train_state_apply_gradients_equals_the_optax_loop(method):
  module = LinenMLP()
  variables = module.init(jax.random.key(0), INPUTS)
  loss = lambda p: jnp.mean((module.apply(p, INPUTS) - TARGETS) ** 2)  # noqa: E731
  state = train_state.TrainState.create(
    apply_fn=module.apply, params=variables, tx=METHODS[method]()
  )

  @jax.jit
  def step(state):
    return state.apply_gradients(grads=jax.grad(loss)(state.params))

  tx = METHODS[method]()

  @jax.jit
  def optax_step(p, opt_state):
    updates, opt_state = tx.update(jax.grad(loss)(p), opt_state, p)
    return optax.apply_updates(p, updates), opt_state

  p, opt_state = variables, tx.init(variables)
  for _ in range(STEPS):
    state = step(state)
    p, opt_state = optax_step(p, opt_state)
  assert_trees_equal(state.params, p)
  assert int(state.step) == STEPS


def test_a_state_of_another_structure_is_refused_with_a_clear_error():
  tx = METHODS["lordo"]()
  params = {"w": jnp.ones((16, 8)), "b": jnp.zeros(8)}
  other = lordo_jax.lordo(1e-2, rank=2, sync_every=2).init({"w": jnp.ones((16, 8))})
  with pytest.raises(ValueError, match="does not have the structure"):
    tx.update(params, other, params)


@pytest.mark.parametrize("method", ["lordo", "lordo_two_sided", "lordo_dct"])
def test_projections_read_the_state_nnx_optimizer_keeps(method):
  _, optimizer, _ = nnx_jit_run(method)
  state = optimizer.opt_state  # As Flax keeps it, OptArray wrappers and all.
  got, want = lordo_jax.projections(state), lordo_jax.projections(plain_run(method)[1])
  for layer in ("up", "down"):
    assert got[layer]["bias"] is None and want[layer]["bias"] is None
    pairs = zip(
      jax.tree.leaves(got[layer]["kernel"]), jax.tree.leaves(want[layer]["kernel"]), strict=True
    )
    for a, b in pairs:
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


class Attention(nnx.Module):
  """Flax's attention, whose query, key and value kernels are (d, heads, head_dim) and
  output kernel (heads, head_dim, d), none of them a 2-D leaf; then a 2-D kernel."""

  def __init__(self, rngs: nnx.Rngs):
    self.attention = nnx.MultiHeadAttention(4, 32, decode=False, rngs=rngs)
    self.mlp = nnx.Linear(32, 32, rngs=rngs)

  def __call__(self, x):
    return self.mlp(self.attention(x))


def attention_labels(params):
  """The 3-D kernels as 32 x 32 matrices, the 2-D kernel as it is, the biases full-rank."""

  def label(path, x):
    where = jax.tree_util.keystr(path)
    if isinstance(x, optax.MaskedNode) or "kernel" not in where:
      return False
    if x.ndim == 2:
      return True
    if "['out']" in where:
      return lordo_jax.MatrixAxes(rows=(0, 1), cols=2)
    return lordo_jax.MatrixAxes(rows=0, cols=(1, 2))

  return jax.tree_util.tree_map_with_path(
    label, params, is_leaf=lambda x: isinstance(x, optax.MaskedNode)
  )


def _attention_warnings(**options):
  """The warnings of building ``nnx.Optimizer`` on :class:`Attention` and three steps."""
  x = jax.random.normal(jax.random.key(3), (2, 5, 32))
  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter("always")
    model = Attention(nnx.Rngs(0))
    tx = lordo_jax.lordo(1e-2, rank=4, sync_every=2, **options)
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer):
      optimizer.update(model, nnx.grad(lambda m: jnp.mean(m(x) ** 2))(model))

    for _ in range(3):
      step(model, optimizer)
  messages = [str(w.message) for w in record if "takes the full-rank path" in str(w.message)]
  return messages, nnx.as_pure(optimizer.opt_state)


def test_nnx_attention_kernels_are_named_once_with_the_matrix_axes_that_fit():
  messages, _ = _attention_warnings()
  assert len(messages) == 4, messages  # query, key, value, out: once each, not per trace
  for name in ("query", "key", "value"):
    (message,) = [m for m in messages if f"['{name}']['kernel']" in m]
    assert "shape (32, 4, 8)" in message and "MatrixAxes(rows=0, cols=(1, 2))" in message
  (out,) = [m for m in messages if "['out']['kernel']" in m]
  assert "shape (4, 8, 32)" in out and "MatrixAxes(rows=(0, 1), cols=2)" in out


def test_nnx_attention_kernels_labelled_with_matrix_axes_warn_nothing_and_go_low_rank():
  messages, state = _attention_warnings(low_rank_labels=attention_labels)
  assert messages == []
  bases = lordo_jax.projections(state)
  kernels = {name: bases["attention"][name]["kernel"].shape for name in bases["attention"]}
  assert kernels == dict.fromkeys(("key", "out", "query", "value"), (32, 4))
  assert bases["mlp"]["kernel"].shape == (32, 4)


def test_one_workers_copy_is_read_as_the_flax_guide_says():
  """On ``jax.make_mesh``'s Explicit axes, ``leaf[0]`` of a stacked array raises; the
  guide's two readings give worker 0's copy."""
  mesh = jax.make_mesh((8,), ("workers",))
  stacked = jnp.arange(24.0).reshape(8, 3)
  leaf = jax.device_put(stacked, jax.NamedSharding(mesh, jax.P("workers")))
  with pytest.raises(Exception) as error:
    leaf[0]
  assert type(error.value).__name__ == "ShardingTypeError"
  np.testing.assert_array_equal(jax.device_get(leaf)[0], stacked[0])
  whole = jax.NamedSharding(mesh, jax.P())
  np.testing.assert_array_equal(leaf.at[0].get(out_sharding=whole), stacked[0])
