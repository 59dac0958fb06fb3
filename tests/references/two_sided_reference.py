r"""An independent NumPy (float64) reference of the two-sided low-rank path (TSR-Adam).

Written from the design below, without reading ``lordo_jax``. For a ``p x q``
matrix with orthonormal bases U (``p x r``) and V (``q x r``), the local step is
MATH.md §3 with the one-sided projection replaced by the two-sided core:

.. math::
  A = G + E, \quad C = U^\top A V \ (r \times r), \quad E \leftarrow A - U C V^\top \\
  u \leftarrow \beta_1 u + (1 - \beta_1) C, \quad v \leftarrow \beta_2 v + (1 - \beta_2) C^2 \\
  D = \sqrt{\hat v} + \epsilon, \quad L = U (\hat u / D) V^\top, \quad
  \text{direction} = (1 - \omega) \frac{G}{\mu\, \mathrm{mean}(D)} + \omega L

A refresh from X takes U and V as the top-r left and right singular vectors of X,
each with canonical signs (largest-magnitude entry of each column positive).
``rotate`` carries the moments with :math:`R_U = U_\text{new}^\top U_\text{old}` and
:math:`R_V = V_\text{new}^\top V_\text{old}`:
:math:`u' = R_U u R_V^\top`,
:math:`\hat v' = |(R_U \odot R_U)\,\mathrm{var}\,(R_V \odot R_V)^\top + (R_U \hat m R_V^\top)^2|`.

Two runs: :class:`TwoSidedReference` is LoRDO (the M-worker reference of
``lordo_reference`` with these pieces), and :func:`run_low_rank_ddp` is low-rank DDP
(TSR-Adam): every step the averaged gradient, a refresh at steps 1, T + 1, ...
"""

from __future__ import annotations

import numpy as np

from tests.references import lordo_reference as ref


def two_sided_bases(x: np.ndarray, rank: int) -> tuple[tuple[np.ndarray, np.ndarray], dict]:
  """U, V: the top-r left and right singular vectors of X, canonical signs each."""
  u, s, vt = np.linalg.svd(x, full_matrices=False)
  bases = (ref.canonical_signs(u[:, :rank]), ref.canonical_signs(vt[:rank].T))
  gaps = (s[:rank] - s[1 : rank + 1]) / s[0]
  margin = min(ref.sign_margin(b) for b in bases)
  return bases, {"kind": "svd", "min_gap": float(gaps.min()), "sign_margin": margin}


def two_sided_direction(g, bases, st, t, cfg) -> np.ndarray:
  """The two-sided quasi-hyperbolic direction of one matrix; updates ``st``."""
  u_basis, v_basis = bases
  a = g + st.e if cfg.error_feedback else g
  c = u_basis.T @ a @ v_basis
  if cfg.error_feedback:
    st.e = a - u_basis @ c @ v_basis.T
  st.u = cfg.b1 * st.u + (1 - cfg.b1) * c
  st.v = cfg.b2 * st.v + (1 - cfg.b2) * c**2
  uh = st.u / (1 - cfg.b1**t)
  vh = st.v / (1 - cfg.b2**t)
  denom = np.sqrt(vh) + cfg.eps
  low = u_basis @ (uh / denom) @ v_basis.T
  return (1 - cfg.omega) * g / (cfg.mu * np.mean(denom)) + cfg.omega * low


def two_sided_transport(st, old, new, t, cfg) -> None:
  """Moments into the new bases: ``rotate`` / ``keep`` / ``reset``."""
  if cfg.transport == "keep":
    return
  if cfg.transport == "reset":
    st.u, st.v = np.zeros_like(st.u), np.zeros_like(st.v)
    return
  rot_u, rot_v = new[0].T @ old[0], new[1].T @ old[1]
  mh = st.u / (1 - cfg.b1**t)
  var = np.maximum(st.v / (1 - cfg.b2**t) - mh**2, 0.0)
  st.u = rot_u @ st.u @ rot_v.T
  vh = np.abs((rot_u * rot_u) @ var @ (rot_v * rot_v).T + (rot_u @ mh @ rot_v.T) ** 2)
  st.v = vh * (1 - cfg.b2**t)


class TwoSidedReference(ref.Reference):
  """LoRDO with the two-sided low-rank path (``svd`` projection only)."""

  def __init__(self, cfg: ref.Config, params: ref.Params, num_workers: int):
    super().__init__(cfg, params, num_workers)
    r = cfg.rank
    for states in self.states:
      for name in self.sides:
        states[name] = ref.LowRankState(np.zeros((r, r)), np.zeros((r, r)), states[name].e)

  def _refresh(self, name, x, q_old):
    bases, diag = two_sided_bases(x, self.cfg.rank)
    diag.update(leaf=name, t=self.t)
    self.diagnostics.append(diag)
    return bases

  def _low_rank_direction(self, g, name, st, t):
    return two_sided_direction(g, self.bases[name], st, t, self.cfg)

  def _transport(self, st, name, q_old, q_new, t):
    two_sided_transport(st, q_old, q_new, t, self.cfg)


def run_low_rank_ddp(cfg, params, x, y, refresh_every):
  """Two-sided low-rank Adam on the workers' mean gradient (TSR-Adam), plus AdamW.

  ``w`` is low-rank, ``b`` takes AdamW; U, V come from the mean gradient at steps
  1, T + 1, 2T + 1, ... with ``cfg.transport``. Returns the params after each step
  and the conditioning diagnostics of every refresh.
  """
  params = {k: np.asarray(v, np.float64).copy() for k, v in params.items()}
  r = cfg.rank
  low = ref.LowRankState(np.zeros((r, r)), np.zeros((r, r)), np.zeros_like(params["w"]))
  adam = ref.AdamState(np.zeros_like(params["b"]), np.zeros_like(params["b"]))
  bases, diagnostics, trajectory = None, [], []
  for step in range(x.shape[0]):
    t = step + 1
    grads = [ref.regression_grads(params, x[step, m], y[step, m]) for m in range(x.shape[1])]
    mean = {k: np.mean([g[k] for g in grads], axis=0) for k in params}
    if (t - 1) % refresh_every == 0:
      new, diag = two_sided_bases(mean["w"], r)
      diagnostics.append(diag)
      if bases is not None:
        two_sided_transport(low, bases, new, t - 1, cfg)
      bases = new
    directions = {
      "w": two_sided_direction(mean["w"], bases, low, t, cfg),
      "b": ref.adam_direction(mean["b"], adam, t, cfg),
    }
    params = {
      k: w - cfg.learning_rate * (directions[k] + cfg.weight_decay * w) for k, w in params.items()
    }
    trajectory.append({k: v.copy() for k, v in params.items()})
  return trajectory, diagnostics
