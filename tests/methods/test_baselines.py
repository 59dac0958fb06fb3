"""The baselines of MATH.md §6, built from the library's pieces (lordo_jax/methods/).

Every method runs on M = 4 simulated workers (one ``jax.shard_map`` program over a
mesh axis ``workers``) on a two-part least-squares problem whose gradient is also
written out in NumPy, so ``tests/references/baseline_reference.py`` can follow docs/MATH.md alone.
"""

import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from optax.contrib import _galore

import lordo_jax
from tests.helpers import hlo
from tests.helpers import workers
from tests.references import baseline_reference

M = 4
AXIS = workers.AXIS
RANK = 2
K = 3  # sync_every of the local methods.
T = 3  # refresh_every of low-rank DDP: refreshes at steps 1, 4, 7, 10.
STEPS = 12
DESLOC_K = 2  # K_x; the default K_u = 6 and K_v = 12.
DESLOC_STEPS = 24
LR = 1e-2
WD = 0.01

# w: 12 x 6 (left case, moments r x 6); v: 5 x 10 (right case, moments r x 5);
# b: a bias, on the full-rank path.
SHAPES = {"w": (12, 6), "v": (5, 10), "b": (6,)}
PQ = {"w": 72, "v": 50, "b": 6}
ALL = sum(PQ.values())  # 128: every parameter.
MATRICES = PQ["w"] + PQ["v"]  # 122: the low-rank matrices.
RQ = RANK * 6 + RANK * 5  # 22: one r x q moment (or coordinate) per matrix.
# side="galore_std": the moments on the larger dimension, r max(p, q) per matrix.
R_MAX = RANK * 12 + RANK * 10  # 44
RR = 2 * RANK * RANK  # 8: one r x r core per matrix (two-sided).
OVERSAMPLE = 2  # Sketch width l = r + 2 = 4 for both matrices.
L = RANK + OVERSAMPLE
# A randomized-SVD refresh averages, per matrix (w, v): Y = X Omega (p x l), one
# power iteration X^T Q (q x l) and X Z (p x l), then the core Q^T X (l x q). One
# counted all-reduce per pass, of both matrices' products.
# A refresh from the step's own gradient makes the core U^T G V diagonal up to float32
# rounding, which Adam's first step divides by sqrt(v) + eps, of the rounding's own
# size: two float32 programs that round differently (averaging sketches, or the
# gradient) then differ by O(1) there. A larger eps compares them, not their rounding.
TSR_EPS = 1e-2
SKETCHES = [(12 * L, 5 * L), (6 * L, 10 * L), (12 * L, 5 * L), (L * 6, L * 10)]


def initial_params():
  keys = jax.random.split(jax.random.key(42), 3)
  return {
    name: 0.5 * jax.random.normal(key, shape)
    for key, (name, shape) in zip(keys, SHAPES.items(), strict=True)
  }


def loss(params, batch):
  r = batch["x"] @ params["w"] + params["b"] - batch["y"]
  s = batch["z"] @ params["v"] - batch["t"]
  return 0.5 * (jnp.sum(r**2) + jnp.sum(s**2))


def numpy_grads(params, batch):
  """The gradient of :func:`loss`, by hand."""
  r = batch["x"] @ params["w"] + params["b"] - batch["y"]
  s = batch["z"] @ params["v"] - batch["t"]
  return {"w": batch["x"].T @ r, "b": r.sum(axis=0), "v": batch["z"].T @ s}


def make_batches(steps, *, same_on_every_worker=False, seed=0):
  """Per step a dict of (M, 8, .) arrays; worker m reads index m."""
  batches = []
  for t in range(steps):
    keys = jax.random.split(jax.random.key(seed * 1000 + t), 4)
    drawn = 1 if same_on_every_worker else M
    draw = lambda key, cols, drawn=drawn: jax.random.normal(key, (drawn, 8, cols))  # noqa: E731
    batch = {"x": draw(keys[0], 12), "y": draw(keys[1], 6), "z": draw(keys[2], 5)}
    batch["t"] = draw(keys[3], 10)
    if same_on_every_worker:
      batch = jax.tree.map(lambda a: jnp.repeat(a, M, axis=0), batch)
    batches.append(batch)
  return batches


METHODS = {
  "ddp": lambda axis: lordo_jax.ddp(LR, axis_name=axis, weight_decay=WD),
  "low_rank_ddp_full": lambda axis: lordo_jax.low_rank_ddp(
    LR, rank=RANK, refresh_every=T, axis_name=axis, weight_decay=WD
  ),
  "low_rank_ddp_projected": lambda axis: lordo_jax.low_rank_ddp(
    LR, rank=RANK, refresh_every=T, axis_name=axis, weight_decay=WD, communicate="projected"
  ),
  "local_adam": lambda axis: lordo_jax.local_adam(
    LR, sync_every=K, axis_name=axis, weight_decay=WD
  ),
  "desloc": lambda axis: lordo_jax.desloc(LR, sync_every=DESLOC_K, axis_name=axis, weight_decay=WD),
  "diloco": lambda axis: lordo_jax.diloco(LR, sync_every=K, axis_name=axis, weight_decay=WD),
  "lordo": lambda axis: lordo_jax.lordo(LR, rank=RANK, sync_every=K, axis_name=axis),
  "low_rank_ddp_two_sided_projected": lambda axis: lordo_jax.low_rank_ddp(
    LR,
    rank=RANK,
    refresh_every=T,
    axis_name=axis,
    weight_decay=WD,
    communicate="projected",
    two_sided=True,
    projection="randomized_svd",
    oversample=OVERSAMPLE,
    eps=TSR_EPS,
  ),
  "low_rank_ddp_two_sided_full": lambda axis: lordo_jax.low_rank_ddp(
    LR,
    rank=RANK,
    refresh_every=T,
    axis_name=axis,
    weight_decay=WD,
    two_sided=True,
    projection="randomized_svd",
    oversample=OVERSAMPLE,
    eps=TSR_EPS,
  ),
  # Each worker refreshes from the synced mean, no message of its own: the power iteration
  # of the default (a second copy of the sketch's products and orthonormalisations in the
  # program, local) changes no message. Its run with one: tests/integration/test_golden_runs.py.
  "lordo_two_sided": lambda axis: lordo_jax.lordo(
    LR,
    rank=RANK,
    sync_every=K,
    axis_name=axis,
    two_sided=True,
    projection="randomized_svd",
    oversample=OVERSAMPLE,
    power_iterations=0,
  ),
  "lordo_galore_std": lambda axis: lordo_jax.lordo(
    LR, rank=RANK, sync_every=K, axis_name=axis, side="galore_std"
  ),
  "lordo_local_projection": lambda axis: lordo_jax.lordo_local_projection(
    LR, rank=RANK, sync_every=K, axis_name=axis
  ),
  "lordo_global_projection_only": lambda axis: lordo_jax.lordo_global_projection_only(
    LR, rank=RANK, sync_every=K, axis_name=axis
  ),
}


def steps_of(method):
  return DESLOC_STEPS if method == "desloc" else STEPS


@functools.cache
def multi_worker_step(method):
  """The jitted shard_map step of ``method`` on M workers (compiled once per method)."""
  mesh = jax.make_mesh((M,), (AXIS,))
  return workers.make_step(METHODS[method](AXIS), loss, mesh), mesh


@functools.cache
def multi_worker_run(method, same_on_every_worker=False):
  """[(params, state)] after every step, stacked over the M workers."""
  step, mesh = multi_worker_step(method)
  tx = METHODS[method](AXIS)
  params = workers.shard(workers.stack(initial_params(), M), mesh)
  state = workers.shard(workers.stack(tx.init(initial_params()), M), mesh)
  history = []
  for batch in make_batches(steps_of(method), same_on_every_worker=same_on_every_worker):
    params, state = step(params, state, workers.shard(batch, mesh))
    jax.block_until_ready((params, state))
    history.append((params, state))
  return history


def single_worker_run(method, batches):
  """Params after every step of ``method`` with ``axis_name=None`` on one worker."""
  tx = METHODS[method](None)

  @jax.jit
  def step(params, state, batch):
    updates, state = tx.update(jax.grad(loss)(params, batch), state, params)
    return optax.apply_updates(params, updates), state

  params, state = initial_params(), tx.init(initial_params())
  history = []
  for batch in batches:
    params, state = step(params, state, batch)
    jax.block_until_ready((params, state))
    history.append(params)
  return history


def mean_gradient_run(tx, batches):
  """Params after every step of a single-process ``tx`` fed the workers' mean gradient."""
  per_worker = jax.vmap(jax.grad(loss), in_axes=(None, 0))

  @jax.jit
  def step(params, state, batch):
    grads = jax.tree.map(lambda g: jnp.mean(g, axis=0), per_worker(params, batch))
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  params, state = initial_params(), tx.init(initial_params())
  history = []
  for batch in batches:
    params, state = step(params, state, batch)
    jax.block_until_ready((params, state))
    history.append(params)
  return history


def worker(params, m):
  """Worker m's slice of a stacked params dict, as float64 NumPy arrays."""
  return {k: np.asarray(x, np.float64)[m] for k, x in params.items()}


def bases(state):
  """Every low-rank basis of a stacked state, on the host: name -> (M, n, r)."""
  return {k: np.asarray(q) for k, q in lordo_jax.projections(state).items() if q is not None}


def assert_trees_close(actual, expected, atol, rtol=0.0, where=""):
  for k in expected:
    np.testing.assert_allclose(
      np.asarray(actual[k], np.float64),
      np.asarray(expected[k], np.float64),
      atol=atol,
      rtol=rtol,
      err_msg=f"{where} leaf {k}",
    )


# 1. DDP.


def test_ddp_equals_adamw_on_the_mean_gradient():
  history = multi_worker_run("ddp")
  expected = mean_gradient_run(optax.adamw(LR, weight_decay=WD), make_batches(STEPS))
  for t, ((params, _), reference) in enumerate(zip(history, expected, strict=True), start=1):
    for m in range(M):
      assert_trees_close(worker(params, m), reference, atol=1e-6, where=f"step {t} worker {m}")


# 2. Low-rank DDP against optax.contrib.galore.


def canonical_svd(a, full_matrices=True, **kwargs):
  """``jnp.linalg.svd`` with the singular vectors' signs made canonical (MATH.md §5).

  Our bases flip each basis vector so that its largest-magnitude entry is positive;
  LAPACK's signs are arbitrary. The sign of a basis vector changes nothing inside one
  basis, but with ``transport="keep"`` (GaLore) the first moment is reused after a
  refresh, so a flipped vector flips the sign of its moment row and the iterates
  differ. GaLore reads the left vectors (u) when p >= q and the right ones (rows of
  vh) otherwise, exactly our "auto" side, so we canonicalise those and flip the
  partner vectors with them: u s vh is unchanged, so this is still an SVD.
  """
  u, s, vh = jnp.linalg.svd(a, full_matrices=full_matrices, **kwargs)
  k = s.shape[-1]
  basis = u[:, :k] if a.shape[0] >= a.shape[1] else vh[:k].T
  pivots = jnp.take_along_axis(basis, jnp.argmax(jnp.abs(basis), axis=0)[None], axis=0)[0]
  sign = jnp.where(pivots < 0, -1.0, 1.0).astype(u.dtype)
  return u.at[:, :k].multiply(sign), s, vh.at[:k].multiply(sign[:, None])


class _CanonicalSvdNumpy:
  """``jax.numpy`` as ``optax.contrib._galore`` sees it in this test."""

  linalg = types.SimpleNamespace(svd=canonical_svd)

  def __getattr__(self, name):
    return getattr(jnp, name)


@functools.cache
def canonical_galore_run():
  """:func:`mean_gradient_run` of optax's GaLore with canonical signs (traced, compiled and
  run with the patched SVD; both ways of communicating compare with it)."""
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(_galore, "jnp", _CanonicalSvdNumpy())
    galore = optax.contrib.galore(LR, rank=RANK, update_proj_gap=T, scale=1.0, weight_decay=WD)
    return mean_gradient_run(galore, make_batches(STEPS))


@pytest.mark.parametrize("communicate", ["full", "projected"])
def test_low_rank_ddp_equals_galore_on_the_mean_gradient(communicate):
  expected = canonical_galore_run()
  history = multi_worker_run(f"low_rank_ddp_{communicate}")
  for t, ((params, _), reference) in enumerate(zip(history, expected, strict=True), start=1):
    for m in range(M):
      assert_trees_close(worker(params, m), reference, atol=1e-5, where=f"step {t} worker {m}")
  # Several refreshes happened (steps 1, 4, 7, 10) and the basis moved between them.
  moved = jnp.max(lordo_jax.principal_angles(*(bases(history[i][1])["w"][0] for i in (2, 5))))
  assert moved > 1e-3


def test_galore_comparison_needs_the_canonical_signs():
  """Without the sign convention, galore's iterates leave ours after a refresh."""
  galore = optax.contrib.galore(LR, rank=RANK, update_proj_gap=T, scale=1.0, weight_decay=WD)
  raw = mean_gradient_run(galore, make_batches(STEPS))[-1]
  ours = worker(multi_worker_run("low_rank_ddp_full")[-1][0], 0)
  gap = max(float(np.max(np.abs(ours[k] - np.asarray(raw[k])))) for k in ours)
  if gap < 1e-5:
    pytest.skip("LAPACK's signs happened to be canonical for this data")
  assert gap > 1e-4


def test_projected_and_full_low_rank_ddp_take_the_same_steps():
  full = multi_worker_run("low_rank_ddp_full")
  projected = multi_worker_run("low_rank_ddp_projected")
  for (p_full, _), (p_projected, _) in zip(full, projected, strict=True):
    assert_trees_close(worker(p_projected, 0), worker(p_full, 0), atol=1e-6)
  assert lordo_jax.communicated_bytes(projected[-1][1]) < lordo_jax.communicated_bytes(full[-1][1])


def test_two_sided_projected_sends_sketches_and_cores_and_takes_the_full_steps():
  """TSR: averaging r x r cores and randomized-SVD sketches is running on the mean."""
  full = multi_worker_run("low_rank_ddp_two_sided_full")
  projected = multi_worker_run("low_rank_ddp_two_sided_projected")
  for t, ((p_full, _), (p_projected, _)) in enumerate(zip(full, projected, strict=True), 1):
    assert_trees_close(worker(p_projected, 0), worker(p_full, 0), atol=2e-5, where=f"step {t}")
  moved = np.max(np.abs(worker(full[-1][0], 0)["w"] - np.asarray(initial_params()["w"])))
  assert moved > 1e-2
  assert lordo_jax.communicated_bytes(projected[-1][1]) < lordo_jax.communicated_bytes(full[-1][1])


# 3. Local Adam, DES-LOC and DiLoCo.

LOCAL_METHODS = ["local_adam", "desloc", "diloco"]


@pytest.mark.parametrize("method", LOCAL_METHODS)
def test_identical_data_on_every_worker_equals_one_worker(method):
  history = multi_worker_run(method, same_on_every_worker=True)
  batches = make_batches(steps_of(method), same_on_every_worker=True)
  single = single_worker_run(method, [jax.tree.map(lambda a: a[0], b) for b in batches])
  for t, ((params, _), reference) in enumerate(zip(history, single, strict=True), start=1):
    for m in range(M):
      assert_trees_close(worker(params, m), reference, atol=1e-6, where=f"step {t} worker {m}")


REFERENCE_SETTINGS = {
  "local_adam": dict(sync_every=K, first_moment_every=K, second_moment_every=K),
  "desloc": dict(sync_every=DESLOC_K, first_moment_every=6, second_moment_every=12),
  "diloco": dict(
    sync_every=K, first_moment_every=None, second_moment_every=None, outer=(0.7, 0.9, True)
  ),
}


@pytest.mark.parametrize("method", LOCAL_METHODS)
def test_different_data_matches_the_numpy_reference(method):
  batches = make_batches(steps_of(method))
  per_worker = [
    [{k: np.asarray(a[m], np.float64) for k, a in batch.items()} for m in range(M)]
    for batch in batches
  ]
  expected = baseline_reference.local_adamw(
    {k: np.asarray(x, np.float64) for k, x in initial_params().items()},
    numpy_grads,
    per_worker,
    num_workers=M,
    lr=LR,
    weight_decay=WD,
    **REFERENCE_SETTINGS[method],
  )
  history = multi_worker_run(method)
  spread = 0.0
  for t, ((params, _), reference) in enumerate(zip(history, expected, strict=True), start=1):
    for m in range(M):
      assert_trees_close(worker(params, m), reference[m], atol=1e-5, where=f"step {t} worker {m}")
    spread = max(spread, float(np.max(np.abs(reference[0]["w"] - reference[1]["w"]))))
  # The workers really drifted apart between syncs (the test would see a missed sync).
  assert spread > 1e-3


# 4. The ledger: MATH.md §7 and the compiled program.


def every_step(t):
  return True


def at_sync(period):
  return lambda t: t % period == 0


# The messages of each method, from MATH.md §4 and §7: (elements, fires at step t).
# Elements given per leaf, as a tuple, where XLA may regroup them across messages.
MESSAGES = {
  "ddp": [(ALL, every_step)],
  "low_rank_ddp_full": [(ALL, every_step)],
  "low_rank_ddp_projected": [
    (RQ, every_step),  # the coordinates c of both matrices
    (PQ["b"], every_step),  # the bias, off the low-rank path: its full gradient
    (MATRICES, lambda t: (t - 1) % T == 0),  # the full gradient, on refresh steps
  ],
  "local_adam": [(ALL, at_sync(K)), (2 * ALL, at_sync(K))],
  "desloc": [(ALL, at_sync(DESLOC_K)), (ALL, at_sync(6)), (ALL, at_sync(12))],
  "diloco": [(ALL, at_sync(K))],
  "lordo": [
    (MATRICES, lambda t: t == 1),  # the first gradient, for the first basis
    (ALL, at_sync(K)),  # the pseudo-gradient
    (2 * RQ + 2 * PQ["b"], at_sync(K)),  # low-rank moments and the bias's Adam moments
  ],
  "lordo_galore_std": [
    (MATRICES, lambda t: t == 1),
    (ALL, at_sync(K)),
    (2 * R_MAX + 2 * PQ["b"], at_sync(K)),  # moments on the larger side, the bias's Adam
  ],
  "lordo_local_projection": [(ALL, at_sync(K))],
  "low_rank_ddp_two_sided_full": [(ALL, every_step)],
  "low_rank_ddp_two_sided_projected": [
    (RR, every_step),  # the r x r cores of both matrices
    (PQ["b"], every_step),
    *[(size, lambda t: (t - 1) % T == 0) for size in SKETCHES],  # refresh: sketches only
  ],
  "lordo_two_sided": [
    (MATRICES, lambda t: t == 1),
    (ALL, at_sync(K)),
    (2 * RR + 2 * PQ["b"], at_sync(K)),  # r x r moments and the bias's Adam moments
  ],
}
MESSAGES["lordo_global_projection_only"] = MESSAGES["lordo"]


def spec_formula(method, n):
  """Elements all-reduced per worker after n steps: the closed forms of MATH.md §7."""
  bias = PQ["b"]
  return {
    "ddp": n * ALL,
    "low_rank_ddp_full": n * ALL,
    # K rq + (K/T) pq per matrix; the bias is averaged in full every step.
    "low_rank_ddp_projected": n * RQ + (n // T) * MATRICES + n * bias,
    "local_adam": (n // K) * 3 * ALL,
    "desloc": ALL * (n // DESLOC_K + n // 6 + n // 12),  # pq (1 + K_x/K_u + K_x/K_v) per K_x
    "diloco": (n // K) * ALL,
    # pq + 2rq per matrix and sync; the bias takes DES-LOC's path (pq + 2pq).
    "lordo": MATRICES + (n // K) * (MATRICES + 2 * RQ + 3 * bias),
    # pq + 2 r max(p, q) per matrix and sync with side="galore_std".
    "lordo_galore_std": MATRICES + (n // K) * (MATRICES + 2 * R_MAX + 3 * bias),
    "lordo_local_projection": (n // K) * ALL,
    "lordo_global_projection_only": MATRICES + (n // K) * (MATRICES + 2 * RQ + 3 * bias),
    # TSR: r^2 per matrix and step, (p + q) l (1 + 2 k) per matrix and refresh.
    "low_rank_ddp_two_sided_full": n * ALL,
    "low_rank_ddp_two_sided_projected": n * RR + n * bias + -(-n // T) * sum(map(sum, SKETCHES)),
    "lordo_two_sided": MATRICES + (n // K) * (MATRICES + 2 * RR + 3 * bias),
  }[method]


def compiled_all_reduces(method):
  step, mesh = multi_worker_step(method)
  params, state = multi_worker_run(method)[-1]
  batch = workers.shard(make_batches(1)[0], mesh)
  return hlo.collectives_by_depth(step.lower(params, state, batch).compile().as_text())


@pytest.mark.parametrize("method", list(METHODS))
def test_ledger_matches_spec_and_the_compiled_all_reduces(method):
  messages = MESSAGES[method]
  found = compiled_all_reduces(method)
  # Every all-reduce is float32 here, so its bytes are 4 x its elements.
  assert all(b == 4 * e for ops in found.values() for e, b in ops)
  # What runs every step sits outside any conditional (XLA may fuse those into one
  # all-reduce, so compare the sum); each conditional message is one all-reduce
  # inside a branch.
  total = lambda size: sum(size) if isinstance(size, tuple) else size  # noqa: E731
  every = sum(total(size) for size, fires in messages if fires is every_step)
  assert sum(e for e, _ in found.get(0, [])) == every
  in_branches = sorted(e for depth, ops in found.items() if depth > 0 for e, _ in ops)
  per_leaf = lambda size: size if isinstance(size, tuple) else (size,)  # noqa: E731
  conditional = [size for size, fires in messages if fires is not every_step]
  # XLA's all-reduce combiner merges the messages of one branch (a round's pseudo-gradient
  # and moments) and regroups per-leaf messages freely: the branches send the messages'
  # elements in at most as many all-reduces, and none where no message is conditional.
  pieces = [e for size in conditional for e in per_leaf(size)]
  assert sum(in_branches) == sum(pieces)
  assert len(in_branches) <= len(pieces) and bool(in_branches) == bool(pieces)

  history = multi_worker_run(method)
  for t, (_, state) in enumerate(history, start=1):
    sent = [total(size) for size, fires in messages for s in range(1, t + 1) if fires(s)]
    assert lordo_jax.communicated_elements(state) == sum(sent), f"step {t}"
    assert lordo_jax.communicated_bytes(state) == 4 * sum(sent), f"step {t}"
    assert lordo_jax.all_reduce_count(state) == len(sent), f"step {t}"
  n = len(history)
  assert lordo_jax.communicated_elements(history[-1][1]) == spec_formula(method, n)


def test_ledgers_of_every_worker_agree():
  _, state = multi_worker_run("low_rank_ddp_projected")[-1]
  ledgers = [
    x
    for x in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, lordo_jax.Ledger))
    if isinstance(x, lordo_jax.Ledger)
  ]
  assert len(ledgers) == 2  # average_gradients (the bias) and the coordinates
  for ledger in ledgers:
    for field in ledger:
      values = np.asarray(field)
      assert (values == values[:1]).all()


# 6. The ablations.


def largest_angle(a, b):
  """The largest principal angle between span(a) and span(b), orthonormal, in radians.

  From its sine, ``||(I - b b^T) a||_2``, in float64. ``lordo_jax.principal_angles``
  takes the arccos of float32 cosines, which cannot resolve angles below about
  ``sqrt(2 * 2**-24) = 3.5e-4`` rad (a cosine one ulp below 1 is already 3.5e-4), so
  it cannot show that an angle is below 1e-4; it is used where angles are large.
  """
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.arcsin(min(1.0, np.linalg.norm(a - b @ (b.T @ a), 2))))


def test_local_projection_workers_hold_different_bases_after_a_sync():
  history = multi_worker_run("lordo_local_projection")
  params, state = history[K - 1]  # just after the first sync
  for name, q in bases(state).items():
    angles = lordo_jax.principal_angles(q[0], q[1])
    assert float(jnp.max(angles)) > 0.1, name
  # The parameters were averaged all the same.
  np.testing.assert_allclose(worker(params, 0)["w"], worker(params, 1)["w"], atol=1e-6)


@pytest.mark.parametrize("method,moves", [("lordo_global_projection_only", False), ("lordo", True)])
def test_without_the_full_rank_term_the_subspace_never_moves(method, moves):
  history = multi_worker_run(method)
  first = bases(history[0][1])
  largest = 0.0
  for t in range(K, STEPS + 1, K):  # after every sync, which refreshed every basis
    later = bases(history[t - 1][1])
    for name in ("w", "v"):
      angle = largest_angle(first[name][0], later[name][0])
      # The library's own measure agrees, to its float32 resolution.
      library = float(jnp.max(lordo_jax.principal_angles(first[name][0], later[name][0])))
      assert abs(library - angle) < 2e-3
      largest = max(largest, angle)
  if moves:
    assert largest > 1e-2  # LoRDO's full-rank term turns the subspace
  else:
    assert largest < 1e-4


# Argument checks.


@pytest.mark.parametrize(
  "build,match",
  [
    (lambda: lordo_jax.desloc(1e-3, sync_every=4, first_moment_every=6), "first_moment_every=6"),
    (lambda: lordo_jax.desloc(1e-3, sync_every=4, second_moment_every=0), "second_moment_every"),
    (lambda: lordo_jax.desloc(1e-3, sync_every=0), "sync_every=0"),
    (lambda: lordo_jax.low_rank_ddp(1e-3, rank=2, communicate="half"), "communicate='half'"),
    (
      lambda: lordo_jax.low_rank_ddp(1e-3, rank=2, communicate="projected", omega=0.7),
      "omega=0.7",
    ),
    (
      lambda: lordo_jax.low_rank_ddp(1e-3, rank=2, communicate="projected", error_feedback=True),
      "error_feedback=True",
    ),
    (lambda: lordo_jax.low_rank_ddp(1e-3, rank=2, refresh_every=0), "refresh_every=0"),
    (lambda: lordo_jax.low_rank_ddp(1e-3, rank=0), "rank=0"),
    (lambda: lordo_jax.diloco(1e-3, sync_every=4, outer_momentum=1.5), "outer_momentum=1.5"),
    (lambda: lordo_jax.local_adam(1e-3, sync_every=2, b1=1.0), "b1=1.0"),
    (lambda: lordo_jax.ddp(1e-3, weight_decay=-1.0), "weight_decay=-1.0"),
    (
      lambda: lordo_jax.lordo_local_projection(1e-3, rank=2, sync_every=2, transport="spin"),
      "transport='spin'",
    ),
    (
      lambda: lordo_jax.lordo(1e-3, rank=2, sync_every=2, full_rank_numerator="error_fed"),
      "full_rank_numerator='error_fed' is not accepted with error_feedback=False.*Set "
      "error_feedback=True",
    ),
    (
      lambda: lordo_jax.low_rank_ddp(1e-3, rank=2, full_rank_numerator="error"),
      "full_rank_numerator='error'",
    ),
    (lambda: lordo_jax.low_rank_ddp(1e-3, rank=2, qh_nu=1.5), "qh_nu=1.5"),
    (lambda: lordo_jax.lordo(1e-3, rank=2, sync_every=2, full_rank_nu=-0.1), "full_rank_nu=-0.1"),
    (
      lambda: lordo_jax.lordo(1e-3, rank=2, sync_every=2, low_rank_term="sgd"),
      "low_rank_term='sgd'",
    ),
    (lambda: lordo_jax.low_rank_ddp(1e-3, rank=2, side="galore"), "side='galore'"),
    (
      lambda: lordo_jax.low_rank_ddp(1e-3, rank=2, two_sided=True, side="galore_std"),
      "side='galore_std' is not accepted with two_sided=True",
    ),
    (
      lambda: lordo_jax.scale_by_low_rank_adam(2, full_rank_numerator="error_fed"),
      "scale_by_low_rank_adam: full_rank_numerator='error_fed'",
    ),
    (lambda: lordo_jax.scale_by_low_rank_adam(2, side="top"), "side='top'"),
  ],
)
def test_bad_arguments_are_named(build, match):
  with pytest.raises(ValueError, match=match):
    build()


def test_unbound_axis_name_is_a_clear_error():
  tx = lordo_jax.ddp(1e-3, axis_name="workers")
  params = {"w": jnp.ones((3, 2))}
  with pytest.raises(ValueError, match="axis_name='workers' is not bound"):
    tx.update(params, tx.init(params), params)
