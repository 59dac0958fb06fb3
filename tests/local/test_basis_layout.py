"""bases/layout.orthonormal on a factor split by rows: the thin QR's Q, even ill-conditioned.

The reference is NumPy's Householder QR of the whole matrix (signs fixed so R has a
positive diagonal). A plain Cholesky-QR in float32 breaks down near condition number
1e3-1e4 (the Gram squares it past 1/u); the shifted Cholesky-QR3 must hold to 1e6.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from lordo_jax.local.bases import layout
from tests import basis_numpy as ref


def _factor(n: int, r: int, condition: float, seed: int = 0) -> np.ndarray:
  """An ``n x r`` float32 matrix with singular values spread from 1 to 1/condition."""
  rng = np.random.default_rng(seed)
  left, _ = np.linalg.qr(rng.standard_normal((n, r)))
  right, _ = np.linalg.qr(rng.standard_normal((r, r)))
  return (left * np.geomspace(1.0, 1.0 / condition, r)) @ right.T


def _numpy_q(y: np.ndarray) -> np.ndarray:
  q, r = np.linalg.qr(y.astype(np.float64))
  return q * np.sign(np.diag(r))


@pytest.mark.parametrize("condition", [1e1, 1e3, 1e5, 1e6])
def test_split_factor_gets_the_thin_qr_q(condition):
  mesh = jax.make_mesh((4, 2), ("a", "fsdp"), axis_types=(AxisType.Explicit,) * 2)
  y = _factor(96, 10, condition)
  split = jax.device_put(jnp.asarray(y, jnp.float32), NamedSharding(mesh, P("fsdp", None)))
  set_mesh = getattr(jax, "set_mesh", None) or jax.sharding.use_mesh
  with set_mesh(mesh):
    q = jax.jit(layout.orthonormal)(split)
  assert tuple(q.sharding.spec)[:1] == ("fsdp",)  # Never gathered.
  q = np.asarray(q, np.float64)
  assert np.all(np.isfinite(q))
  assert ref.orthonormality_error(q) < 1e-5
  # Columns that carry more than rounding are the QR's, to what float32 can resolve.
  np.testing.assert_allclose(q, _numpy_q(y), atol=max(1e-5, 3e-8 * condition))


def test_unsplit_factor_takes_householder_qr():
  y = jnp.asarray(_factor(40, 6, 1e2), jnp.float32)
  np.testing.assert_array_equal(np.asarray(layout.orthonormal(y)), np.asarray(jnp.linalg.qr(y)[0]))
