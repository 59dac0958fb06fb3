"""The DCT strategy (``lordo_jax/local/bases/dct.py``) against the DCT-II matrix built in NumPy.

The basis is the r columns of the orthonormal DCT-II matrix that score highest by
:math:`\\lVert B_j^\\top X \\rVert_2` (left; :math:`\\lVert X B_j \\rVert_2` on the right),
in ascending order. Sizes above 256 cover the refresh's second block of scores.
Tolerances: DCT columns are float64 values rounded once to float32, so ``atol=1e-6``;
float32 products of length n <= 300 to ``rtol=atol=1e-5``; overlaps are exact.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import lordo_jax
from lordo_jax.local import bases as bases
from lordo_jax.local.bases import dct
from tests.references import basis_numpy as ref

RANK = 4
N = 300  # the DCT length: two blocks of 256 scores, the second one partial


def make(p, q, side="auto"):
  return dct.method(bases.Options(rank=RANK, side=side)).strategy(p, q)


def numpy_scores(x, left):
  """The docstring's score of every frequency, from the NumPy DCT-II matrix."""
  b = ref.dct_matrix(x.shape[0] if left else x.shape[1])
  return np.linalg.norm(b.T @ x, axis=1) if left else np.linalg.norm(x @ b, axis=0)


def matrix_with_frequencies(p, q, left, frequencies, seed=0):
  """A ``p x q`` matrix of the given DCT frequencies, scoring about 3 up to 6 in the
  order given, plus noise of score about 0.1.
  """
  rng = np.random.default_rng(seed)
  n, m = (p, q) if left else (q, p)
  b = ref.dct_matrix(n)
  directions = rng.standard_normal((len(frequencies), m))
  directions /= np.linalg.norm(directions, axis=1, keepdims=True)
  weights = np.linspace(3.0, 6.0, len(frequencies))[:, None]
  x = b[:, frequencies] @ (weights * directions)
  x = x + 0.05 * rng.standard_normal((n, m))
  return x if left else x.T


# (p, q, side, left): forced sides project a length-280 axis against the auto choice.
SIDES = [
  (N, 6, "auto", True),
  (6, N, "auto", False),
  (N, N - 20, "right", False),
  (N - 20, N, "left", True),
]


@pytest.mark.parametrize("p, q, side, left", SIDES)
def test_side_shapes_and_init(p, q, side, left):
  s = make(p, q, side)
  n = p if left else q
  assert s.side == ("left" if left else "right")
  assert s.coordinates_shape == ((RANK, q) if left else (p, RANK))
  assert s.exact is None
  placeholder = s.init(None)
  np.testing.assert_array_equal(placeholder.indices, np.arange(RANK))
  assert placeholder.size == n
  np.testing.assert_allclose(s.dense(placeholder), ref.dct_matrix(n)[:, :RANK], atol=1e-6)


def test_init_from_a_key_is_r_distinct_ascending_frequencies_fixed_by_the_key():
  s = make(N, 6)
  drawn = [np.asarray(s.init(jax.random.key(k)).indices) for k in (0, 0, 1)]
  for indices in drawn:
    assert indices.dtype == np.int32 and indices.shape == (RANK,)
    assert np.all(np.diff(indices) > 0) and 0 <= indices[0] and indices[-1] < N
  np.testing.assert_array_equal(drawn[0], drawn[1])
  assert not np.array_equal(drawn[0], drawn[2])


@pytest.mark.parametrize("p, q, side, left", SIDES)
def test_a_refresh_keeps_the_r_best_scoring_frequencies_in_ascending_order(p, q, side, left):
  # Six strong frequencies, weakest first: the top four (7, 270, 31, n - 1) win, and
  # their scores' order is not their indices' order.
  n = p if left else q
  frequencies = [2, 140, 7, 270, 31, n - 1]
  x = matrix_with_frequencies(p, q, left, frequencies, seed=p)
  scores = numpy_scores(x, left)
  order = np.argsort(-scores)
  assert scores[order[RANK - 1]] > 1.05 * scores[order[RANK]]  # no float32 tie possible
  want = np.sort(order[:RANK])
  assert not np.array_equal(want, np.arange(RANK))  # a refresh must move the basis
  s = make(p, q, side)
  basis, ok = s.compute(jnp.asarray(x, jnp.float32), s.init(None), None)
  assert bool(ok)
  np.testing.assert_array_equal(basis.indices, want)
  assert basis.size == (p if left else q)
  np.testing.assert_allclose(s.dense(basis), ref.dct_matrix(basis.size)[:, want], atol=1e-6)


def test_the_scores_are_dct_ii_norms():
  x = np.random.default_rng(1).standard_normal((N, 5))
  for left, matrix in ((True, x), (False, x.T)):
    got = dct.scores(jnp.asarray(matrix, jnp.float32), left)
    np.testing.assert_allclose(got, numpy_scores(matrix, left), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("p, q, side, left", SIDES[:2])
def test_project_unproject_and_carry_are_products_with_the_dct_columns(p, q, side, left):
  s = make(p, q, side)
  rng = np.random.default_rng(2)
  basis = dct.DCTBasis(jnp.asarray([0, 5, 200, 299], jnp.int32), N)
  b = ref.dct_matrix(N)[:, [0, 5, 200, 299]]
  tol = dict(rtol=1e-5, atol=1e-5)
  a = rng.standard_normal((p, q)).astype(np.float32)
  coordinates = s.project(s.dense(basis), jnp.asarray(a))
  assert coordinates.shape == s.coordinates_shape
  np.testing.assert_allclose(coordinates, b.T @ a if left else a @ b, **tol)
  c = rng.standard_normal(s.coordinates_shape).astype(np.float32)
  np.testing.assert_allclose(s.unproject(s.dense(basis), c), b @ c if left else c @ b.T, **tol)
  r = rng.standard_normal((RANK, RANK)).astype(np.float32)
  np.testing.assert_allclose(s.carry(r, c), r @ c if left else c @ r.T, **tol)


def test_the_overlap_of_two_dct_bases_is_exactly_the_0_1_matrix_of_equal_frequencies():
  s = make(N, 6)
  new_indices, old_indices = [3, 17, 140, 299], [0, 3, 17, 250]  # R is not symmetric
  new = dct.DCTBasis(jnp.asarray(new_indices, jnp.int32), N)
  old = dct.DCTBasis(jnp.asarray(old_indices, jnp.int32), N)
  rotation = np.asarray(s.change_of_basis(new, old))
  want = np.zeros((RANK, RANK), np.float32)
  want[0, 1] = want[1, 2] = 1.0
  np.testing.assert_array_equal(rotation, want)
  b = ref.dct_matrix(N)
  np.testing.assert_allclose(rotation, b[:, new_indices].T @ b[:, old_indices], atol=1e-12)
  dense_product = np.asarray(s.dense(new)).T @ np.asarray(s.dense(old))
  np.testing.assert_allclose(rotation, dense_product, atol=1e-5)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("left", [True, False])
def test_a_non_finite_matrix_keeps_the_previous_frequencies(bad, left):
  p, q = (N, 6) if left else (6, N)
  s = make(p, q)
  previous = s.init(jax.random.key(3))
  x = matrix_with_frequencies(p, q, left, [1, 2, 3, 4])
  x[4, 5] = bad
  basis, ok = s.compute(jnp.asarray(x, jnp.float32), previous, None)
  assert not bool(ok)
  np.testing.assert_array_equal(basis.indices, previous.indices)
  assert basis.size == previous.size


def test_projections_reads_dct_bases_stacked_over_an_explicit_worker_axis():
  """The LM job's state: DCT indices stacked over workers, placed P("workers")."""
  mesh = jax.make_mesh((8,), ("workers",))
  tx = lordo_jax.lordo(1e-2, rank=2, sync_every=2, projection="dct", init_projection="random")
  one = tx.init({"w": jnp.ones((16, 8))})
  stacked = jax.tree.map(
    lambda a: jax.device_put(jnp.stack([a] * 8), NamedSharding(mesh, P("workers"))), one
  )
  expected = np.asarray(lordo_jax.projections(one)["w"])
  got = np.asarray(lordo_jax.projections(stacked)["w"])
  assert got.shape == (8, 16, 2)
  np.testing.assert_array_equal(got, np.broadcast_to(expected, got.shape))
