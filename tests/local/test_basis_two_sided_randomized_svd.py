"""The two-sided randomized-SVD strategy and its bases of a mean
(``lordo_jax/local/bases/two_sided_randomized_svd.py``).

The refresh is checked against the algorithm of ``randomized_bases``'s docstring written
in NumPy (float64), fed the same Gaussian sketch (drawn from the key with
``jax.random.normal``, the only JAX call in the reference), and its result against
NumPy's SVD. The workers' refresh is checked to equal the refresh of their mean matrix,
with ``mean`` a ``pmean`` over a ``vmap`` axis of simulated workers. Tolerances: float32
bases to ``atol=1e-4`` of the float64 ones (float32 rounding through a sketch, a QR
per pass and an SVD, divided by relative singular-value gaps of 0.3); products to
``rtol=atol=1e-5``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lordo_jax.local import bases as bases
from lordo_jax.local.bases import strategy as strategy_lib
from lordo_jax.local.bases import two_sided_randomized_svd
from tests.references import basis_numpy as ref

RANK = 2


def method(oversample=3, power_iterations=1):
  options = bases.Options(rank=RANK, oversample=oversample, power_iterations=power_iterations)
  return two_sided_randomized_svd.method(options)


def numpy_randomized(x, key, oversample, power_iterations):
  """The docstring's algorithm in float64: sketch, power iterations, SVD of the core."""
  x = np.asarray(x, np.float64)
  width = min(RANK + oversample, *x.shape)
  omega = np.asarray(jax.random.normal(key, (x.shape[1], width), jnp.float32), np.float64)
  q = np.linalg.qr(x @ omega)[0]
  for _ in range(power_iterations):
    q = np.linalg.qr(x @ np.linalg.qr(x.T @ q)[0])[0]
  u_b, _, vh_b = np.linalg.svd(q.T @ x, full_matrices=False)
  return ref.canonical(q @ u_b[:, :RANK]), ref.canonical(vh_b[:RANK].T)


def slow_decay(p, q, seed):
  """Full rank with singular values 1/sqrt(k): the sketch matters, distinct top values."""
  return ref.separated(p, q, RANK, seed=seed, top=(1.0, 0.7), tail=(0.4, 0.05))


@pytest.mark.parametrize("p, q", [(30, 20), (20, 30)])
def test_shapes_side_and_init(p, q):
  s = method().strategy(p, q)
  assert s.side == "left" and s.exact is None  # a core has no side
  assert s.coordinates_shape == (RANK, RANK)
  placeholder = s.init(None)
  np.testing.assert_array_equal(placeholder.left, np.zeros((p, RANK)))
  np.testing.assert_array_equal(placeholder.right, np.zeros((q, RANK)))
  random = s.init(jax.random.key(0))
  assert ref.orthonormality_error(random.left) < 1e-5
  assert ref.orthonormality_error(random.right) < 1e-5


# (p, q, oversample, power iterations): l = r + oversample, or min(p, q) where smaller.
CASES = [(30, 20, 3, 0), (30, 20, 3, 2), (20, 30, 4, 1), (12, 4, 8, 1)]


@pytest.mark.parametrize("p, q, oversample, power_iterations", CASES)
def test_a_refresh_is_the_sketched_algorithm_with_the_keys_sketch(
  p, q, oversample, power_iterations
):
  x = slow_decay(p, q, seed=p + q)
  key = jax.random.key(11)
  s = method(oversample, power_iterations).strategy(p, q)
  basis, ok = s.compute(jnp.asarray(x, jnp.float32), s.init(None), key)
  assert bool(ok)
  assert basis.left.dtype == jnp.float32 and basis.right.dtype == jnp.float32
  want_u, want_v = numpy_randomized(x, key, oversample, power_iterations)
  np.testing.assert_allclose(basis.left, want_u, atol=1e-4)
  np.testing.assert_allclose(basis.right, want_v, atol=1e-4)


def test_the_key_draws_the_sketch():
  x = jnp.asarray(slow_decay(30, 20, seed=1), jnp.float32)
  s = method(oversample=3, power_iterations=0).strategy(30, 20)
  same = [s.compute(x, s.init(None), jax.random.key(k))[0].left for k in (5, 5, 6)]
  np.testing.assert_array_equal(same[0], same[1])
  assert np.max(np.abs(np.asarray(same[0]) - np.asarray(same[2]))) > 1e-3


@pytest.mark.parametrize("p, q", [(30, 20), (20, 30)])
def test_low_rank_plus_noise_gives_the_top_singular_subspaces(p, q):
  """A rank-4 matrix plus noise 1e-3: the sketch finds its top-2 singular vectors.

  Without a power iteration U lies in the sketch's range, noise included (angles
  about 1e-3 here); one pass of X X^T brings both sides to the float32 floor.
  """
  rng = np.random.default_rng(3)
  low_rank = ref.separated(p, q, 4, seed=4, top=(10.0, 7.0, 5.0, 3.5), tail=(0.0, 0.0))
  x = low_rank + 1e-3 * rng.standard_normal((p, q))
  want_u, want_v = ref.top_left(x, RANK), ref.top_right(x, RANK)
  for power_iterations, tolerance in ((0, 1e-2), (1, 1e-5)):
    s = method(oversample=3, power_iterations=power_iterations).strategy(p, q)
    basis, ok = s.compute(jnp.asarray(x, jnp.float32), s.init(None), jax.random.key(8))
    assert bool(ok)
    assert ref.largest_angle(basis.left, want_u) < tolerance
    assert ref.largest_angle(basis.right, want_v) < tolerance
  # Canonical signs: the very singular vectors, not only their spans.
  np.testing.assert_allclose(basis.left, want_u, atol=1e-5)
  np.testing.assert_allclose(basis.right, want_v, atol=1e-5)


def test_products_are_the_two_sided_ones():
  s = method().strategy(9, 6)
  rng = np.random.default_rng(0)
  new, old = s.init(jax.random.key(1)), s.init(jax.random.key(2))
  u, v = np.asarray(new.left, np.float64), np.asarray(new.right, np.float64)
  tol = dict(rtol=1e-5, atol=1e-5)
  a = rng.standard_normal((9, 6)).astype(np.float32)
  np.testing.assert_allclose(s.project(s.dense(new), a), u.T @ a @ v, **tol)
  c = rng.standard_normal((RANK, RANK)).astype(np.float32)
  np.testing.assert_allclose(s.unproject(s.dense(new), c), u @ c @ v.T, **tol)
  rotation = s.change_of_basis(new, old)
  r_u, r_v = u.T @ np.asarray(old.left), v.T @ np.asarray(old.right)
  np.testing.assert_allclose(rotation.left, r_u, **tol)
  np.testing.assert_allclose(rotation.right, r_v, **tol)
  np.testing.assert_allclose(s.carry(rotation, c), r_u @ c @ r_v.T, **tol)


def test_a_non_finite_matrix_keeps_both_previous_bases():
  s = method().strategy(20, 30)
  previous = s.init(jax.random.key(4))
  x = slow_decay(20, 30, seed=2)
  x[0, 0] = np.nan
  basis, ok = s.compute(jnp.asarray(x, jnp.float32), previous, jax.random.key(5))
  assert not bool(ok)
  np.testing.assert_array_equal(basis.left, previous.left)
  np.testing.assert_array_equal(basis.right, previous.right)


SHAPES = [(24, 20), (16, 28)]  # l = 5 is below every side, so no message is a whole matrix
WORKERS = 3


def test_workers_averaging_their_sketches_get_the_bases_of_their_mean_matrix():
  """bases_of_mean with ``mean`` a pmean: what lets workers average sketches, not matrices."""
  m = method(oversample=3, power_iterations=1)
  strategies = [m.strategy(*shape) for shape in SHAPES]
  keys = [jax.random.key(20), jax.random.key(21)]
  per_worker = [
    [slow_decay(*shape, seed=10 * w + i) for i, shape in enumerate(SHAPES)] for w in range(WORKERS)
  ]
  previous = [s.init(None) for s in strategies]
  messages = []

  def mean(products):
    messages.append([x.shape for x in products])
    return [jax.lax.pmean(x, "workers") for x in products]

  def refresh(matrices):
    return m.bases_of_mean(strategies, matrices, previous, keys, False, mean)

  stacked = [jnp.asarray(np.stack([w[i] for w in per_worker]), jnp.float32) for i in range(2)]
  got = jax.jit(jax.vmap(refresh, axis_name="workers"))(stacked)

  assert len(messages) == 2 + 2 * 1  # one message per pass, shared by both matrices
  for shapes in messages:
    assert len(shapes) == 2
    assert not set(shapes) & set(SHAPES)  # p x l, l x q or q x l: never p x q
  for i, key in enumerate(keys):
    mean_matrix = sum(w[i] for w in per_worker) / WORKERS  # its refresh, computed directly
    want_u, want_v = numpy_randomized(mean_matrix, key, 3, 1)
    basis, ok = got[i]
    for w in range(WORKERS):
      assert bool(ok[w])
      np.testing.assert_allclose(basis.left[w], want_u, atol=1e-4)
      np.testing.assert_allclose(basis.right[w], want_v, atol=1e-4)


def test_bases_of_mean_with_the_identity_are_each_matrix_own_refresh_first_or_not():
  m = method()
  strategies = [m.strategy(*shape) for shape in SHAPES]
  assert m.bases_of_mean is not strategy_lib.bases_of_mean  # its own: sketches, not matrices
  keys = [jax.random.key(30), jax.random.key(31)]
  matrices = [
    jnp.asarray(slow_decay(*shape, seed=i), jnp.float32) for i, shape in enumerate(SHAPES)
  ]
  previous = [s.init(jax.random.key(40 + i)) for i, s in enumerate(strategies)]
  bad = matrices[1].at[2, 3].set(jnp.inf)
  # ``first`` a Python bool, as the round passes it: each case one program.
  mean = jax.jit(
    lambda xs, old, first: m.bases_of_mean(strategies, xs, old, keys, first, lambda ys: ys),
    static_argnums=2,
  )
  want, _ = jax.jit(strategies[0].compute)(matrices[0], previous[0], keys[0])
  for first in (True, False):
    (basis, ok), (kept, bad_ok) = mean([matrices[0], bad], previous, first)
    assert bool(ok) and not bool(bad_ok)
    np.testing.assert_allclose(basis.left, want.left, atol=1e-6)
    np.testing.assert_allclose(basis.right, want.right, atol=1e-6)
    np.testing.assert_array_equal(kept.left, previous[1].left)
    np.testing.assert_array_equal(kept.right, previous[1].right)
