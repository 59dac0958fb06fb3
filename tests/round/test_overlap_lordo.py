"""LoRDO with a message in flight against its float64 reference
(``tests/references/lordo_overlap_reference.py``): on 4 workers, every merge, the bases refreshed
from the landed mean and the corrected moments carried into them (MATH.md §9); and with
the leaves in fragments that freeze at staggered steps and land tau steps later, each
on its own leaves (Streaming DiLoCo)."""

import functools

import numpy as np
import pytest

import lordo_jax
from tests.helpers import multiworker
from tests.references import lordo_overlap_reference as overlap_ref
from tests.references import lordo_reference as ref

WORKERS, STEPS, K, LR, RANK, RTOL = 4, 12, 3, 0.02, 2, 1e-4
FRAGMENT_STEPS = 16  # every fragment lands at least twice in the cases below
MOVING_TARGET = {"switch_at": 5, "spectrum": (2.0, 1.0, 0.5, 0.25)}
MOVING_TARGET["spectrum_after"] = (6.0, 3.0, 1.5, 0.5)


def _run_reference(cfg, overlap, steps, labels=None, compression=None):
  """The data, the initial params, and the reference's workers and trajectory on them."""
  p, q = (12, 8)
  data = ref.make_regression(p, q, WORKERS, steps, seed=8, basis="random", **MOVING_TARGET)
  params = ref.initial_params(p, q, 8)
  build = functools.partial(
    overlap_ref.InFlight, overlap=overlap, fragments=labels, compression=compression
  )
  reference, trajectory = ref.run(cfg, params, data["x"], data["y"], build)
  return data, params, reference, trajectory


def _overlap(tau, merge, alpha) -> overlap_ref.Overlap:
  """The reference's overlap as ``lordo`` takes it by default: a whole round merged eager
  with its averaging outer ``"damped"`` (MATH.md §9), any other as it is."""
  damped = tau == "round" and merge == "eager"
  return overlap_ref.Overlap(tau, merge, alpha, "damped" if damped else "none")


def _lordo(sync_every, tau, merge, alpha, **options):
  """``lordo_jax.lordo`` at the tests' rate and rank on the workers, with ``overlap=tau``,
  refreshing by SVD as the reference does."""
  return lordo_jax.lordo(
    LR,
    rank=RANK,
    sync_every=sync_every,
    axis_name="workers",
    overlap=tau,
    merge=merge,
    merge_alpha=alpha,
    **({"projection": "svd"} | options),
  )


def _moved(params, trajectory) -> dict:
  """How far each leaf moves over the run: the scale of the errors."""
  return {
    leaf: max(
      np.max(np.abs(w["params"][m][leaf] - params[leaf]))
      for w in trajectory
      for m in range(WORKERS)
    )
    for leaf in ("w", "b")
  }


def _assert_matches(tx, params, data, trajectory):
  """Step t of ``tx`` on the workers against the reference: the basis of w within RTOL,
  every worker's params within RTOL of how far the leaf moves over the run."""
  workers = multiworker.Workers(tx, params, WORKERS)
  moved = _moved(params, trajectory)
  for t, want in enumerate(trajectory, start=1):
    workers.step(data["x"][t - 1], data["y"][t - 1])
    np.testing.assert_allclose(
      np.asarray(lordo_jax.projections(workers.worker_state(0))["w"], np.float64),
      want["bases"]["w"],
      atol=RTOL,
      err_msg=f"projection of w after step {t}",
    )
    for m, got in enumerate(workers.worker_params()):
      for leaf in ("w", "b"):
        err = np.max(np.abs(got[leaf] - want["params"][m][leaf])) / moved[leaf]
        assert err < RTOL, f"step {t}, worker {m}, leaf {leaf}: rel err {err:.2e}"
  return workers


@pytest.mark.parametrize(
  "tau, merge, alpha, options",
  [
    (1, "rebase", 0.0, {}),
    (2, "rebase", 0.0, {"error_feedback": True}),
    (K - 1, "streaming", 0.5, {"side": "right"}),
    (1, "streaming", 0.0, {"error_feedback": True, "full_rank_scale": "vector"}),
    # ("round", "eager") at its default correction: test_delay_correction.py's "damped".
    ("round", "delayed", 0.0, {"error_feedback": True}),
    ("round", "rebase", 0.0, {}),
    ("round", "streaming", 0.5, {"side": "right"}),
  ],
)
def test_lordo_in_flight_matches_the_reference(tau, merge, alpha, options):
  cfg = ref.Config(learning_rate=LR, rank=RANK, sync_every=K, **options)
  data, params, reference, trajectory = _run_reference(cfg, _overlap(tau, merge, alpha), STEPS)
  refreshes = [d for d in reference.diagnostics if d["t"] > 1]
  assert len(refreshes) >= 2  # bases did move at landings: the comparison below could fail
  _assert_matches(_lordo(K, tau, merge, alpha, **options), params, data, trajectory)


@pytest.mark.parametrize(
  "tau, merge, alpha, sync_every, labels, options",
  [
    (1, "rebase", 0.0, 4, {"w": 0, "b": 1}, {}),
    (2, "streaming", 0.5, 6, {"w": 0, "b": 1}, {"error_feedback": True}),
    (1, "rebase", 0.0, 6, {"w": 1, "b": 0}, {}),
    (2, "rebase", 0.0, 6, {"w": 1, "b": 0}, {"error_feedback": True, "side": "right"}),
    (1, "streaming", 0.0, 4, {"w": 0, "b": 1}, {"full_rank_scale": "vector"}),
  ],
)
def test_lordo_fragments_in_flight_match_the_reference(
  tau, merge, alpha, sync_every, labels, options
):
  """Fragment f freezes at t % K == ((f + 1) K // F) % K and lands tau steps later,
  on its leaves only: its anchor, params, moments and (for w) basis."""
  cfg = ref.Config(learning_rate=LR, rank=RANK, sync_every=sync_every, **options)
  data, params, reference, trajectory = _run_reference(
    cfg, overlap_ref.Overlap(tau, merge, alpha), FRAGMENT_STEPS, labels
  )
  for f in set(labels.values()):  # every fragment landed at least twice
    assert sum(g == f for _, g in reference.landings) >= 2, reference.landings
  refreshes = {d["t"] for d in reference.diagnostics if d["t"] > 1}
  assert refreshes == {t for t, f in reference.landings if f == labels["w"]}
  fragments = lambda params: {leaf: labels[leaf] for leaf in params}  # noqa: E731
  tx = _lordo(sync_every, tau, merge, alpha, fragments=fragments, **options)
  _assert_matches(tx, params, data, trajectory)


@pytest.mark.parametrize(
  "tau, merge, compression, labels",
  [
    ("round", "eager", "int8", None),
    ("round", "delayed", "bfloat16", None),
    (2, "rebase", "int8", None),
    (1, "streaming", "int8", {"w": 0, "b": 1}),
  ],
)
def test_lordo_compressed_in_flight_matches_the_reference(tau, merge, compression, labels):
  """LoRDO's message sent in compressed chunks (the pseudo-gradient with its residual
  per chunk, the low-rank and full-rank moments in bfloat16) against the reference's
  chunks and codecs, the bases refreshed from the decoded mean; the residuals row by
  row at the end; and the codec matters: the plain reference is far from it."""
  sync_every = 4 if labels else K
  steps = FRAGMENT_STEPS if labels else STEPS
  cfg = ref.Config(learning_rate=LR, rank=RANK, sync_every=sync_every)
  alpha = 0.5 if merge == "streaming" else 0.0
  overlap = _overlap(tau, merge, alpha)
  data, params, reference, trajectory = _run_reference(cfg, overlap, steps, labels, compression)
  _, _, _, plain = _run_reference(cfg, overlap, steps, labels)
  moved = _moved(params, trajectory)
  apart = max(
    np.max(np.abs(a["params"][m][leaf] - b["params"][m][leaf])) / moved[leaf]
    for a, b in zip(trajectory, plain, strict=True)
    for m in range(WORKERS)
    for leaf in ("w", "b")
  )
  assert apart > 10 * RTOL, apart  # the codec's model is what is tested
  fragments = {"fragments": lambda p: {leaf: labels[leaf] for leaf in p}} if labels else {}
  tx = _lordo(sync_every, tau, merge, alpha, compression=compression, **fragments)
  workers = _assert_matches(tx, params, data, trajectory)
  residual = np.asarray(workers.worker_state(0).in_flight.residual)
  assert np.abs(reference.residuals[0]).max() > 1e-4  # the encodings lost something
  np.testing.assert_allclose(residual, reference.residuals[0], rtol=0, atol=1e-5)


def test_one_workers_eager_reference_is_the_blocking_reference():
  """The reference's eager round with one worker is its blocking round (MATH.md §9):
  parameters, moments and bases, every step."""
  cfg = ref.Config(learning_rate=LR, rank=RANK, sync_every=K)
  data = ref.make_regression(12, 8, 1, STEPS, seed=8, basis="random", **MOVING_TARGET)
  params = ref.initial_params(12, 8, 8)
  eager = functools.partial(overlap_ref.InFlight, overlap=overlap_ref.Overlap("round", "eager"))
  _, blocking_run = ref.run(cfg, params, data["x"], data["y"])
  _, eager_run = ref.run(cfg, params, data["x"], data["y"], eager)
  for t, (want, got) in enumerate(zip(blocking_run, eager_run, strict=True), start=1):
    np.testing.assert_allclose(got["bases"]["w"], want["bases"]["w"], atol=1e-10, err_msg=f"{t}")
    for leaf in ("w", "b"):
      np.testing.assert_allclose(
        got["params"][0][leaf], want["params"][0][leaf], atol=1e-10, err_msg=f"step {t}"
      )
