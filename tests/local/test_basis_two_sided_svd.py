"""The two-sided SVD strategy (``lordo_jax/local/bases/two_sided_svd.py``) against NumPy.

U and V are the top-r left and right singular vectors (canonical signs), the core is
:math:`U^\\top A V`, and a change of bases acts as :math:`R_U C R_V^\\top`.
Tolerances: float32 singular vectors of a matrix with a spectral gap to ``atol=1e-5``
of NumPy's float64 ones; products of float32 operands to ``rtol=atol=1e-5``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lordo_jax.local import bases as bases
from lordo_jax.local.bases import two_sided_svd
from tests.references import basis_numpy as ref

RANK = 2
SHAPES = [(12, 7), (7, 12), (8, 8)]


def make(p, q, side="auto"):
  return two_sided_svd.method(bases.Options(rank=RANK, side=side)).strategy(p, q)


@pytest.mark.parametrize("side", ["auto", "right"])
@pytest.mark.parametrize("p, q", SHAPES)
def test_shapes_side_and_init(p, q, side):
  s = make(p, q, side)  # the side option is the one-sided methods': a core has none
  assert s.side == "left" and s.exact is None
  assert s.coordinates_shape == (RANK, RANK)
  placeholder = s.init(None)
  np.testing.assert_array_equal(placeholder.left, np.zeros((p, RANK), np.float32))
  np.testing.assert_array_equal(placeholder.right, np.zeros((q, RANK), np.float32))


def test_init_from_a_key_is_two_orthonormal_bases_from_split_keys():
  s = make(8, 8)
  basis = s.init(jax.random.key(0))
  for q in (basis.left, basis.right):
    assert q.dtype == jnp.float32 and q.shape == (8, RANK)
    assert ref.orthonormality_error(q) < 1e-5
    np.testing.assert_array_equal(q, ref.canonical(q))
  assert np.max(np.abs(np.asarray(basis.left) - np.asarray(basis.right))) > 1e-2
  again = s.init(jax.random.key(0))
  np.testing.assert_array_equal(again.left, basis.left)


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("p, q", SHAPES)
def test_u_and_v_are_numpys_top_singular_vectors_with_canonical_signs(p, q, sign):
  x = sign * ref.separated(p, q, RANK, seed=p * q)
  s = make(p, q)
  basis, ok = s.compute(jnp.asarray(x, jnp.float32), s.init(None), None)
  assert bool(ok)
  assert basis.left.dtype == jnp.float32 and basis.right.dtype == jnp.float32
  np.testing.assert_allclose(basis.left, ref.top_left(x, RANK), atol=1e-5)
  np.testing.assert_allclose(basis.right, ref.top_right(x, RANK), atol=1e-5)
  assert s.dense(basis) is basis


def test_a_bfloat16_matrix_gives_float32_bases():
  x = jnp.asarray(ref.separated(12, 7, RANK, seed=3), jnp.bfloat16)
  s = make(12, 7)
  basis, ok = s.compute(x, s.init(None), None)
  rounded = np.asarray(x.astype(jnp.float32), np.float64)
  assert bool(ok) and basis.left.dtype == jnp.float32 and basis.right.dtype == jnp.float32
  np.testing.assert_allclose(basis.left, ref.top_left(rounded, RANK), atol=1e-5)
  np.testing.assert_allclose(basis.right, ref.top_right(rounded, RANK), atol=1e-5)


@pytest.mark.parametrize("p, q", SHAPES[:2])
def test_core_unproject_overlap_and_carry_are_numpys_products(p, q):
  s = make(p, q)
  old, new = (
    s.compute(jnp.asarray(ref.separated(p, q, RANK, seed=k), jnp.float32), s.init(None), None)[0]
    for k in (1, 2)
  )
  u, v = np.asarray(new.left, np.float64), np.asarray(new.right, np.float64)
  u_old, v_old = np.asarray(old.left, np.float64), np.asarray(old.right, np.float64)
  rng = np.random.default_rng(0)
  tol = dict(rtol=1e-5, atol=1e-5)

  a = rng.standard_normal((p, q)).astype(np.float32)
  core = s.project(s.dense(new), jnp.asarray(a))
  assert core.shape == s.coordinates_shape
  np.testing.assert_allclose(core, u.T @ a @ v, **tol)

  c = rng.standard_normal((RANK, RANK)).astype(np.float32)
  back = s.unproject(s.dense(new), jnp.asarray(c))
  assert back.shape == (p, q)
  np.testing.assert_allclose(back, u @ c @ v.T, **tol)

  rotation = s.change_of_basis(new, old)
  np.testing.assert_allclose(rotation.left, u.T @ u_old, **tol)
  np.testing.assert_allclose(rotation.right, v.T @ v_old, **tol)

  # Two different, non-symmetric rotations: a swapped side or a missing transpose shows.
  r_u, r_v = rng.standard_normal((2, RANK, RANK)).astype(np.float32)
  carried = s.carry(type(rotation)(jnp.asarray(r_u), jnp.asarray(r_v)), jnp.asarray(c))
  np.testing.assert_allclose(carried, r_u @ c @ r_v.T, **tol)


def test_the_rank_r_part_of_a_matrix_comes_back_from_its_core():
  x = ref.separated(12, 7, RANK, seed=4)
  s = make(12, 7)
  basis, _ = s.compute(jnp.asarray(x, jnp.float32), s.init(None), None)
  u, sigma, vh = np.linalg.svd(x)
  truncated = (u[:, :RANK] * sigma[:RANK]) @ vh[:RANK]
  back = s.unproject(basis, s.project(basis, jnp.asarray(x, jnp.float32)))
  np.testing.assert_allclose(back, truncated, atol=1e-4)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_matrix_keeps_both_previous_bases(bad):
  s = make(12, 7)
  previous = s.init(jax.random.key(5))
  x = ref.separated(12, 7, RANK, seed=6)
  x[5, 6] = bad
  basis, ok = s.compute(jnp.asarray(x, jnp.float32), previous, None)
  assert not bool(ok)
  np.testing.assert_array_equal(basis.left, previous.left)
  np.testing.assert_array_equal(basis.right, previous.right)


def test_the_bases_of_a_mean_are_the_svd_of_the_averaged_matrix():
  """Two-sided SVD averages the matrices themselves (the default bases_of_mean)."""
  m = two_sided_svd.method(bases.Options(rank=RANK))
  s = m.strategy(12, 7)
  workers = [ref.separated(12, 7, RANK, seed=10 + w) for w in range(3)]
  stacked = jnp.asarray(np.stack(workers), jnp.float32)  # the workers' copies, side by side
  mean = lambda xs: [x.mean(axis=0) for x in xs]  # noqa: E731
  ((basis, ok),) = m.bases_of_mean([s], [stacked], [s.init(None)], [None], False, mean)
  average = sum(workers) / 3
  assert bool(ok)
  np.testing.assert_allclose(basis.left, ref.top_left(average, RANK), atol=1e-5)
  np.testing.assert_allclose(basis.right, ref.top_right(average, RANK), atol=1e-5)
