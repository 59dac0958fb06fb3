"""Two-sided low-rank projection (TSR-Adam) against the NumPy reference, and its refresh.

``two_sided_reference`` is written from the math in its docstring, sharing no code
with the package. LoRDO and low-rank DDP run on 4 workers with different data
(float32, one jitted ``shard_map`` step) beside the float64 reference; parameters
and both bases must agree to 1e-4. The randomized SVD is checked against its float64
algorithm, and its workers' averaged sketches against the sketch of their mean, in
``test_basis_two_sided_randomized_svd.py``.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lordo_jax
from lordo_jax.local import _two_sided_projection as two_sided
from tests.helpers import multiworker
from tests.references import lordo_reference as ref
from tests.references import two_sided_reference as two_ref

NUM_WORKERS = 4
STEPS = 12
SYNC_EVERY = 3
LR = 0.02
RTOL = 1e-4
MOVING_TARGET = {"switch_at": 5, "spectrum": (2.0, 1.0, 0.5, 0.25)}
MOVING_TARGET["spectrum_after"] = (6.0, 3.0, 1.5, 0.5)

# (id, (p, q), rank, data seed, options); "randomized-full-width" sketches all
# min(p, q) = 8 columns (r + oversample >= 8), where the randomized SVD is exact.
CASES = [
  ("svd-rotate", (12, 8), 2, 8, {}),
  ("svd-wide-ef", (8, 12), 2, 5, {"error_feedback": True}),
  ("svd-keep-wd", (12, 8), 2, 9, {"transport": "keep", "weight_decay": 0.1}),
  ("svd-reset-omega-mu", (8, 12), 2, 3, {"transport": "reset", "omega": 0.5, "mu": 2.0}),
  ("svd-rank3-moments2", (12, 8), 3, 6, {"sync_moments_every": 2}),
  ("randomized-full-width", (12, 8), 2, 8, {"projection": "randomized_svd", "oversample": 6}),
]
REFERENCE_OPTIONS = ("error_feedback", "transport", "weight_decay", "omega", "mu")


def _problem(shape, seed):
  p, q = shape
  data = ref.make_regression(p, q, NUM_WORKERS, STEPS, seed=seed, **MOVING_TARGET)
  return ref.initial_params(p, q, seed), data["x"], data["y"]


def _config(rank, options):
  kept = {k: v for k, v in options.items() if k in (*REFERENCE_OPTIONS, "sync_moments_every")}
  return ref.Config(learning_rate=LR, rank=rank, sync_every=SYNC_EVERY, **kept)


def _relative_error(got, want, start):
  return np.max(np.abs(got - want)) / max(np.max(np.abs(want - start)), 1e-12)


def _assert_well_conditioned(diagnostics):
  for d in diagnostics:
    assert d["min_gap"] > 0.02 and d["sign_margin"] > 0.01, d


@pytest.mark.parametrize(
  ("shape", "rank", "seed", "options"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_lordo_two_sided_matches_the_reference(shape, rank, seed, options):
  params, x, y = _problem(shape, seed)
  reference, trajectory = ref.run(_config(rank, options), params, x, y, two_ref.TwoSidedReference)
  _assert_well_conditioned(reference.diagnostics)

  tx = lordo_jax.lordo(
    LR, rank=rank, sync_every=SYNC_EVERY, axis_name="workers", two_sided=True, **options
  )
  workers = multiworker.Workers(tx, params, NUM_WORKERS)
  for t, want in enumerate(trajectory, start=1):
    workers.step(x[t - 1], y[t - 1])
    basis = lordo_jax.projections(workers.worker_state(0))["w"]
    for got, expected in zip(basis, want["bases"]["w"], strict=True):
      np.testing.assert_allclose(np.asarray(got, np.float64), expected, atol=RTOL)
    for m, got in enumerate(workers.worker_params()):
      for leaf in ("w", "b"):
        err = _relative_error(got[leaf], want["params"][m][leaf], params[leaf])
        assert err < RTOL, f"step {t}, worker {m}, leaf {leaf}: rel err {err:.2e}"
  moments = workers.worker_state(0).inner_state
  mu = jax.tree.leaves(lordo_jax.round._moment_trees.moment_tree(moments, "mu"))
  assert (rank, rank) in [m.shape for m in mu]


# Each option changes the reference's run by far more than the tolerance, so the
# comparison above would catch a package that ignored it.
@pytest.mark.parametrize(
  "change",
  [{"transport": "keep"}, {"transport": "reset"}, {"error_feedback": True}, {"omega": 0.5}],
  ids=str,
)
def test_options_change_the_two_sided_reference(change):
  params, x, y = _problem((12, 8), 8)
  _, a = ref.run(_config(2, {}), params, x, y, two_ref.TwoSidedReference)
  _, b = ref.run(_config(2, change), params, x, y, two_ref.TwoSidedReference)
  assert _relative_error(b[-1]["params"][0]["w"], a[-1]["params"][0]["w"], params["w"]) > 20 * RTOL


def test_two_sided_differs_from_one_sided():
  params, x, y = _problem((12, 8), 8)
  _, a = ref.run(_config(2, {}), params, x, y, two_ref.TwoSidedReference)
  _, b = ref.run(_config(2, {}), params, x, y)
  assert _relative_error(b[-1]["params"][0]["w"], a[-1]["params"][0]["w"], params["w"]) > 20 * RTOL


REFRESH_EVERY = 4


@pytest.mark.parametrize("communicate", ["full", "projected"])
def test_low_rank_ddp_two_sided_matches_the_reference(communicate):
  params, x, y = _problem((12, 8), 14)
  # A refresh from the step's own gradient makes its core U^T G V diagonal: the
  # off-diagonal entries are float32 rounding (1e-7 of G), which Adam's first step
  # divides by sqrt(v) + eps ~ their own size. eps = 1e-2 keeps that rounding far
  # below the tolerance; a float64 reference would otherwise see 0 where float32
  # sees a unit step.
  cfg = dataclasses.replace(
    _config(2, {"weight_decay": 0.01, "transport": "rotate", "omega": 1.0}), eps=1e-2
  )
  trajectory, diagnostics = two_ref.run_low_rank_ddp(cfg, params, x, y, REFRESH_EVERY)
  _assert_well_conditioned(diagnostics)
  tx = lordo_jax.low_rank_ddp(
    LR,
    rank=2,
    refresh_every=REFRESH_EVERY,
    axis_name="workers",
    communicate=communicate,
    weight_decay=0.01,
    transport="rotate",
    eps=1e-2,
    two_sided=True,
  )
  workers = multiworker.Workers(tx, params, NUM_WORKERS)
  for t, want in enumerate(trajectory, start=1):
    workers.step(x[t - 1], y[t - 1])
    for m, got in enumerate(workers.worker_params()):
      for leaf in ("w", "b"):
        err = _relative_error(got[leaf], want[leaf], params[leaf])
        assert err < RTOL, f"step {t}, worker {m}, leaf {leaf}: rel err {err:.2e}"


# --- the randomized SVD refresh


def test_a_non_finite_refresh_keeps_the_old_bases():
  previous = two_sided.random_basis(jax.random.key(0), 6, 5, 2)
  x = jnp.full((6, 5), jnp.nan)
  static = dict(static_argnums=(2, 3), static_argnames=("oversample", "power_iterations"))
  compute = jax.jit(two_sided.compute_basis, **static)
  for method in two_sided.METHODS:
    basis, ok = compute(x, previous, method, 2, jax.random.key(1), oversample=2, power_iterations=1)
    assert not bool(ok)
    np.testing.assert_array_equal(basis.left, previous.left)
    np.testing.assert_array_equal(basis.right, previous.right)


def test_two_sided_state_is_smaller_and_its_moments_are_r_by_r():
  params = {"w": jnp.zeros((64, 48)), "b": jnp.zeros(48)}
  one = lordo_jax.lordo(1e-2, rank=4, sync_every=4).init(params)
  two = lordo_jax.lordo(1e-2, rank=4, sync_every=4, two_sided=True).init(params)
  moments = two.inner_state
  mu = [m.shape for m in jax.tree.leaves(lordo_jax.round._moment_trees.moment_tree(moments, "mu"))]
  assert (4, 4) in mu and (4, 48) not in mu
  assert lordo_jax.state_bytes(two)["device"] < lordo_jax.state_bytes(one)["device"]


@pytest.mark.parametrize(
  ("kwargs", "pattern"),
  [
    ({"projection": "qr"}, r"projection='qr'.*'dct', 'randomized_svd'"),
    ({"two_sided": True, "projection": "dct"}, r"projection='dct'.*'svd', 'randomized_svd'"),
    ({"two_sided": True, "side": "left"}, r"side='left'.*two_sided=True.*'auto'"),
    ({"two_sided": True, "full_rank_scale": "vector"}, r"full_rank_scale='vector'.*'scalar'"),
    ({"two_sided": True, "oversample": -1}, r"oversample=-1.*an int >= 0"),
    ({"two_sided": True, "power_iterations": 1.5}, r"power_iterations=1.5.*an int >= 0"),
  ],
)
def test_bad_two_sided_arguments_say_what_is_accepted(kwargs, pattern):
  with pytest.raises(ValueError, match=pattern):
    lordo_jax.lordo(1e-2, rank=2, sync_every=4, **kwargs)
  with pytest.raises(ValueError, match=pattern):
    lordo_jax.low_rank_ddp(1e-2, rank=2, **kwargs)


def test_two_sided_with_optax_chain_and_bfloat16_params():
  params = {"w": jnp.ones((16, 12), jnp.bfloat16)}
  tx = optax.chain(
    optax.clip_by_global_norm(1.0),
    lordo_jax.lordo(1e-2, rank=2, sync_every=2, two_sided=True, projection="randomized_svd"),
  )
  state, update = tx.init(params), jax.jit(tx.update)
  for i in range(4):
    grads = {"w": jax.random.normal(jax.random.key(i), (16, 12), jnp.bfloat16)}
    updates, state = update(grads, state, params)
    params = optax.apply_updates(params, updates)
  assert updates["w"].dtype == jnp.bfloat16
  basis = lordo_jax.projections(state)["w"]
  assert basis.left.dtype == basis.right.dtype == jnp.float32
  assert bool(jnp.all(jnp.isfinite(params["w"].astype(jnp.float32))))
