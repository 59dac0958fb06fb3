"""What every basis strategy shares (``lordo_jax/local/bases/strategy.py``, ``one_sided.py``).

Canonical signs against NumPy; ``checked`` (one ``ok`` for a whole basis, the previous
one kept where it is false); ``compute_of``'s choice between ``first`` and ``compute``
for Python and traced booleans; ``bases_of_mean`` with the identity and with a mean
over simulated workers; the one-sided side rule and random bases. Tolerances: float32
bases against NumPy's float64 SVD of gapped matrices to ``atol=1e-5``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lordo_jax.local import bases as bases
from lordo_jax.local.bases import one_sided
from lordo_jax.local.bases import strategy as strategy_lib
from lordo_jax.local.bases import two_sided
from tests.references import basis_numpy as ref

RANK = 2


# --- canonical signs


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_canonical_signs_are_numpys_and_keep_the_dtype(dtype):
  q = jax.random.normal(jax.random.key(0), (9, 5)).astype(dtype)
  fixed = strategy_lib.canonical_signs(q)
  assert fixed.dtype == dtype
  np.testing.assert_array_equal(np.asarray(fixed, np.float64), ref.canonical(q.astype(jnp.float32)))
  rows = np.argmax(np.abs(np.asarray(fixed, np.float64)), axis=0)
  assert np.all(np.asarray(fixed, np.float64)[rows, np.arange(5)] > 0)
  assert np.any(np.asarray(q, np.float64) != np.asarray(fixed, np.float64))  # some flipped
  np.testing.assert_array_equal(strategy_lib.canonical_signs(fixed), fixed)  # idempotent


def test_canonical_signs_break_a_tie_at_the_first_largest_entry_as_numpy_does():
  q = jnp.asarray([[1.0, -1.0], [-1.0, 1.0], [0.5, 0.5]])
  np.testing.assert_array_equal(strategy_lib.canonical_signs(q), [[1, 1], [-1, -1], [0.5, -0.5]])
  np.testing.assert_array_equal(strategy_lib.canonical_signs(q), ref.canonical(q))


# --- checked


def two_sided_basis(value):
  return two_sided.TwoSidedBasis(jnp.full((4, RANK), value), jnp.full((3, RANK), value))


def test_checked_keeps_a_finite_basis_and_says_ok():
  basis, previous = two_sided_basis(1.0), two_sided_basis(2.0)
  kept, ok = strategy_lib.checked(basis, previous)
  assert bool(ok) and ok.shape == ()
  np.testing.assert_array_equal(kept.left, basis.left)
  np.testing.assert_array_equal(kept.right, basis.right)


@pytest.mark.parametrize("leaf", ["left", "right"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_one_non_finite_entry_in_any_leaf_keeps_the_whole_previous_basis(leaf, bad):
  basis, previous = two_sided_basis(1.0), two_sided_basis(2.0)
  basis = basis._replace(**{leaf: getattr(basis, leaf).at[1, 0].set(bad)})
  for check in (strategy_lib.checked, jax.jit(strategy_lib.checked)):
    kept, ok = check(basis, previous)
    assert not bool(ok)
    np.testing.assert_array_equal(kept.left, previous.left)  # both leaves, not only the bad one
    np.testing.assert_array_equal(kept.right, previous.right)


# --- compute_of: first or compute


def marked(value):
  """A refresh that returns ``value`` everywhere, so the test sees which one ran."""
  return lambda matrix, previous, key: (jnp.full_like(previous, value), jnp.bool_(True))


def fake_strategy(with_first):
  template = one_sided.strategy(6, 3, RANK, True, init=None, compute=marked(1.0))
  return template._replace(exact=marked(2.0) if with_first else None)


@pytest.mark.parametrize("with_first", [True, False])
@pytest.mark.parametrize("first", [True, False])
def test_compute_of_runs_first_only_for_a_first_refresh_of_a_strategy_that_has_one(
  with_first, first
):
  s = fake_strategy(with_first)
  previous, x = jnp.zeros((6, RANK)), jnp.ones((6, 3))
  want = 2.0 if (first and with_first) else 1.0
  basis, ok = strategy_lib.compute_of(s, first)(x, previous, None)
  assert bool(ok)
  np.testing.assert_array_equal(basis, np.full((6, RANK), want))
  traced = jax.jit(lambda f: strategy_lib.compute_of(s, f)(x, previous, None)[0])
  np.testing.assert_array_equal(traced(jnp.bool_(first)), np.full((6, RANK), want))


def test_a_traced_first_picks_the_exact_svd_of_subspace_iteration():
  m = bases.method("subspace_iteration", two_sided=False, options=bases.Options(rank=RANK))
  s = m.strategy(14, 6)
  x = jnp.asarray(ref.separated(14, 6, RANK, seed=1, top=(10.0, 8.0), tail=(6.0, 0.1)))
  previous = s.init(jax.random.key(2))
  refresh = jax.jit(lambda f: strategy_lib.compute_of(s, f)(x, previous, None)[0])
  exact = ref.top_left(x, RANK)
  np.testing.assert_allclose(refresh(jnp.bool_(True)), exact, atol=1e-5)
  iterated, _ = s.compute(x, previous, None)
  np.testing.assert_allclose(refresh(jnp.bool_(False)), iterated, atol=1e-6)
  assert ref.largest_angle(iterated, exact) > 1e-3  # the two branches differ


# --- bases_of_mean (the default): average the matrices, then compute


SHAPES = [(14, 6), (5, 11)]  # one left, one right
WORKERS = 3


def worker_matrices(worker):
  return [ref.separated(p, q, RANK, seed=10 * worker + i) for i, (p, q) in enumerate(SHAPES)]


@pytest.mark.parametrize("projection", ["svd", "dct"])
def test_the_one_sided_methods_use_the_default_bases_of_mean(projection):
  m = bases.method(projection, two_sided=False, options=bases.Options(rank=RANK))
  assert m.bases_of_mean is strategy_lib.bases_of_mean


@pytest.mark.parametrize("first", [True, False, "traced True", "traced False"])
def test_subspace_iteration_refreshes_all_groups_at_once_as_each_alone(first):
  """Its own bases_of_mean iterates every group together (one factorization per pass
  for all of them): each basis is the one the group's own compute (or, first, its
  exact SVD) gives, on a batch of two matrices of each shape."""
  m = bases.method("subspace_iteration", two_sided=False, options=bases.Options(rank=RANK))
  strategies = [m.strategy(*shape) for shape in SHAPES]
  matrices = [
    jnp.asarray(np.stack([worker_matrices(w)[i] for w in range(2)]), jnp.float32)
    for i in range(len(SHAPES))
  ]
  previous = [
    jax.vmap(s.init)(jax.random.split(jax.random.key(i), 2)) for i, s in enumerate(strategies)
  ]
  keys = [None, None]
  if isinstance(first, str):
    traced = jnp.bool_(first == "traced True")
    got = jax.jit(lambda f: m.bases_of_mean(strategies, matrices, previous, keys, f, list))(traced)
    first = bool(traced)
  else:  # ``first`` a Python bool, the program's own branch; each side one program
    got = jax.jit(lambda: m.bases_of_mean(strategies, matrices, previous, keys, first, list))()
  for s, x, old, (basis, ok) in zip(strategies, matrices, previous, got, strict=True):
    want, want_ok = jax.jit(s.exact if first else s.compute, static_argnums=2)(x, old, None)
    assert ok.shape == (2,) and bool(jnp.all(ok)) and bool(jnp.all(want_ok))
    np.testing.assert_allclose(basis, want, atol=1e-6)


def test_bases_of_mean_with_the_identity_are_each_matrix_own_basis():
  m = bases.method("svd", two_sided=False, options=bases.Options(rank=RANK))
  strategies = [m.strategy(*shape) for shape in SHAPES]
  matrices = worker_matrices(0)
  previous = [s.init(None) for s in strategies]
  results = strategy_lib.bases_of_mean(
    strategies,
    [jnp.asarray(x, jnp.float32) for x in matrices],
    previous,
    [None, None],
    False,
    lambda xs: xs,
  )
  (left, left_ok), (right, right_ok) = results
  assert bool(left_ok) and bool(right_ok)
  np.testing.assert_allclose(left, ref.top_left(matrices[0], RANK), atol=1e-5)
  np.testing.assert_allclose(right, ref.top_right(matrices[1], RANK), atol=1e-5)


@pytest.mark.parametrize("own", [False, True], ids=["default", "subspace_iteration's"])
@pytest.mark.parametrize("first", [True, False])
def test_bases_of_mean_over_workers_are_the_bases_of_the_mean_matrices(first, own):
  """One ``mean`` of all the matrices (a pmean over simulated workers), then each basis:
  with the default bases_of_mean and with subspace iteration's own."""
  m = bases.method("subspace_iteration", two_sided=False, options=bases.Options(rank=RANK))
  bases_of_mean = m.bases_of_mean if own else strategy_lib.bases_of_mean
  strategies = [m.strategy(*shape) for shape in SHAPES]
  previous = [s.init(jax.random.key(i)) for i, s in enumerate(strategies)]
  calls = []

  def mean(xs):
    calls.append([x.shape for x in xs])
    return [jax.lax.pmean(x, "workers") for x in xs]

  def refresh(matrices):
    return bases_of_mean(strategies, matrices, previous, [None, None], first, mean)

  per_worker = [worker_matrices(w) for w in range(WORKERS)]
  stacked = [jnp.asarray(np.stack([w[i] for w in per_worker]), jnp.float32) for i in range(2)]
  got = jax.jit(jax.vmap(refresh, axis_name="workers"))(stacked)
  assert calls == [list(SHAPES)]  # one message: every matrix, whole
  averages = [sum(w[i] for w in per_worker) / WORKERS for i in range(2)]
  for i, (s, average) in enumerate(zip(strategies, averages, strict=True)):
    left = s.side == "left"
    if first:  # the exact SVD of the mean
      want = ref.top_left(average, RANK) if left else ref.top_right(average, RANK)
    else:  # subspace iteration from the previous basis, on the mean
      want = ref.subspace_iterate(average, previous[i], 2, left)
    basis, ok = got[i]
    for w in range(WORKERS):
      assert bool(ok[w])
      np.testing.assert_allclose(basis[w], want, atol=1e-5)
  identity = bases_of_mean(
    strategies, [x[0] for x in stacked], previous, [None, None], first, lambda xs: xs
  )
  assert np.max(np.abs(np.asarray(identity[0][0]) - np.asarray(got[0][0][0]))) > 1e-2


# --- one-sided helpers


@pytest.mark.parametrize(
  "p, q, side, left",
  [
    (8, 3, "auto", True),
    (3, 8, "auto", False),
    (5, 5, "auto", True),
    (3, 8, "left", True),
    (8, 3, "right", False),
    (5, 5, "right", False),
    (8, 3, "galore_std", False),  # moments on the larger dimension: p x r
    (3, 8, "galore_std", True),  # r x q
    (5, 5, "galore_std", True),  # square: the input side of a Flax kernel, as auto
  ],
)
def test_the_side_rule_of_spec_section_2(p, q, side, left):
  assert one_sided.is_left(p, q, side) is left


def test_random_bases_are_orthonormal_canonical_and_fixed_by_the_key():
  a = one_sided.random_q(jax.random.key(0), 10, 3)
  assert a.dtype == jnp.float32 and a.shape == (10, 3)
  assert ref.orthonormality_error(a) < 1e-5
  np.testing.assert_array_equal(a, ref.canonical(a))
  np.testing.assert_array_equal(a, one_sided.random_q(jax.random.key(0), 10, 3))
  assert (
    np.max(np.abs(np.asarray(a) - np.asarray(one_sided.random_q(jax.random.key(1), 10, 3)))) > 0.1
  )
  init = one_sided.dense_init(10, 3)
  np.testing.assert_array_equal(init(None), np.zeros((10, 3), np.float32))
  np.testing.assert_array_equal(init(jax.random.key(0)), a)


def test_method_picks_one_sided_or_two_sided_by_name():
  options = bases.Options(rank=RANK)
  one = bases.method("svd", two_sided=False, options=options).strategy(9, 4)
  two = bases.method("svd", two_sided=True, options=options).strategy(9, 4)
  assert one.coordinates_shape == (RANK, 4) and two.coordinates_shape == (RANK, RANK)
  with pytest.raises(KeyError):
    bases.method("dct", two_sided=True, options=options)
