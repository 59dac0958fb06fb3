"""``lordo_jax.low_rank_ddp`` agrees with the NumPy reference's low-rank DDP (MATH.md §6).

Four workers with different data run the package (float32, one jitted ``shard_map``
step) and ``lordo_reference.run_low_rank_ddp`` (float64: §3's step on the workers' mean
gradient, the basis refreshed from it every T steps) side by side; after every step
each worker's parameters must agree to 1e-4, relative to how far they have moved, as
in ``test_reference.py``. The cases cover the LoRDO authors' baseline options of
``docs/FIDELITY.md`` (point 22: error feedback, rotated moments, QHAdam inside the
projection and on the full-rank path) and the other variants, each shown to move the
reference's trajectory well beyond the tolerance.
"""

import numpy as np
import pytest
from test_reference import MOVING_TARGET
from test_reference import assert_well_conditioned

import lordo_jax
from tests.helpers import multiworker
from tests.references import lordo_reference as ref

NUM_WORKERS = 4
STEPS = 12
REFRESH_EVERY = 3  # refreshes at steps 1, 4, 7 and 10
LR = 0.02
RTOL = 1e-4
# Options of low_rank_ddp that change what travels, not the iterates.
TRANSPORT_ONLY = ("communicate",)
# low_rank_ddp's defaults where they differ from lordo's (the reference's Config).
DEFAULTS = {"omega": 1.0, "transport": "keep"}

# (id, (p, q), data seed, options); rank 2. Tall (12, 8) is left under "auto".
CASES = [
  ("default-left", (12, 8), 8, {}),
  ("rotate-right", (8, 12), 5, {"transport": "rotate"}),
  (
    "ef-omega-error-fed",
    (12, 8),
    2,
    {"error_feedback": True, "omega": 0.7, "full_rank_numerator": "error_fed"},
  ),
  ("qh-nu", (12, 8), 8, {"qh_nu": 0.8}),
  ("qh-nu-projected", (8, 12), 5, {"qh_nu": 0.8, "communicate": "projected"}),
  ("full-rank-nu", (12, 8), 8, {"full_rank_nu": 0.8}),
  ("momentum-term", (12, 8), 8, {"low_rank_term": "momentum"}),
  ("galore-std-tall", (12, 8), 8, {"side": "galore_std"}),
  (
    "authors-baseline",
    (12, 8),
    8,
    {"error_feedback": True, "transport": "rotate", "qh_nu": 0.94, "full_rank_nu": 0.94},
  ),
]


def _problem(shape, seed):
  p, q = shape
  data = ref.make_regression(p, q, NUM_WORKERS, STEPS, seed=seed, **MOVING_TARGET)
  return ref.initial_params(p, q, seed), data["x"], data["y"]


def _reference(shape, seed, options):
  params, x, y = _problem(shape, seed)
  modelled = {k: v for k, v in options.items() if k not in TRANSPORT_ONLY}
  cfg = ref.Config(learning_rate=LR, rank=2, sync_every=1, **(DEFAULTS | modelled))
  return ref.run_low_rank_ddp(cfg, params, x, y, REFRESH_EVERY)


def _relative_error(got, want, start):
  """max |got - want| / max |want - start|: error relative to the displacement."""
  scale = np.max(np.abs(want - start))
  return np.max(np.abs(got - want)) / max(scale, 1e-12)


@pytest.mark.parametrize(
  ("shape", "seed", "options"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_matches_reference(shape, seed, options):
  params, x, y = _problem(shape, seed)
  trajectory, diagnostics = _reference(shape, seed, options)
  assert_well_conditioned(diagnostics)
  tx = lordo_jax.low_rank_ddp(
    LR, rank=2, refresh_every=REFRESH_EVERY, axis_name="workers", **options
  )
  workers = multiworker.Workers(tx, params, NUM_WORKERS)
  for t, want in enumerate(trajectory, start=1):
    workers.step(x[t - 1], y[t - 1])
    for m, got in enumerate(workers.worker_params()):
      for leaf in ("w", "b"):
        err = _relative_error(got[leaf], want[leaf], params[leaf])
        assert err < RTOL, f"step {t}, worker {m}, leaf {leaf}: rel err {err:.2e}"


# One option changed at a time from a case, on the reference alone: each moves the
# trajectory well beyond the tolerance (20x), so the comparison above would catch a
# package that ignored it.
DISTINGUISH = [
  ("default-left", {"transport": "rotate"}),
  ("ef-omega-error-fed", {"full_rank_numerator": "gradient"}),
  ("default-left", {"qh_nu": 0.8}),
  ("default-left", {"full_rank_nu": 0.8}),
  ("default-left", {"low_rank_term": "momentum"}),
  ("default-left", {"side": "galore_std"}),
  ("authors-baseline", {"qh_nu": 1.0}),
  ("authors-baseline", {"full_rank_nu": 1.0}),
]


@pytest.mark.parametrize(
  ("base", "change"),
  DISTINGUISH,
  ids=[f"{b}-{'-'.join(map(str, c.items()))}" for b, c in DISTINGUISH],
)
def test_options_change_the_reference(base, change):
  _, shape, seed, options = next(c for c in CASES if c[0] == base)
  params, _, _ = _problem(shape, seed)
  a, _ = _reference(shape, seed, options)
  b, _ = _reference(shape, seed, {**options, **change})
  err = max(_relative_error(b[-1][leaf], a[-1][leaf], params[leaf]) for leaf in ("w", "b"))
  assert err > 20 * RTOL
