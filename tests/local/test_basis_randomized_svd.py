"""The one-sided randomized-SVD strategy and its bases of a mean
(``lordo_jax/local/bases/randomized_svd.py``): Q on the side MATH.md §2 picks.

The refresh is checked against the algorithm of ``one_sided_bases``'s docstring written
in NumPy (float64, ``basis_numpy.one_sided_randomized``), fed the same Gaussian sketch
(drawn from the key with ``jax.random.normal``, the only JAX call in the reference), and
its result against NumPy's SVD. The workers' refresh is checked to equal the refresh of
their mean matrix, with ``mean`` a ``pmean`` over a ``vmap`` axis of simulated workers.
Tolerances: float32 bases to ``atol=1e-4`` of the float64 ones (float32 rounding through
a sketch, a QR per pass and an SVD, divided by relative singular-value gaps of 0.3).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lordo_jax.local import bases as bases
from lordo_jax.local.bases import strategy as strategy_lib
from tests.references import basis_numpy as ref

RANK = 2
# (p, q, oversample, power iterations): l = r + oversample, or min(p, q) where smaller.
CASES = [(30, 20, 3, 0), (30, 20, 3, 2), (20, 30, 4, 1), (12, 4, 8, 1)]
SHAPES = [(24, 20), (16, 28)]  # l = 5 is below every side, so no message is a whole matrix
WORKERS = 3


def slow_decay(p, q, seed):
  """Full rank with singular values 1/sqrt(k): the sketch matters, distinct top values."""
  return ref.separated(p, q, RANK, seed=seed, top=(1.0, 0.7), tail=(0.4, 0.05))


def one_sided(oversample=3, power_iterations=1, side="auto"):
  options = bases.Options(
    rank=RANK, side=side, oversample=oversample, power_iterations=power_iterations
  )
  return bases.method("randomized_svd", two_sided=False, options=options)


def one_sided_reference(x, key, oversample, power_iterations, left):
  """basis_numpy's algorithm, fed the sketch the key draws (``q x l``, or ``p x l``)."""
  width = min(RANK + oversample, *x.shape)
  rows = x.shape[1] if left else x.shape[0]
  omega = jax.random.normal(key, (rows, width), jnp.float32)
  return ref.one_sided_randomized(x, omega, RANK, power_iterations, left)


@pytest.mark.parametrize("p, q", [(30, 20), (20, 30)])
def test_one_sided_shapes_side_and_init(p, q):
  s = one_sided().strategy(p, q)
  left = p >= q
  assert s.side == ("left" if left else "right") and s.exact is None
  assert s.coordinates_shape == ((RANK, q) if left else (p, RANK))
  n = p if left else q
  np.testing.assert_array_equal(s.init(None), np.zeros((n, RANK)))
  random = s.init(jax.random.key(0))
  assert random.shape == (n, RANK) and ref.orthonormality_error(random) < 1e-5
  assert one_sided().bases_of_mean is not strategy_lib.bases_of_mean  # averages sketches


@pytest.mark.parametrize("p, q, oversample, power_iterations", CASES)
@pytest.mark.parametrize("side", ["left", "right"])
def test_a_one_sided_refresh_is_the_sketched_algorithm_with_the_keys_sketch(
  p, q, oversample, power_iterations, side
):
  x = slow_decay(p, q, seed=p + q)
  key = jax.random.key(12)
  s = one_sided(oversample, power_iterations, side).strategy(p, q)
  basis, ok = s.compute(jnp.asarray(x, jnp.float32), s.init(None), key)
  assert bool(ok) and basis.dtype == jnp.float32
  want = one_sided_reference(x, key, oversample, power_iterations, side == "left")
  np.testing.assert_allclose(basis, want, atol=1e-4)
  if power_iterations == 0:  # The reference's sketch is the key's: another key differs.
    other, _ = s.compute(jnp.asarray(x, jnp.float32), s.init(None), jax.random.key(13))
    assert np.max(np.abs(np.asarray(other) - want)) > 1e-3


@pytest.mark.parametrize("p, q", [(30, 20), (20, 30)])
def test_one_sided_on_a_spectral_gap_is_the_top_singular_subspace(p, q):
  """Rank 4 plus noise 1e-3: one power iteration brings Q to the top-2 singular
  vectors of its side to 1e-5, signs included (none leaves it at about 1e-3)."""
  rng = np.random.default_rng(3)
  low_rank = ref.separated(p, q, 4, seed=4, top=(10.0, 7.0, 5.0, 3.5), tail=(0.0, 0.0))
  x = low_rank + 1e-3 * rng.standard_normal((p, q))
  want = ref.top_left(x, RANK) if p >= q else ref.top_right(x, RANK)
  for power_iterations, tolerance in ((0, 1e-2), (1, 1e-5)):
    s = one_sided(oversample=3, power_iterations=power_iterations).strategy(p, q)
    basis, ok = s.compute(jnp.asarray(x, jnp.float32), s.init(None), jax.random.key(8))
    assert bool(ok)
    assert ref.largest_angle(basis, want) < tolerance
  np.testing.assert_allclose(basis, want, atol=1e-5)


def test_a_one_sided_non_finite_matrix_keeps_the_previous_basis():
  s = one_sided().strategy(30, 20)
  previous = s.init(jax.random.key(4))
  x = slow_decay(30, 20, seed=2)
  x[3, 1] = np.inf
  basis, ok = s.compute(jnp.asarray(x, jnp.float32), previous, jax.random.key(5))
  assert not bool(ok)
  np.testing.assert_array_equal(basis, previous)


def test_one_sided_workers_averaging_their_sketches_get_the_bases_of_their_mean_matrix():
  """Both sides in one call (24 x 20 on the left, 16 x 28 on the right), each pass one
  message shared by both matrices, none of them p x q."""
  m = one_sided(oversample=3, power_iterations=1)
  strategies = [m.strategy(*shape) for shape in SHAPES]
  assert [s.side for s in strategies] == ["left", "right"]
  keys = [jax.random.key(22), jax.random.key(23)]
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

  assert len(messages) == 2 + 2 * 1
  for shapes in messages:
    assert len(shapes) == 2 and not set(shapes) & set(SHAPES)
  for i, (key, s) in enumerate(zip(keys, strategies, strict=True)):
    mean_matrix = sum(w[i] for w in per_worker) / WORKERS
    want = one_sided_reference(mean_matrix, key, 3, 1, s.side == "left")
    basis, ok = got[i]
    for w in range(WORKERS):
      assert bool(ok[w])
      np.testing.assert_allclose(basis[w], want, atol=1e-4)
