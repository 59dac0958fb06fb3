"""lordo_jax._sharded.orthonormal: a batched Cholesky-QR with the thin QR's Q, and its fallback.

The reference is NumPy's Householder QR in float64 (signs fixed so R has a positive
diagonal). A plain Cholesky-QR in float32 breaks down near condition number 1e3-1e4
(the Gram squares it past 1/u); the shifted passes must hold to 1e7, batched and split
by rows; beyond, and for rank-deficient or zero matrices, a matrix falls back alone to
Householder QR (unsplit) or reports ``ok=False`` (split), never a NaN.
"""

import re

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
_orthonormal = jax.jit(lambda y: sharded.orthonormal([y])[0])
_cholesky_qr = jax.jit(lambda y: sharded.cholesky_qr([y])[0])


@pytest.mark.parametrize("shape", [(96, 10), (768, 64)])
def test_a_batch_of_ill_conditioned_factors_gets_the_thin_qr_q_without_a_fallback(shape):
  ys = np.stack([_factor(*shape, c, seed=i) for i, c in enumerate(CONDITIONS)])
  q_cholesky = _cholesky_qr(jnp.asarray(ys, jnp.float32))
  # The Cholesky passes alone hold at every conditioning: no fallback is needed.
  assert np.all(np.asarray(sharded.orthonormality_error(q_cholesky)) < 1e-5)
  q, ok = _orthonormal(jnp.asarray(ys, jnp.float32))
  assert ok.shape == (len(CONDITIONS),) and bool(jnp.all(ok))
  q = np.asarray(q, np.float64)
  for i, condition in enumerate(CONDITIONS):
    assert ref.orthonormality_error(q[i]) < 1e-5, condition
    np.testing.assert_allclose(q[i], _numpy_q(ys[i]), atol=_resolvable(condition))


def test_each_matrix_of_a_batch_is_orthonormalised_as_it_would_be_alone():
  ys = jnp.asarray(np.stack([_factor(64, 8, c, seed=i) for i, c in enumerate((1e1, 1e4))]))
  q, _ = _orthonormal(ys)
  for i in range(2):
    alone, _ = _orthonormal(ys[i])
    np.testing.assert_allclose(q[i], alone, atol=1e-6)


@pytest.mark.parametrize(
  "y", [_rank_deficient(40, 6, 3), _factor(40, 6, 1e12)], ids=["rank_3_of_6", "condition_1e12"]
)
def test_a_rank_deficient_factor_gets_an_orthonormal_basis_of_its_range(y):
  """A thin QR of a rank-deficient matrix is not unique: any orthonormal Q whose span
  holds the columns of Y is one, and the shifted passes give one with no fallback."""
  q, ok = _orthonormal(jnp.asarray(y[None], jnp.float32))
  q_cholesky = _cholesky_qr(jnp.asarray(y[None], jnp.float32))
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
  cholesky = np.asarray(_cholesky_qr(ys))
  assert not np.any(np.isfinite(cholesky[1]))  # The Cholesky-QR alone is NaN there...
  q, ok = _orthonormal(ys)
  assert np.asarray(ok).tolist() == [True, True, True]
  q = np.asarray(q)
  assert np.all(np.isfinite(q))
  # ...so that matrix takes Householder QR's Q, and only it: the others keep Cholesky's.
  np.testing.assert_allclose(q[1], np.asarray(jnp.linalg.qr(ys[1])[0]), atol=1e-6)
  np.testing.assert_allclose(q[[0, 2]], cholesky[[0, 2]], atol=1e-6)
  assert ref.orthonormality_error(q[1]) < 1e-5


def test_a_matrix_with_no_basis_is_reported_not_returned_as_nan():
  ys = jnp.asarray(np.stack([_factor(40, 6, 1e2), np.full((40, 6), np.nan)]), jnp.float32)
  q, ok = _orthonormal(ys)
  assert np.asarray(ok).tolist() == [True, False]


def test_the_fallback_runs_only_when_a_matrix_failed():
  """One QR custom call, inside a conditional branch: a batch that needs no fallback
  runs only products and Cholesky factorizations."""
  text = _orthonormal.lower(jnp.ones((4, 32, 5))).compile().as_text()
  qr = hlo.linear_algebra_calls(text, "qr")
  assert len(qr) == 1 and qr[0].depth == 1
  cholesky = hlo.linear_algebra_calls(text, "cholesky")
  assert len(cholesky) == 4 and all(c.depth == 0 for c in cholesky)


GROUPS = [(3, 64, 8), (2, 40, 8), (1, 96, 8)]  # (matrices, n, r): three shape groups.


def _groups(failing: tuple = ()) -> list[jax.Array]:
  """One batch per group, conditioned 1e1 to 1e5; the (group, matrix) in ``failing``
  zero, which no Cholesky factorization survives."""
  ys = []
  for g, (count, n, r) in enumerate(GROUPS):
    batch = [_factor(n, r, 10.0 ** (1 + 2 * i), seed=10 * g + i) for i in range(count)]
    batch = [np.zeros((n, r)) if (g, i) in failing else y for i, y in enumerate(batch)]
    ys.append(jnp.asarray(np.stack(batch), jnp.float32))
  return ys


def test_the_groups_of_a_refresh_are_orthonormalised_as_each_would_be_alone():
  together = jax.jit(sharded.orthonormal)(_groups())
  for y, (q, ok) in zip(_groups(), together, strict=True):
    alone, alone_ok = _orthonormal(y)
    np.testing.assert_allclose(q, alone, atol=1e-6)
    assert bool(jnp.all(ok)) and bool(jnp.all(alone_ok))


def test_the_groups_share_one_factorization_per_pass_and_one_fallback():
  """Every Gram is ``r x r`` whatever the group's n: the four passes are four
  Cholesky calls over all the groups' matrices, and the fallback one conditional.
  (On the CPU of jaxlib before 0.12, which loops over a batch's matrices anyway, each
  group keeps its own call per pass.)"""
  text = jax.jit(sharded.orthonormal).lower(_groups()).compile().as_text()
  cholesky = hlo.linear_algebra_calls(text, "cholesky")
  looped = jax.default_backend() == "cpu" and jax.__version_info__ < (0, 12)
  assert len(cholesky) == 4 * (len(GROUPS) if looped else 1)
  assert all(c.depth == 0 for c in cholesky)
  matrices = sum(count for count, _, _ in GROUPS)
  dims = lambda call: call.result_type.split("[", 1)[1].split("]", 1)[0]  # noqa: E731
  # A group of one matrix is a call of one (in no loop) where it keeps its own.
  assert all(c.in_loop == looped or dims(c) == "8,8" for c in cholesky)
  assert all(dims(c) == ("8,8" if looped else f"{matrices},8,8") for c in cholesky)
  qr = hlo.linear_algebra_calls(text, "qr")
  assert len(qr) == len(GROUPS) and all(c.depth == 1 for c in qr)
  assert sum(" conditional(" in line for _, line in hlo.lines_by_depth(text)) == 1


def test_the_program_for_a_gpu_stacks_the_groups_grams():
  """Lowered for CUDA (no GPU needed): each pass one Cholesky call and one triangular
  solve of all the groups' ``r x r`` Grams, stacked, whatever JAX does on this CPU."""
  text = jax.jit(sharded.orthonormal).trace(_groups()).lower(lowering_platforms=("cuda",))
  text = text.as_text()
  stack = f"tensor<{sum(count for count, _, _ in GROUPS)}x8x8xf32>"
  cholesky = [line for line in text.splitlines() if re.search(r"\bcall @cholesky\(", line)]
  solves = [line for line in text.splitlines() if "stablehlo.triangular_solve" in line]
  assert len(cholesky) == len(solves) == 4
  assert all(f"({stack}) -> {stack}" in line for line in cholesky)
  assert all(f"({stack}, {stack})" in line for line in solves)
  assert "cusolver_potrf_ffi" in text


def test_a_failing_matrix_of_one_group_falls_back_alone():
  together = jax.jit(sharded.orthonormal)(_groups(failing=((1, 0),)))
  for g, (y, (q, ok)) in enumerate(zip(_groups(), together, strict=True)):
    assert bool(jnp.all(ok))
    q = np.asarray(q, np.float64)
    for i in range(len(q)):
      assert ref.orthonormality_error(q[i]) < 1e-5
      if (g, i) != (1, 0):
        np.testing.assert_allclose(q[i], np.asarray(_orthonormal(y)[0][i]), atol=1e-6)


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
    q, ok = _orthonormal(split)
  assert tuple(q.sharding.spec)[:2] == (None, "fsdp")  # Never gathered.
  assert bool(jnp.all(ok))
  q = np.asarray(q, np.float64)
  for i in range(2):
    assert ref.orthonormality_error(q[i]) < 1e-5
    np.testing.assert_allclose(q[i], _numpy_q(ys[i]), atol=_resolvable(condition))


def test_a_split_factor_and_a_whole_one_are_orthonormalised_together():
  """FSDP beside a whole matrix: the split factor's Gram joins the others', its rows
  stay split, and only the whole one has a fallback."""
  ys = np.stack([_factor(96, 10, 1e3, seed=s) for s in range(2)])
  whole = np.stack([_factor(40, 10, 1e2, seed=5)])
  mesh, split = _split(ys, explicit=True)
  set_mesh = getattr(jax, "set_mesh", None) or jax.sharding.use_mesh
  with set_mesh(mesh):
    (q, ok), (q_whole, ok_whole) = jax.jit(sharded.orthonormal)([split, jnp.asarray(whole)])
  assert tuple(q.sharding.spec)[:2] == (None, "fsdp")
  assert bool(jnp.all(ok)) and bool(jnp.all(ok_whole))
  for i in range(2):
    np.testing.assert_allclose(np.asarray(q[i]), _numpy_q(ys[i]), atol=_resolvable(1e3))
  np.testing.assert_allclose(np.asarray(q_whole[0]), _numpy_q(whole[0]), atol=_resolvable(1e2))


def test_a_split_factor_that_fails_reports_it_instead_of_gathering():
  ys = np.stack([_factor(96, 10, 1e2), 1e21 * _factor(96, 10, 1e2)])
  mesh, split = _split(ys, explicit=True)
  set_mesh = getattr(jax, "set_mesh", None) or jax.sharding.use_mesh
  with set_mesh(mesh):
    q, ok = _orthonormal(split)
  assert np.asarray(ok).tolist() == [True, False]
  assert ref.orthonormality_error(np.asarray(q[0])) < 1e-5
