"""ComputeProjection (MATH.md §5) against NumPy, and its guarantees."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lordo_jax.local import _projection as projection


def separated_matrix(n, q, rank, seed=0):
  """An n x q matrix whose top-``rank`` singular values are far above the rest."""
  rng = np.random.default_rng(seed)
  u, _ = np.linalg.qr(rng.normal(size=(n, n)))
  v, _ = np.linalg.qr(rng.normal(size=(q, q)))
  k = min(n, q)
  values = np.concatenate([np.linspace(10.0, 6.0, rank), np.linspace(1.0, 0.1, k - rank)])
  return (u[:, :k] * values) @ v[:, :k].T


def numpy_canonical(q):
  """MATH.md §5: flip each column so its largest-magnitude entry is positive."""
  q = q.copy()
  for j in range(q.shape[1]):
    if q[np.argmax(np.abs(q[:, j])), j] < 0:
      q[:, j] *= -1
  return q


def numpy_dct(n):
  i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
  c = np.where(j == 0, 1 / np.sqrt(2), 1.0)
  return np.sqrt(2 / n) * c * np.cos(np.pi * (i + 0.5) * j / n)


def test_svd_is_numpy_top_singular_vectors_with_canonical_signs():
  x = separated_matrix(20, 9, 3)
  basis, ok = projection.compute_projection(jnp.asarray(x), jnp.zeros((20, 3)), "svd", 3)
  u, _, _ = np.linalg.svd(x)
  np.testing.assert_allclose(basis, numpy_canonical(u[:, :3]), atol=1e-5)
  assert bool(ok)


def test_canonical_signs_make_the_largest_entry_positive():
  q = jax.random.normal(jax.random.key(1), (11, 4))
  fixed = np.asarray(projection.canonical_signs(q))
  rows = np.argmax(np.abs(fixed), axis=0)
  assert np.all(fixed[rows, np.arange(4)] > 0)
  np.testing.assert_allclose(np.abs(fixed), np.abs(np.asarray(q)))


@pytest.mark.parametrize("n", [7, 64, 3072])
def test_dct_columns_match_the_formula_and_are_orthonormal(n):
  columns = [0, 1, n // 2, n - 1]
  got = np.asarray(projection.dct_columns(jnp.asarray(columns), n), np.float64)
  reference = numpy_dct(n)[:, columns] if n <= 64 else None
  if reference is None:
    i = np.arange(n)[:, None]
    j = np.asarray(columns)[None, :]
    reference = (
      np.sqrt(2 / n) * np.where(j == 0, 1 / np.sqrt(2), 1.0) * np.cos(np.pi * (i + 0.5) * j / n)
    )
  np.testing.assert_allclose(got, reference, atol=2e-6)
  np.testing.assert_allclose(got.T @ got, np.eye(len(columns)), atol=1e-5)


def test_dct_keeps_the_best_scoring_frequencies_in_ascending_order():
  n, q = 16, 5
  basis = numpy_dct(n)
  rng = np.random.default_rng(3)
  x = basis[:, [9, 2, 13]] @ rng.normal(size=(3, q)) * 5 + 0.01 * rng.normal(size=(n, q))
  previous = projection.DCTBasis(jnp.arange(3, dtype=jnp.int32), n)
  chosen, ok = projection.compute_projection(jnp.asarray(x), previous, "dct", 3)
  scores = np.linalg.norm(basis.T @ x, axis=1)
  np.testing.assert_array_equal(chosen.indices, np.sort(np.argsort(-scores)[:3]))
  np.testing.assert_array_equal(chosen.indices, [2, 9, 13])
  assert bool(ok) and chosen.size == n


def test_subspace_iteration_converges_to_the_svd_subspace():
  x = separated_matrix(30, 12, 4, seed=5)
  start = projection.random_basis(jax.random.key(0), 30, 4, "svd")
  basis = start
  for _ in range(6):
    basis, _ = projection.compute_projection(jnp.asarray(x), basis, "subspace_iteration", 4, 2)
  exact, _ = projection.compute_projection(jnp.asarray(x), start, "svd", 4)
  assert float(jnp.max(projection.principal_angles(basis, exact))) < 1e-3
  np.testing.assert_allclose(basis.T @ basis, np.eye(4), atol=1e-5)
  np.testing.assert_array_equal(basis, projection.canonical_signs(basis))


def test_first_subspace_iteration_basis_is_an_exact_svd():
  x = jnp.asarray(separated_matrix(10, 6, 2))
  first, _ = projection.exact_projection(x, jnp.zeros((10, 2)), "subspace_iteration", 2)
  exact, _ = projection.compute_projection(x, jnp.zeros((10, 2)), "svd", 2)
  np.testing.assert_array_equal(first, exact)


@pytest.mark.parametrize("method", projection.METHODS)
def test_non_finite_refresh_keeps_the_old_basis(method):
  x = jnp.asarray(separated_matrix(10, 6, 2)).at[3, 1].set(jnp.nan)
  old = projection.random_basis(jax.random.key(2), 10, 2, method)
  new, ok = projection.compute_projection(x, old, method, 2)
  assert not bool(ok)
  np.testing.assert_array_equal(projection.basis_matrix(new), projection.basis_matrix(old))


def test_principal_angles_of_a_rotated_basis():
  a = jnp.eye(4)[:, :2]
  t = 0.3
  b = jnp.stack([jnp.array([1.0, 0, 0, 0]), jnp.array([0, np.cos(t), np.sin(t), 0])], axis=1)
  np.testing.assert_allclose(projection.principal_angles(a, b), [0.0, t], atol=1e-3)


def test_random_basis_is_orthonormal_and_shared_by_seed():
  a = projection.random_basis(jax.random.key(7), 9, 3, "svd")
  b = projection.random_basis(jax.random.key(7), 9, 3, "svd")
  np.testing.assert_array_equal(a, b)
  np.testing.assert_allclose(a.T @ a, np.eye(3), atol=1e-5)
  frequencies = projection.random_basis(jax.random.key(7), 9, 3, "dct").indices
  assert len(set(np.asarray(frequencies).tolist())) == 3
  assert np.all(np.diff(np.asarray(frequencies)) > 0)


def test_dct_columns_stay_exact_past_int32_products():
  """n = 50257 (a vocabulary): (2i + 1) j overflows int32; the reduction must not."""
  n = 50257
  j = np.array([0, 1, 777, 40000, n - 1])
  got = np.asarray(projection.dct_columns(jnp.asarray(j), n), np.float64)
  i = np.arange(n)[:, None]
  scale = np.sqrt(2 / n) * np.where(j == 0, 1 / np.sqrt(2), 1.0)
  np.testing.assert_allclose(got, scale * np.cos(np.pi * (i + 0.5) * j / n), atol=1e-7)


@pytest.mark.parametrize("method", projection.METHODS)
def test_the_right_side_is_the_left_side_of_the_transpose(method):
  x = jnp.asarray(separated_matrix(9, 20, 3, seed=4))  # right case: Q is 20 x 3
  previous = projection.random_basis(jax.random.key(3), 20, 3, method)
  right, ok_right = projection.compute_projection(x, previous, method, 3, side="right")
  left, ok_left = projection.compute_projection(x.T, previous, method, 3)
  assert bool(ok_right) and bool(ok_left)
  np.testing.assert_allclose(
    projection.basis_matrix(right), projection.basis_matrix(left), atol=1e-5
  )


@pytest.mark.parametrize("method", ["svd", "dct"])
def test_the_change_of_basis_is_new_transpose_times_old(method):
  a = projection.random_basis(jax.random.key(0), 16, 4, method)
  b = projection.random_basis(jax.random.key(1), 16, 4, method)
  expected = projection.basis_matrix(a).T @ projection.basis_matrix(b)
  np.testing.assert_allclose(projection.change_of_basis(a, b), expected, atol=1e-6)
  if method == "dct":
    assert set(np.unique(np.asarray(projection.change_of_basis(a, b)))) <= {0.0, 1.0}
