"""``lordo_jax.lordo`` agrees with the independent NumPy reference (MATH.md §3-5).

Four workers with different data run the package (float32, one jitted
``shard_map`` step) and the reference (float64) side by side; after every step the
per-worker parameters and the current projections must agree to 1e-4, relative to
how far the parameters have moved. The cases cover every value of every option
the reference models at least once.
"""

import numpy as np
import pytest

import lordo_jax
from tests.helpers import multiworker
from tests.references import lordo_reference as ref

NUM_WORKERS = 4
STEPS = 12
SYNC_EVERY = 3  # four syncs in twelve steps
LR = 0.02
RTOL = 1e-4
MOVING_TARGET = {
  "switch_at": 5,
  "spectrum": (2.0, 1.0, 0.5, 0.25),
  "spectrum_after": (6.0, 3.0, 1.5, 0.5),
}

# (id, (p, q), rank, data seed, options). Tall (12, 8) is left under "auto",
# wide (8, 12) is right. Seeds picked for well-separated singular values, signs
# and DCT scores (see assert_well_conditioned).
CASES = [
  ("svd-left", (12, 8), 2, 8, {}),
  ("svd-right-ef-vector", (8, 12), 2, 5, {"error_feedback": True, "full_rank_scale": "vector"}),
  (
    "svd-forced-right-keep-wd",
    (12, 8),
    2,
    9,
    {"side": "right", "transport": "keep", "weight_decay": 0.1},
  ),
  (
    "svd-forced-left-reset-omega-mu",
    (8, 12),
    2,
    3,
    {"side": "left", "transport": "reset", "omega": 0.5, "mu": 2.0},
  ),
  (
    "subspace-left-rank3-ef-moments2",
    (12, 8),
    3,
    6,
    {"projection": "subspace_iteration", "error_feedback": True, "sync_moments_every": 2},
  ),
  (
    "subspace-right-keep-vector",
    (8, 12),
    2,
    7,
    {
      "projection": "subspace_iteration",
      "transport": "keep",
      "full_rank_scale": "vector",
      "subspace_iterations": 3,
    },
  ),
  (
    "dct-left-ef-vector",
    (12, 8),
    2,
    4,
    {"projection": "dct", "error_feedback": True, "full_rank_scale": "vector"},
  ),
  (
    "dct-right-reset-wd",
    (8, 12),
    2,
    7,
    {"projection": "dct", "transport": "reset", "weight_decay": 0.05},
  ),
  (
    "dct-left-keep-moments2",
    (12, 8),
    2,
    4,
    {"projection": "dct", "transport": "keep", "sync_moments_every": 2, "omega": 0.8},
  ),
  # The LoRDO authors' variants (docs/FIDELITY.md, "The paper's variants as options"),
  # one per case.
  (
    "svd-left-ef-error-fed",
    (12, 8),
    2,
    8,
    {"error_feedback": True, "full_rank_numerator": "error_fed"},
  ),
  ("svd-right-qh-nu", (8, 12), 2, 5, {"qh_nu": 0.8}),
  ("svd-left-full-rank-nu", (12, 8), 2, 8, {"full_rank_nu": 0.8}),
  ("svd-left-momentum-term", (12, 8), 2, 8, {"low_rank_term": "momentum"}),
  ("svd-galore-std-tall", (12, 8), 2, 8, {"side": "galore_std"}),
  ("dct-galore-std-wide", (8, 12), 2, 7, {"side": "galore_std", "projection": "dct"}),
]


def _problem(shape, seed, options):
  """Initial params and per-step data; the target moves at step 5.

  With ``dct`` the targets are built from DCT columns so the kept frequencies
  change over the run; otherwise from random directions (DCT columns come in
  +/- pairs of equal magnitude, a tie for the canonical SVD sign).
  """
  p, q = shape
  basis = "dct" if options.get("projection") == "dct" else "random"
  data = ref.make_regression(p, q, NUM_WORKERS, STEPS, seed=seed, basis=basis, **MOVING_TARGET)
  return ref.initial_params(p, q, seed), data["x"], data["y"]


def _reference(shape, rank, seed, options):
  params, x, y = _problem(shape, seed, options)
  cfg = ref.Config(learning_rate=LR, rank=rank, sync_every=SYNC_EVERY, **options)
  return ref.run(cfg, params, x, y)


def assert_well_conditioned(diagnostics):
  """The reference's discrete choices are far from ties float32 could flip."""
  for d in diagnostics:
    if "min_gap" in d:
      assert d["min_gap"] > 0.02, d
    if "sign_margin" in d:
      assert d["sign_margin"] > 0.01, d
    if "score_gap" in d:
      assert d["score_gap"] > 0.01, d
    if "cond" in d:
      assert d["cond"] < 100, d


def _relative_error(got, want, start):
  """max |got - want| / max |want - start|: error relative to the displacement."""
  scale = np.max(np.abs(want - start))
  return np.max(np.abs(got - want)) / max(scale, 1e-12)


@pytest.mark.parametrize(
  ("shape", "rank", "seed", "options"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_matches_reference(shape, rank, seed, options):
  params, x, y = _problem(shape, seed, options)
  reference, trajectory = _reference(shape, rank, seed, options)
  assert_well_conditioned(reference.diagnostics)

  # The reference's refresh is the SVD unless a case names another (lordo's default is
  # subspace_iteration, which its own cases check).
  options = {"projection": "svd", **options}
  tx = lordo_jax.lordo(LR, rank=rank, sync_every=SYNC_EVERY, axis_name="workers", **options)
  workers = multiworker.Workers(tx, params, NUM_WORKERS)
  for t, want in enumerate(trajectory, start=1):
    workers.step(x[t - 1], y[t - 1])
    bases = lordo_jax.projections(workers.worker_state(0))
    assert bases["b"] is None
    np.testing.assert_allclose(
      np.asarray(bases["w"], np.float64),
      want["bases"]["w"],
      atol=RTOL,
      err_msg=f"projection of w after step {t}",
    )
    for m, got in enumerate(workers.worker_params()):
      for leaf in ("w", "b"):
        err = _relative_error(got[leaf], want["params"][m][leaf], params[leaf])
        assert err < RTOL, f"step {t}, worker {m}, leaf {leaf}: rel err {err:.2e}"


def test_cases_cover_every_option():
  """Every value of every option appears in at least one case."""
  seen = {}
  for _, shape, rank, _, options in CASES:
    seen.setdefault("rank", set()).add(rank)
    side = options.get("side", "auto")
    if side == "auto":
      side = ref.resolve_side(shape, "auto")
    seen.setdefault("side", set()).add(side)
    for key, value in options.items():
      if key != "side":
        seen.setdefault(key, set()).add(value)
  assert {"left", "right"} <= seen["side"]
  assert seen["projection"] == {"subspace_iteration", "dct"}  # svd: the reference's default
  assert seen["transport"] == {"keep", "reset"}  # rotate is the default
  assert seen["error_feedback"] == {True}
  assert seen["full_rank_scale"] == {"vector"}
  assert seen["sync_moments_every"] == {2}
  assert seen["weight_decay"] and seen["omega"] and seen["mu"]
  assert "galore_std" in seen["side"]  # on a tall (right) and a wide (left) matrix
  assert seen["full_rank_numerator"] == {"error_fed"}  # "gradient" is the default
  assert seen["low_rank_term"] == {"momentum"}  # "adam" is the default
  assert seen["qh_nu"] and seen["full_rank_nu"]


# One option changed at a time from a base case, on the reference alone: each
# change moves the trajectory well beyond the tolerance (20x), so the comparison above
# would catch a package that ignored or mis-implemented it.
DISTINGUISH = [
  ("svd-left", {"transport": "keep"}),
  ("svd-left", {"transport": "reset"}),
  ("svd-left", {"error_feedback": True}),
  ("svd-left", {"full_rank_scale": "vector"}),
  ("svd-left", {"side": "right"}),
  ("svd-left", {"projection": "subspace_iteration"}),
  ("svd-left", {"projection": "dct"}),
  ("svd-left", {"sync_moments_every": 2}),
  ("svd-left", {"weight_decay": 0.1}),
  ("svd-left", {"mu": 2.0}),
  ("svd-left", {"omega": 0.5}),
  ("subspace-right-keep-vector", {"subspace_iterations": 1}),
  ("dct-left-ef-vector", {"error_feedback": False}),
  ("svd-left-ef-error-fed", {"full_rank_numerator": "gradient"}),
  ("svd-left", {"qh_nu": 0.8}),
  ("svd-left", {"full_rank_nu": 0.8}),  # the bias b, on the full-rank path, moves
  ("svd-left", {"low_rank_term": "momentum"}),
  ("svd-left", {"side": "galore_std"}),
  ("svd-right-ef-vector", {"side": "galore_std"}),
]


@pytest.mark.parametrize(
  ("base", "change"),
  DISTINGUISH,
  ids=[f"{b}-{'-'.join(map(str, c.items()))}" for b, c in DISTINGUISH],
)
def test_options_change_the_reference(base, change):
  _, shape, rank, seed, options = next(c for c in CASES if c[0] == base)
  params, _, _ = _problem(shape, seed, options)
  _, a = _reference(shape, rank, seed, options)
  _, b = _reference(shape, rank, seed, {**options, **change})
  err = max(
    _relative_error(b[-1]["params"][0][leaf], a[-1]["params"][0][leaf], params[leaf])
    for leaf in ("w", "b")
  )
  assert err > 20 * RTOL
