"""lordo(...) keeps the invariants every optax optimizer keeps (acceptance 5, 6, 8)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lordo_jax

PARAMS = {"w": jnp.ones((12, 6)) * 0.1, "v": jnp.ones((5, 10)) * 0.1, "b": jnp.zeros(6)}


def loss(params, x):
  return jnp.sum(jnp.tanh(x @ params["w"] + params["b"]) ** 2) + jnp.sum(
    (params["v"] @ x.T[:10, :5]) ** 2
  )


def data(steps, workers_=1, seed=0):
  keys = jax.random.split(jax.random.key(seed), steps)
  return [jax.random.normal(k, (workers_, 7, 12)) for k in keys]


def run_single(tx, steps=8, params=PARAMS, grad_transform=None):
  """One worker, axis_name=None. Returns final params, state, and the jitted step."""

  @jax.jit
  def step(params, state, x):
    grads = jax.grad(loss)(params, x)
    if grad_transform is not None:
      grads = grad_transform(grads)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state, updates

  state = tx.init(params)
  all_updates = []
  for x in data(steps):
    params, state, updates = step(params, state, x[0])
    all_updates.append(updates)
  return params, state, step, all_updates


def primitive_names(jaxpr, inside_cond=False, found=None):
  """{(primitive name, whether under a cond)} of a closed jaxpr, recursively."""
  found = set() if found is None else found
  for eqn in jaxpr.eqns:
    found.add((eqn.primitive.name, inside_cond))
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else [value]:
        inner = getattr(sub, "jaxpr", None)
        if inner is not None and hasattr(inner, "eqns"):
          primitive_names(inner, inside_cond or eqn.primitive.name == "cond", found)
  return found


@pytest.mark.parametrize("projection", ["svd", "subspace_iteration", "dct"])
def test_projections_are_computed_only_inside_conditional_branches(projection):
  tx = lordo_jax.lordo(1e-2, rank=2, sync_every=4, projection=projection)
  state = tx.init(PARAMS)
  grads = jax.tree.map(jnp.ones_like, PARAMS)
  names = primitive_names(jax.make_jaxpr(tx.update)(grads, state, PARAMS).jaxpr)
  expensive = {"svd", "householder_product", "geqrf", "qr", "top_k"}
  outside = {n for n, inside in names if not inside} & expensive
  inside = {n for n, inside in names if inside} & expensive
  assert not outside, f"{outside} run on every step"
  assert inside, "no projection found in the step at all"


# Compiles once over a run under shard_map: every run of tests/integration/test_golden_runs.py.
def test_chained_after_clip_by_global_norm_equals_clipping_first_and_compiles_once():
  """Eight steps (syncs at 3 and 6) of LoRDO alone and chained, each one program."""
  clip = optax.clip_by_global_norm(0.5)
  chained = optax.chain(clip, lordo_jax.lordo(1e-2, rank=2, sync_every=3))

  def clipped(grads):
    return clip.update(grads, clip.init(grads))[0]

  a, _, chained_step, _ = run_single(chained)
  b, _, step, _ = run_single(lordo_jax.lordo(1e-2, rank=2, sync_every=3), grad_transform=clipped)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6), a, b)
  assert step._cache_size() == 1 and chained_step._cache_size() == 1


def test_a_structural_int_left_out_of_static_args_says_to_list_it():
  static = ("rank", "sync_every", "sync_moments_every", "subspace_iterations", "seed")
  tx = optax.inject_hyperparams(lordo_jax.lordo, static_args=static)(
    learning_rate=1e-2, rank=2, sync_every=4, fragments=2
  )
  with pytest.raises(ValueError, match=r"fragments=Array\(2.*static_args=\('fragments',\)"):
    tx.init(PARAMS)


@pytest.mark.parametrize(
  "tx",
  [
    lordo_jax.lordo(1e-2, rank=2, sync_every=2, compression="int8", fragments=2),
    lordo_jax.ddp(1e-2),
    lordo_jax.low_rank_ddp(1e-2, rank=2, refresh_every=2),
    lordo_jax.local_adam(1e-2, sync_every=2),
    lordo_jax.desloc(1e-2, sync_every=2),
    lordo_jax.diloco(1e-2, sync_every=2),
  ],
  ids=["lordo", "ddp", "low_rank_ddp", "local_adam", "desloc", "diloco"],
)
def test_no_two_leaves_of_params_and_state_share_a_buffer(tx):
  # Donating a state whose leaves alias each other (or the params) fails at run time.
  params = jax.tree.map(jnp.copy, PARAMS)
  buffers = [x.unsafe_buffer_pointer() for x in jax.tree.leaves((params, tx.init(params)))]
  assert len(set(buffers)) == len(buffers)


def test_the_whole_state_can_be_donated_and_gives_the_same_run():
  tx = lordo_jax.lordo(1e-2, rank=2, sync_every=2)

  def step(p, s, x):
    updates, s = tx.update(jax.grad(loss)(p, x), s, p)
    return optax.apply_updates(p, updates), s

  donated = jax.jit(step, donate_argnums=(0, 1))
  plain = jax.jit(step)
  a, sa = jax.tree.map(jnp.copy, PARAMS), tx.init(PARAMS)
  b, sb = jax.tree.map(jnp.copy, PARAMS), tx.init(PARAMS)
  for x in data(4):
    a, sa = jax.block_until_ready(donated(a, sa, x[0]))
    b, sb = plain(b, sb, x[0])
  jax.tree.map(np.testing.assert_array_equal, (a, sa), (b, sb))


def test_bfloat16_params_get_bfloat16_updates_and_float32_projections():
  params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), PARAMS)
  tx = lordo_jax.lordo(1e-2, rank=2, sync_every=3)

  def bf16_loss(p, x):
    return loss(jax.tree.map(lambda a: a.astype(jnp.float32), p), x)

  state, update = tx.init(params), jax.jit(tx.update)
  for x in data(4):
    grads = jax.grad(bf16_loss)(params, x[0])
    updates, state = update(grads, state, params)
    assert all(u.dtype == jnp.bfloat16 for u in jax.tree.leaves(updates))
    params = optax.apply_updates(params, updates)
  bases = lordo_jax.projections(state)
  assert bases["w"].dtype == jnp.float32 and bases["v"].dtype == jnp.float32
  np.testing.assert_allclose(bases["w"].T @ bases["w"], np.eye(2), atol=1e-5)
  assert all(p.dtype == jnp.bfloat16 for p in jax.tree.leaves(params))


PUBLIC_OPTIMIZERS = {
  "lordo": lambda: lordo_jax.lordo(1e-2, rank=2, sync_every=2, error_feedback=True),
  "lordo_dct": lambda: lordo_jax.lordo(1e-2, rank=2, sync_every=2, projection="dct"),
  "lordo_two_sided": lambda: lordo_jax.lordo(1e-2, rank=2, sync_every=2, two_sided=True),
  "lordo_overlap_int8": lambda: lordo_jax.lordo(
    1e-2, rank=2, sync_every=4, overlap=1, fragments=2, compression="int8"
  ),
  "lordo_local_projection": lambda: lordo_jax.lordo_local_projection(1e-2, rank=2, sync_every=2),
  "lordo_global_projection_only": lambda: lordo_jax.lordo_global_projection_only(
    1e-2, rank=2, sync_every=2
  ),
  "low_rank_ddp_projected": lambda: lordo_jax.low_rank_ddp(
    1e-2, rank=2, refresh_every=2, communicate="projected"
  ),
  "ddp": lambda: lordo_jax.ddp(1e-2),
  "diloco": lambda: lordo_jax.diloco(1e-2, sync_every=2),
  "local_adam": lambda: lordo_jax.local_adam(1e-2, sync_every=2),
  "desloc": lambda: lordo_jax.desloc(1e-2, sync_every=2),
}


@pytest.mark.parametrize("name", sorted(PUBLIC_OPTIMIZERS))
def test_update_returns_the_state_init_gives_weak_types_included(name):
  """What ``jit`` keys a program on: the tree, each leaf's shape, dtype and weak type.
  The output of one update is that of every later one (the same program), so the state
  keeps its structure, shapes and dtypes over a run."""
  tx = PUBLIC_OPTIMIZERS[name]()
  avals = lambda tree: [  # noqa: E731
    (jax.tree_util.keystr(path), x.shape, x.dtype, x.weak_type)
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]
  ]
  before = jax.eval_shape(tx.init, PARAMS)
  after = jax.eval_shape(lambda s: tx.update(PARAMS, s, PARAMS)[1], before)
  assert jax.tree.structure(after) == jax.tree.structure(before)
  assert avals(after) == avals(before)


def test_update_without_params_says_what_to_do():
  tx = lordo_jax.lordo(1e-2, rank=2, sync_every=2)
  state = tx.init(PARAMS)
  with pytest.raises(
    ValueError, match=r"needs the current params.*tx.update\(grads, state, params\)"
  ):
    tx.update(PARAMS, state)


def test_unbound_axis_name_is_reported():
  tx = lordo_jax.lordo(1e-2, rank=2, sync_every=2, axis_name="workers")
  state = tx.init(PARAMS)
  with pytest.raises(ValueError, match=r"axis_name='workers' is not bound.*shard_map"):
    tx.update(PARAMS, state, PARAMS)


@pytest.mark.parametrize(
  "kwargs,pattern",
  [
    (dict(rank=0), r"rank=0 .*int >= 1"),
    (dict(rank=2.5), r"rank=2.5 .*int >= 1"),
    (dict(sync_every=0), r"sync_every=0 .*int >= 1"),
    (dict(omega=1.5), r"omega=1.5 .*\[0.0, 1.0\]"),
    (dict(omega=-0.1), r"omega=-0.1 .*\[0.0, 1.0\]"),
    (dict(b1=1.0), r"b1=1.0 .*\[0.0, 1.0\)"),
    (dict(b2=-0.5), r"b2=-0.5 .*\[0.0, 1.0\)"),
    (dict(projection="qr"), r"projection='qr' .*'svd', 'subspace_iteration', 'dct'"),
    (dict(side="top"), r"side='top' .*'auto', 'left', 'right'"),
    (dict(transport="spin"), r"transport='spin' .*'rotate', 'keep', 'reset'"),
    (dict(init_projection="zeros"), r"init_projection='zeros' .*'gradient', 'random'"),
    (dict(full_rank_scale="row"), r"full_rank_scale='row' .*'scalar', 'vector'"),
    (dict(sync_moments_every=0), r"sync_moments_every=0"),
    (dict(mu=0.0), r"mu=0.0 .*> 0"),
    (dict(error_feedback_dtype="float16"), r"error_feedback_dtype='float16' .*'bfloat16'"),
  ],
)
def test_bad_arguments_name_the_argument_the_value_and_what_is_accepted(kwargs, pattern):
  arguments = dict(rank=2, sync_every=4) | kwargs
  with pytest.raises(ValueError, match=pattern):
    lordo_jax.lordo(1e-2, **arguments)


def test_labels_route_leaves_and_matrix_axes_reshape_kernels():
  params = {"attn": jnp.ones((8, 2, 4)) * 0.1, "w": jnp.ones((8, 6)) * 0.1}
  labels = {"attn": lordo_jax.MatrixAxes(rows=0, cols=(1, 2)), "w": False}
  tx = lordo_jax.lordo(1e-2, rank=2, sync_every=2, low_rank_labels=labels)
  state = tx.init(params)
  bases = lordo_jax.projections(state)
  assert bases["w"] is None and bases["attn"].shape == (8, 2)
  grads = jax.tree.map(lambda x: jnp.cos(jnp.arange(x.size).reshape(x.shape) * 1.0), params)
  updates, state = tx.update(grads, state, params)
  assert updates["attn"].shape == (8, 2, 4)
  # The update of the kernel lies in... the matrix view's span only when omega = 1:
  tx1 = lordo_jax.lordo(1e-2, rank=2, sync_every=5, omega=1.0, low_rank_labels=labels)
  updates1, state1 = tx1.update(grads, tx1.init(params), params)
  q = lordo_jax.projections(state1)["attn"]
  matrix = updates1["attn"].reshape(8, 8)
  np.testing.assert_allclose(q @ (q.T @ matrix), matrix, atol=1e-6)


def test_labels_that_cannot_be_low_rank_are_refused():
  params = {"w": jnp.ones((8, 3)), "k": jnp.ones((4, 2, 2))}
  with pytest.raises(ValueError, match=r"\['w'\].*rank=4 is not smaller than min\(p, q\)=3"):
    lordo_jax.lordo(1e-2, rank=4, sync_every=2, low_rank_labels={"w": True, "k": False}).init(
      params
    )
  with pytest.raises(ValueError, match=r"\['k'\].*MatrixAxes"):
    lordo_jax.lordo(1e-2, rank=1, sync_every=2, low_rank_labels={"w": False, "k": True}).init(
      params
    )
