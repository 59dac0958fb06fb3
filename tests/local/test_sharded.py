"""lordo_jax._sharded.orthonormal: a batched Cholesky-QR with the thin QR's Q, and its fallback.

The reference is NumPy's Householder QR in float64 (signs fixed so R has a positive
diagonal). A plain Cholesky-QR in float32 breaks down near condition number 1e3-1e4
(the Gram squares it past 1/u); the shifted passes must hold to 1e7, batched and split
by rows; beyond, and for rank-deficient or zero matrices, a matrix falls back alone to
Householder QR (unsplit) or reports ``ok=False`` (split), never a NaN.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from lordo_jax import _sharded as sharded
from tests.helpers import hlo
from tests.references import basis_numpy as ref


def _factor(n: int, r: int, condition: float, seed: int = 0) -> np.ndarray:
  """An ``n x r`` float32 matrix with singular values spread from 1 to 1/condition."""
  rng = np.random.default_rng(seed)
  left, _ = np.linalg.qr(rng.standard_normal((n, r)))
  right, _ = np.linalg.qr(rng.standard_normal((r, r)))
  return (left * np.geomspace(1.0, 1.0 / condition, r)) @ right.T


def _rank_deficient(n: int, r: int, rank: int, seed: int = 0) -> np.ndarray:
  rng = np.random.default_rng(seed)
  return rng.standard_normal((n, rank)) @ rng.standard_normal((rank, r))


def _numpy_q(y: np.ndarray) -> np.ndarray:
  q, r = np.linalg.qr(y.astype(np.float64))
  return q * np.sign(np.diag(r))


def _resolvable(condition: float) -> float:
  """How close float32 can bring a column of the thin QR's Q at this conditioning."""
  return max(1e-5, 3e-8 * condition)


CONDITIONS = [1e1, 1e3, 1e5, 1e6, 1e7]


@pytest.mark.parametrize("shape", [(96, 10), (768, 64)])
def test_a_batch_of_ill_conditioned_factors_gets_the_thin_qr_q_without_a_fallback(shape):
  ys = np.stack([_factor(*shape, c, seed=i) for i, c in enumerate(CONDITIONS)])
  q_cholesky = jax.jit(sharded.cholesky_qr)(jnp.asarray(ys, jnp.float32))
  # The Cholesky passes alone hold at every conditioning: no fallback is needed.
  assert np.all(np.asarray(sharded.orthonormality_error(q_cholesky)) < 1e-5)
  q, ok = jax.jit(sharded.orthonormal)(jnp.asarray(ys, jnp.float32))
  assert ok.shape == (len(CONDITIONS),) and bool(jnp.all(ok))
  q = np.asarray(q, np.float64)
  for i, condition in enumerate(CONDITIONS):
    assert ref.orthonormality_error(q[i]) < 1e-5, condition
    np.testing.assert_allclose(q[i], _numpy_q(ys[i]), atol=_resolvable(condition))


def test_each_matrix_of_a_batch_is_orthonormalised_as_it_would_be_alone():
  ys = jnp.asarray(np.stack([_factor(64, 8, c, seed=i) for i, c in enumerate((1e1, 1e4))]))
  q, _ = jax.jit(sharded.orthonormal)(ys)
  for i in range(2):
    alone, _ = jax.jit(sharded.orthonormal)(ys[i])
    np.testing.assert_allclose(q[i], alone, atol=1e-6)


@pytest.mark.parametrize(
  "y", [_rank_deficient(40, 6, 3), _factor(40, 6, 1e12)], ids=["rank_3_of_6", "condition_1e12"]
)
def test_a_rank_deficient_factor_gets_an_orthonormal_basis_of_its_range(y):
  """A thin QR of a rank-deficient matrix is not unique: any orthonormal Q whose span
  holds the columns of Y is one, and the shifted passes give one with no fallback."""
  q, ok = jax.jit(sharded.orthonormal)(jnp.asarray(y[None], jnp.float32))
  q_cholesky = jax.jit(sharded.cholesky_qr)(jnp.asarray(y[None], jnp.float32))
  assert float(sharded.orthonormality_error(q_cholesky)[0]) < 1e-5  # No fallback needed.
  q = np.asarray(q[0], np.float64)
  assert bool(ok[0]) and ref.orthonormality_error(q) < 1e-5
  outside = y - q @ (q.T @ y)
  assert np.linalg.norm(outside) < 1e-5 * np.linalg.norm(y)


@pytest.mark.parametrize(
  "failing",
  [np.zeros((40, 6)), 1e21 * _factor(40, 6, 1e2)],
  ids=["zero", "gram_overflows"],  # Cholesky of a zero Gram; a Gram of 1e42 is inf in float32.
)
def test_a_failing_matrix_falls_back_alone_to_householder_qr(failing):
  good = _factor(40, 6, 1e2)
  ys = jnp.asarray(np.stack([good, failing, good]), jnp.float32)
  cholesky = np.asarray(jax.jit(sharded.cholesky_qr)(ys))
  assert not np.any(np.isfinite(cholesky[1]))  # The Cholesky-QR alone is NaN there...
  q, ok = jax.jit(sharded.orthonormal)(ys)
  assert np.asarray(ok).tolist() == [True, True, True]
  q = np.asarray(q)
  assert np.all(np.isfinite(q))
  # ...so that matrix takes Householder QR's Q, and only it: the others keep Cholesky's.
  np.testing.assert_allclose(q[1], np.asarray(jnp.linalg.qr(ys[1])[0]), atol=1e-6)
  np.testing.assert_allclose(q[[0, 2]], cholesky[[0, 2]], atol=1e-6)
  assert ref.orthonormality_error(q[1]) < 1e-5


def test_a_matrix_with_no_basis_is_reported_not_returned_as_nan():
  ys = jnp.asarray(np.stack([_factor(40, 6, 1e2), np.full((40, 6), np.nan)]), jnp.float32)
  q, ok = jax.jit(sharded.orthonormal)(ys)
  assert np.asarray(ok).tolist() == [True, False]


def test_the_fallback_runs_only_when_a_matrix_failed():
  """One QR custom call, inside a conditional branch: a batch that needs no fallback
  runs only products and Cholesky factorizations."""
  text = jax.jit(sharded.orthonormal).lower(jnp.ones((4, 32, 5))).compile().as_text()
  qr = hlo.linear_algebra_calls(text, "qr")
  assert len(qr) == 1 and qr[0].depth == 1
  cholesky = hlo.linear_algebra_calls(text, "cholesky")
  assert len(cholesky) == 4 and all(c.depth == 0 for c in cholesky)


def _split(y: np.ndarray, explicit: bool):
  axis_type = AxisType.Explicit if explicit else AxisType.Auto
  mesh = jax.make_mesh((4, 2), ("a", "fsdp"), axis_types=(axis_type,) * 2)
  spec = P(*(None,) * (y.ndim - 2), "fsdp", None)
  return mesh, jax.device_put(jnp.asarray(y, jnp.float32), NamedSharding(mesh, spec))


@pytest.mark.parametrize("condition", [1e1, 1e3, 1e6, 1e7])
def test_a_factor_split_by_rows_gets_the_thin_qr_q_without_a_gather(condition):
  ys = np.stack([_factor(96, 10, condition, seed=s) for s in range(2)])
  mesh, split = _split(ys, explicit=True)
  set_mesh = getattr(jax, "set_mesh", None) or jax.sharding.use_mesh
  with set_mesh(mesh):
    q, ok = jax.jit(sharded.orthonormal)(split)
  assert tuple(q.sharding.spec)[:2] == (None, "fsdp")  # Never gathered.
  assert bool(jnp.all(ok))
  q = np.asarray(q, np.float64)
  for i in range(2):
    assert ref.orthonormality_error(q[i]) < 1e-5
    np.testing.assert_allclose(q[i], _numpy_q(ys[i]), atol=_resolvable(condition))


def test_a_split_factor_that_fails_reports_it_instead_of_gathering():
  ys = np.stack([_factor(96, 10, 1e2), 1e21 * _factor(96, 10, 1e2)])
  mesh, split = _split(ys, explicit=True)
  set_mesh = getattr(jax, "set_mesh", None) or jax.sharding.use_mesh
  with set_mesh(mesh):
    q, ok = jax.jit(sharded.orthonormal)(split)
  assert np.asarray(ok).tolist() == [True, False]
  assert ref.orthonormality_error(np.asarray(q[0])) < 1e-5
