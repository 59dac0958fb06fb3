"""The subspace-iteration strategy (``lordo_jax/local/bases/subspace_iteration.py``).

Its refresh is checked against the iteration written in NumPy (float64) from the
docstring of ``iterate``, its convergence against the bound of Golub and Van Loan (Theorem
8.2.2), and its first basis against NumPy's SVD. Tolerances: float32 bases agree with
the float64 ones to ``atol=1e-5`` (QR and SVD of well-separated matrices); angles
carry a float32 floor of ``1e-5`` radians.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lordo_jax.local import bases as bases
from lordo_jax.local.bases import subspace_iteration
from tests.references import basis_numpy as ref

RANK = 2


def make(p, q, iterations=2, side="auto"):
  options = bases.Options(rank=RANK, side=side, subspace_iterations=iterations)
  return subspace_iteration.method(options).strategy(p, q)


@pytest.mark.parametrize(
  "p, q, side, left",
  [(14, 6, "auto", True), (6, 14, "auto", False), (6, 14, "left", True), (14, 6, "right", False)],
)
def test_side_shapes_and_init(p, q, side, left):
  s = make(p, q, side=side)
  assert s.side == ("left" if left else "right")
  assert s.coordinates_shape == ((RANK, q) if left else (p, RANK))
  np.testing.assert_array_equal(s.init(None), np.zeros((p if left else q, RANK)))


@pytest.mark.parametrize("iterations", [1, 3])
@pytest.mark.parametrize(
  "p, q, side, left", [(14, 6, "auto", True), (6, 14, "auto", False), (14, 6, "right", False)]
)
def test_a_refresh_is_the_iteration_from_the_previous_basis(p, q, side, left, iterations):
  s = make(p, q, iterations, side)
  x = ref.separated(p, q, RANK, seed=p + q, top=(10.0, 8.0), tail=(6.0, 0.1))
  previous = s.init(jax.random.key(1))
  basis, ok = s.compute(jnp.asarray(x, jnp.float32), previous, None)
  assert bool(ok) and basis.dtype == jnp.float32
  np.testing.assert_allclose(basis, ref.subspace_iterate(x, previous, iterations, left), atol=1e-5)
  # Not yet the SVD: the gap is small, so the previous basis still shows.
  exact = ref.top_left(x, RANK) if left else ref.top_right(x, RANK)
  assert ref.largest_angle(basis, exact) > 1e-3


@pytest.mark.parametrize("p, q", [(30, 12), (12, 30)])
def test_warm_starts_converge_to_the_svd_subspace_at_the_gap_rate(p, q):
  """tan(angle_k) <= (s_{r+1}/s_r)^(2k) tan(angle_0) for the largest principal angle."""
  top, tail = (10.0, 8.0), (6.0, 0.1)
  x = ref.separated(p, q, RANK, seed=3, top=top, tail=tail)
  exact = ref.top_left(x, RANK) if p >= q else ref.top_right(x, RANK)
  start = make(p, q).init(jax.random.key(2))
  angle0 = ref.largest_angle(start, exact)
  angles = []
  for k in (1, 2, 4, 8):
    s = make(p, q, k)
    basis, _ = s.compute(jnp.asarray(x, jnp.float32), start, None)
    angles.append(ref.largest_angle(basis, exact))
    bound = np.arctan((tail[0] / top[1]) ** (2 * k) * np.tan(angle0))
    assert angles[-1] <= bound + 1e-5, (k, angles[-1], bound)
  assert all(b < a for a, b in zip(angles[:-1], angles[1:], strict=True)), angles
  assert angles[-1] < 0.1 * angles[0], angles


def test_warm_starting_from_the_svd_subspace_stays_there():
  x = ref.separated(20, 8, RANK, seed=4)
  s = make(20, 8, 2)
  exact = ref.top_left(x, RANK)
  rotated = exact @ np.array([[0.6, -0.8], [0.8, 0.6]])  # the same span, another basis
  basis, ok = s.compute(jnp.asarray(x, jnp.float32), jnp.asarray(rotated, jnp.float32), None)
  assert bool(ok)
  assert ref.largest_angle(basis, exact) < 1e-5  # the span (its basis is the QR's)
  np.testing.assert_allclose(basis, ref.subspace_iterate(x, rotated, 2, True), atol=1e-5)


@pytest.mark.parametrize("p, q, left", [(14, 6, True), (6, 14, False)])
def test_first_is_an_exact_svd_whatever_the_previous_basis(p, q, left):
  s = make(p, q, 1)
  assert s.exact is not None
  x = ref.separated(p, q, RANK, seed=5, top=(10.0, 8.0), tail=(6.0, 0.1))
  exact = ref.top_left(x, RANK) if left else ref.top_right(x, RANK)
  for previous in (s.init(None), s.init(jax.random.key(3))):
    basis, ok = s.exact(jnp.asarray(x, jnp.float32), previous, None)
    assert bool(ok)
    np.testing.assert_allclose(basis, exact, atol=1e-5)
  iterated, _ = s.compute(jnp.asarray(x, jnp.float32), s.init(jax.random.key(3)), None)
  assert ref.largest_angle(iterated, exact) > 1e-3  # compute alone is not the SVD


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_matrix_keeps_the_previous_basis_in_compute_and_first(bad):
  s = make(14, 6)
  previous = s.init(jax.random.key(4))
  x = ref.separated(14, 6, RANK, seed=6)
  x[3, 1] = bad
  for refresh in (s.compute, s.exact):
    basis, ok = refresh(jnp.asarray(x, jnp.float32), previous, None)
    assert not bool(ok)
    np.testing.assert_array_equal(basis, previous)


def test_products_are_the_one_sided_ones():
  """project, unproject, overlap and carry: Q^T A, Q c, Q_new^T Q_old, R c (left)."""
  s = make(9, 4)
  rng = np.random.default_rng(0)
  new = s.init(jax.random.key(5))
  old = s.init(jax.random.key(6))
  q_new, q_old = np.asarray(new, np.float64), np.asarray(old, np.float64)
  a = rng.standard_normal((9, 4)).astype(np.float32)
  c = rng.standard_normal((RANK, 4)).astype(np.float32)
  tol = dict(rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(s.project(s.dense(new), a), q_new.T @ a, **tol)
  np.testing.assert_allclose(s.unproject(s.dense(new), c), q_new @ c, **tol)
  rotation = s.change_of_basis(new, old)
  np.testing.assert_allclose(rotation, q_new.T @ q_old, **tol)
  np.testing.assert_allclose(s.carry(rotation, c), (q_new.T @ q_old) @ c, **tol)
