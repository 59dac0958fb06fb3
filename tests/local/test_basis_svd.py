"""The one-sided SVD strategy (``lordo_jax/local/bases/svd.py``) through its BasisStrategy.

Every number is checked against NumPy in float64 (``basis_numpy``). Tolerances, for
float32 computations: a basis of a matrix with a spectral gap (``basis_numpy.separated``)
agrees with NumPy's singular vectors to ``atol=1e-5``; products of float32 operands of
magnitude about 1 to ``rtol=atol=1e-5``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lordo_jax.local import bases as bases
from lordo_jax.local.bases import svd
from tests.references import basis_numpy as ref

RANK = 2
# (p, q, side option, the side it must pick): MATH.md §2, and both forced sides.
SIDES = [
  (12, 5, "auto", "left"),
  (5, 12, "auto", "right"),
  (7, 7, "auto", "left"),
  (5, 12, "left", "left"),
  (12, 5, "right", "right"),
]


def make(p, q, side):
  return svd.method(bases.Options(rank=RANK, side=side)).strategy(p, q)


def numpy_basis(x, left):
  return ref.top_left(x, RANK) if left else ref.top_right(x, RANK)


@pytest.mark.parametrize("p, q, side, want", SIDES)
def test_side_and_coordinates_shape(p, q, side, want):
  s = make(p, q, side)
  assert s.side == want
  assert s.coordinates_shape == ((RANK, q) if want == "left" else (p, RANK))
  assert s.exact is None  # an SVD needs no other first basis
  n = p if want == "left" else q
  np.testing.assert_array_equal(s.init(None), np.zeros((n, RANK), np.float32))


@pytest.mark.parametrize("p, q", [(12, 5), (5, 12)])
def test_init_from_a_key_is_an_orthonormal_basis_of_the_projected_side(p, q):
  s = make(p, q, "auto")
  random = np.asarray(s.init(jax.random.key(0)))
  assert random.shape == (max(p, q), RANK) and random.dtype == np.float32
  assert ref.orthonormality_error(random) < 1e-5
  np.testing.assert_array_equal(random, ref.canonical(random))


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("p, q, side, want", SIDES)
def test_basis_is_numpys_top_singular_vectors_with_canonical_signs(p, q, side, want, sign):
  """X and -X have the same canonical basis, although LAPACK flips one of their sides."""
  x = sign * ref.separated(p, q, RANK, seed=p + 2 * q)
  s = make(p, q, side)
  basis, ok = s.compute(jnp.asarray(x, jnp.float32), s.init(None), None)
  assert bool(ok)
  assert basis.dtype == jnp.float32 and basis.shape == (p if want == "left" else q, RANK)
  np.testing.assert_allclose(basis, numpy_basis(x, want == "left"), atol=1e-5)
  np.testing.assert_array_equal(s.dense(basis), basis)  # stored as its matrix


def test_compute_under_jit_is_the_same_basis():
  x = jnp.asarray(ref.separated(5, 12, RANK, seed=9), jnp.float32)
  s = make(5, 12, "auto")
  eager, _ = s.compute(x, s.init(None), None)
  jitted, ok = jax.jit(s.compute)(x, s.init(None), None)
  assert bool(ok)
  np.testing.assert_allclose(jitted, eager, atol=1e-6)
  np.testing.assert_allclose(jitted, ref.top_right(np.asarray(x, np.float64), RANK), atol=1e-5)


def test_a_bfloat16_matrix_gives_a_float32_basis():
  x = jnp.asarray(ref.separated(12, 5, RANK, seed=3), jnp.bfloat16)
  s = make(12, 5, "auto")
  basis, ok = s.compute(x, s.init(None), None)
  assert bool(ok) and basis.dtype == jnp.float32
  rounded = np.asarray(x.astype(jnp.float32), np.float64)  # the matrix it was given
  np.testing.assert_allclose(basis, ref.top_left(rounded, RANK), atol=1e-5)


@pytest.mark.parametrize("p, q, side, want", SIDES)
def test_project_unproject_change_of_basis_and_carry_are_numpys_products(p, q, side, want):
  left = want == "left"
  s = make(p, q, side)
  rng = np.random.default_rng(p * q)
  old, new = (
    s.compute(jnp.asarray(ref.separated(p, q, RANK, seed=k), jnp.float32), s.init(None), None)[0]
    for k in (1, 2)
  )
  q_new, q_old = np.asarray(new, np.float64), np.asarray(old, np.float64)
  tol = dict(rtol=1e-5, atol=1e-5)

  a = rng.standard_normal((p, q)).astype(np.float32)
  coordinates = s.project(s.dense(new), jnp.asarray(a))
  assert coordinates.shape == s.coordinates_shape
  np.testing.assert_allclose(coordinates, q_new.T @ a if left else a @ q_new, **tol)

  c = rng.standard_normal(s.coordinates_shape).astype(np.float32)
  back = s.unproject(s.dense(new), jnp.asarray(c))
  assert back.shape == (p, q)
  np.testing.assert_allclose(back, q_new @ c if left else c @ q_new.T, **tol)

  rotation = s.change_of_basis(new, old)
  assert rotation.shape == (RANK, RANK)
  np.testing.assert_allclose(rotation, q_new.T @ q_old, **tol)

  r = rng.standard_normal((RANK, RANK)).astype(np.float32)  # not symmetric: R vs R^T shows
  carried = s.carry(jnp.asarray(r), jnp.asarray(c))
  np.testing.assert_allclose(carried, r @ c if left else c @ r.T, **tol)


@pytest.mark.parametrize("p, q", [(12, 5), (5, 12)])
def test_a_matrix_in_the_span_comes_back_from_its_coordinates(p, q):
  s = make(p, q, "auto")
  x = jnp.asarray(ref.separated(p, q, RANK, seed=4), jnp.float32)
  basis, _ = s.compute(x, s.init(None), None)
  q_np = np.asarray(basis, np.float64)
  rng = np.random.default_rng(0)
  if p >= q:
    inside = q_np @ rng.standard_normal((RANK, q))
  else:
    inside = rng.standard_normal((p, RANK)) @ q_np.T
  back = s.unproject(basis, s.project(basis, jnp.asarray(inside, jnp.float32)))
  np.testing.assert_allclose(back, inside, atol=1e-5)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("p, q", [(12, 5), (5, 12)])
def test_a_non_finite_matrix_keeps_the_previous_basis(p, q, bad):
  s = make(p, q, "auto")
  previous = s.init(jax.random.key(7))
  x = ref.separated(p, q, RANK, seed=5)
  x[1, 2] = bad
  basis, ok = s.compute(jnp.asarray(x, jnp.float32), previous, None)
  assert not bool(ok)
  np.testing.assert_array_equal(basis, previous)
