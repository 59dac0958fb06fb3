"""The projection refresh turns the subspace only through the full-rank term.

MATH.md §1 and §6: with omega = 1 ("global projection only") every local update lies
in span(Q), so the averaged pseudo-gradient does too and every refresh returns the
same subspace: the trajectory is locked in. With omega = 0.7 the full-rank term
puts components outside span(Q) into the pseudo-gradient and the subspace moves.
The problem (4 workers, rank-4 target plus a different full-rank perturbation
per worker) has gradients far outside any rank-2 subspace.
"""

import itertools

import numpy as np
import pytest

import lordo_jax
from tests.helpers import multiworker
from tests.references import lordo_reference as ref

NUM_WORKERS = 4
STEPS = 12
SYNC_EVERY = 3
RANK = 2


def largest_principal_angle(a, b):
  """Largest principal angle (radians) between span(a) and span(b), orthonormal.

  Computed from the sine, ||(I - B B^T) A||_2, in float64: accurate for tiny
  angles, unlike arccos of the cosines.
  """
  a = np.asarray(a, np.float64)
  b = np.asarray(b, np.float64)
  residual = a - b @ (b.T @ a)
  return float(np.arcsin(min(1.0, np.linalg.norm(residual, 2))))


def _angles_between_refreshes(omega, projection, shape):
  """Angles between the initial basis and the basis after each sync, in turn."""
  p, q = shape
  data = ref.make_regression(p, q, NUM_WORKERS, STEPS, seed=0)
  tx = lordo_jax.lordo(
    0.02, rank=RANK, sync_every=SYNC_EVERY, omega=omega, projection=projection, axis_name="workers"
  )
  workers = multiworker.Workers(tx, ref.initial_params(p, q), NUM_WORKERS)
  bases = []
  for t in range(1, STEPS + 1):
    workers.step(data["x"][t - 1], data["y"][t - 1])
    if t == 1 or t % SYNC_EVERY == 0:
      basis = lordo_jax.projections(workers.worker_state(0))["w"]
      side = p if ref.resolve_side(shape, "auto") == "left" else q
      assert basis.shape == (side, RANK)
      bases.append(basis)
  return [largest_principal_angle(a, b) for a, b in itertools.pairwise(bases)]


CASES = [("svd", (12, 8)), ("subspace_iteration", (8, 12))]


@pytest.mark.parametrize(("projection", "shape"), CASES)
def test_omega_one_locks_the_subspace(projection, shape):
  angles = _angles_between_refreshes(1.0, projection, shape)
  assert len(angles) == STEPS // SYNC_EVERY
  assert max(angles) < 1e-4, angles


@pytest.mark.parametrize(("projection", "shape"), CASES)
def test_full_rank_term_turns_the_subspace(projection, shape):
  angles = _angles_between_refreshes(0.7, projection, shape)
  assert len(angles) == STEPS // SYNC_EVERY
  # The reference turns by 0.09 to 0.25 rad at each refresh on this problem.
  assert min(angles) > 0.03, angles
