"""NumPy references shared by the basis-strategy tests (``tests/local/test_basis_*.py``).

Written from the math in the modules' docstrings, in float64, with nothing from
``lordo_jax``: the strategies are checked against these, never against themselves.
"""

import numpy as np


def canonical(q):
  """Each column flipped so that its largest-magnitude entry (the first such) is positive."""
  q = np.array(q, dtype=np.float64, copy=True)
  for j in range(q.shape[1]):
    if q[np.argmax(np.abs(q[:, j])), j] < 0:
      q[:, j] *= -1
  return q


def separated(p, q, rank, seed=0, top=(10.0, 7.0, 5.0, 3.5), tail=(1.0, 0.1)):
  """A ``p x q`` float64 matrix with distinct top-``rank`` singular values far above the rest.

  The top ones are ``top[:rank]`` (distinct, so each singular vector is defined up to
  sign), the others spread over ``tail``: the gap makes float32 SVDs agree with
  NumPy's to about 1e-6.
  """
  rng = np.random.default_rng(seed)
  k = min(p, q)
  values = np.concatenate([np.asarray(top[:rank]), np.linspace(*tail, k - rank)])
  u = np.linalg.qr(rng.standard_normal((p, k)))[0]
  v = np.linalg.qr(rng.standard_normal((q, k)))[0]
  return (u * values) @ v.T


def top_left(x, rank):
  """The first ``rank`` left singular vectors of ``x``, canonical signs."""
  return canonical(np.linalg.svd(np.asarray(x, np.float64))[0][:, :rank])


def top_right(x, rank):
  """The first ``rank`` right singular vectors of ``x``, canonical signs."""
  return canonical(np.linalg.svd(np.asarray(x, np.float64))[2][:rank].T)


def subspace_iterate(x, q, iterations, left):
  """``iterations`` times Q <- qr(X X^T Q) (left) or qr(X^T X Q) (right); canonical signs."""
  x, q = np.asarray(x, np.float64), np.asarray(q, np.float64)
  for _ in range(iterations):
    q = np.linalg.qr(x @ (x.T @ q) if left else x.T @ (x @ q))[0]
  return canonical(q)


def largest_angle(a, b):
  """The largest principal angle (radians) between the column spans of a and b."""
  qa = np.linalg.qr(np.asarray(a, np.float64))[0]
  qb = np.linalg.qr(np.asarray(b, np.float64))[0]
  cosines = np.linalg.svd(qa.T @ qb, compute_uv=False)
  return float(np.arccos(np.clip(cosines.min(), -1.0, 1.0)))


def dct_matrix(n):
  r"""The orthonormal ``n x n`` DCT-II basis, :math:`\sqrt{2/n} c_j \cos(\pi (i + 1/2) j / n)`."""
  i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
  c = np.where(j == 0, 1 / np.sqrt(2), 1.0)
  return np.sqrt(2 / n) * c * np.cos(np.pi * (i + 0.5) * j / n)


def orthonormality_error(q):
  """:math:`\\max |Q^\\top Q - I|`."""
  q = np.asarray(q, np.float64)
  return float(np.max(np.abs(q.T @ q - np.eye(q.shape[1]))))


def randomized_range(x, omega, power_iterations):
  """Halko's range finder: Q = qr(X Omega), then k times Q = qr(X qr(X^T Q))."""
  x, omega = np.asarray(x, np.float64), np.asarray(omega, np.float64)
  q = np.linalg.qr(x @ omega)[0]
  for _ in range(power_iterations):
    q = np.linalg.qr(x @ np.linalg.qr(x.T @ q)[0])[0]
  return q


def one_sided_randomized(x, omega, rank, power_iterations, left):
  """One-sided randomized SVD: Q U_B[:, :r], B = Q^T X, Q the range of X from the
  ``q x l`` sketch omega (left); the left case of X^T from a ``p x l`` omega (right).
  Canonical signs."""
  x = np.asarray(x, np.float64) if left else np.asarray(x, np.float64).T
  q = randomized_range(x, omega, power_iterations)
  u_b = np.linalg.svd(q.T @ x, full_matrices=False)[0]
  return canonical(q @ u_b[:, :rank])
