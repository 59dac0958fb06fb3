r"""An independent NumPy (float64) reference of LoRDO, MATH.md §3-5.

Written from the mathematics alone (``docs/MATH.md``, the project's specification),
without reading ``lordo_jax``: the tests compare the package against it. No JAX here, on purpose.

It simulates M workers explicitly (lists indexed by worker) and follows the mathematics
step by step:

* MATH.md §2 routing and sides: a 2-D leaf with ``min(p, q) > rank`` is low-rank;
  ``auto`` projects on the left when ``p >= q``. Every other leaf takes the
  full-rank path (AdamW).
* MATH.md §3 the local step (error feedback, projected Adam moments, quasi-hyperbolic
  mix with the full-rank term, both ``full_rank_scale`` modes, decoupled weight
  decay).
* MATH.md §4 the synchronisation every K steps (pseudo-gradient average, default outer
  optimizer = plain averaging, moment averaging every ``sync_moments_every`` syncs,
  projection refresh, moment transport ``rotate`` / ``keep`` / ``reset``) and the
  initial projection ``"gradient"``.
* MATH.md §5 the three projections (``svd``, ``subspace_iteration``, ``dct``) with
  canonical signs.
* The LoRDO authors' variants (``docs/FIDELITY.md``, "The paper's variants as
  options"), each a flag of ``Config`` whose default is the mathematics': the
  full-rank term's numerator G + E (``full_rank_numerator="error_fed"``), QHAdam
  inside the projection (``qh_nu``) and on the full-rank path (``full_rank_nu``), the
  low-rank term without D
  (``low_rank_term="momentum"``), and GaLore's standard side (``side="galore_std"``:
  right when p > q, else left).
* Low-rank DDP (MATH.md §6): :func:`run_low_rank_ddp`, §3's step on the workers' mean
  gradient with the basis refreshed from it every T steps.

Choices made where the mathematics is silent (kept explicit so a mismatch is easy to
discuss):

* The n-th sync (n = t / K, counted from 1) averages the moments when
  ``n % sync_moments_every == 0``, i.e. when ``t % (K * sync_moments_every) == 0``.
* ``reset`` zeroes u and v but keeps the step count t (bias correction continues
  from t).
* The DCT basis columns are used as they are (no sign flip): the basis is fixed.
* Right side is computed as the left side of the transpose: right singular vectors
  of X are the left singular vectors of X^T, subspace iteration is
  ``Q = qr(X^T (X Q)).Q``, a DCT column j of size q is scored by ``||X B_j||``.

Each projection computed records conditioning diagnostics in
``Reference.diagnostics`` so a test can check that float32 rounding cannot change a
discrete choice (order of singular vectors, canonical sign, DCT selection).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

Params = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Config:
  """The hyperparameters of ``lordo_jax.lordo`` that the reference covers."""

  learning_rate: float
  rank: int
  sync_every: int
  omega: float = 0.7
  mu: float = 1.0
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  weight_decay: float = 0.0
  projection: str = "svd"
  side: str = "auto"
  transport: str = "rotate"
  error_feedback: bool = False
  full_rank_scale: str = "scalar"
  sync_moments_every: int = 1
  subspace_iterations: int = 2
  init_projection: str = "gradient"
  full_rank_numerator: str = "gradient"  # or "error_fed": F = (G + E_before) / (mu s)
  qh_nu: float = 1.0  # L = Q (((1 - nu) c + nu uh) / D)
  low_rank_term: str = "adam"  # or "momentum": L = Q uh (no D)
  full_rank_nu: float = 1.0  # full-rank path: ((1 - nu) g + nu mh) / (sqrt(vh) + eps)


# --------------------------------------------------------------------------- §2


def is_low_rank(leaf: np.ndarray, rank: int) -> bool:
  """MATH.md §2: default routing, a 2-D leaf with min(p, q) > rank is low-rank."""
  return leaf.ndim == 2 and min(leaf.shape) > rank


def resolve_side(shape: tuple[int, int], side: str) -> str:
  """MATH.md §2: ``auto`` is ``left`` when p >= q, otherwise ``right``.

  ``galore_std`` keeps the moments on the larger dimension: ``right`` when p > q,
  otherwise ``left`` (a square matrix on the left).
  """
  if side == "auto":
    return "left" if shape[0] >= shape[1] else "right"
  if side == "galore_std":
    return "right" if shape[0] > shape[1] else "left"
  if side not in ("left", "right"):
    raise ValueError(f"unknown side {side!r}")
  return side


def project(q_basis: np.ndarray, x: np.ndarray, side: str) -> np.ndarray:
  """MATH.md §2: coordinates, C = Q^T X (left, r x q) or C = X Q (right, p x r)."""
  return q_basis.T @ x if side == "left" else x @ q_basis


def unproject(q_basis: np.ndarray, c: np.ndarray, side: str) -> np.ndarray:
  """MATH.md §2: back to p x q, Q C (left) or C Q^T (right)."""
  return q_basis @ c if side == "left" else c @ q_basis.T


# --------------------------------------------------------------------------- §5


def canonical_signs(q_basis: np.ndarray) -> np.ndarray:
  """MATH.md §5: flip each column so that its largest-magnitude entry is positive."""
  idx = np.argmax(np.abs(q_basis), axis=0)
  signs = np.sign(q_basis[idx, np.arange(q_basis.shape[1])])
  signs[signs == 0] = 1.0
  return q_basis * signs


def sign_margin(q_basis: np.ndarray) -> float:
  """How safe the canonical sign is: min over columns of (|a1| - |a2|) / |a1|.

  a1, a2 are the two largest-magnitude entries of a column; a tie only matters
  when they have opposite signs, so columns where they agree count as +inf.
  """
  margins = [np.inf]
  for col in q_basis.T:
    order = np.argsort(-np.abs(col))
    a1, a2 = col[order[0]], col[order[1]]
    if np.sign(a1) != np.sign(a2):
      margins.append((abs(a1) - abs(a2)) / abs(a1))
  return float(min(margins))


def dct_basis(n: int) -> np.ndarray:
  """MATH.md §5: orthonormal DCT-II basis, B[i, j] = sqrt(2/n) c_j cos(pi (i+1/2) j / n)."""
  i = np.arange(n)[:, None]
  j = np.arange(n)[None, :]
  c = np.where(j == 0, 1.0 / np.sqrt(2.0), 1.0)
  return np.sqrt(2.0 / n) * c * np.cos(np.pi * (i + 0.5) * j / n)


def svd_projection(x: np.ndarray, rank: int) -> tuple[np.ndarray, dict]:
  """MATH.md §5 ``svd`` (left form): the top-r left singular vectors, canonical signs."""
  u, s, _ = np.linalg.svd(x, full_matrices=False)
  q_basis = canonical_signs(u[:, :rank])
  gaps = (s[:rank] - s[1 : rank + 1]) / s[0]
  diag = {"kind": "svd", "min_gap": float(gaps.min()), "sign_margin": sign_margin(q_basis)}
  return q_basis, diag


def subspace_iteration_projection(
  x: np.ndarray, q_old: np.ndarray, rank: int, iterations: int
) -> tuple[np.ndarray, dict]:
  """MATH.md §5 ``subspace_iteration`` (left form): n times Q = qr(X (X^T Q)).Q."""
  q_basis = q_old
  worst_cond = 1.0
  for _ in range(iterations):
    y = x @ (x.T @ q_basis)
    worst_cond = max(worst_cond, float(np.linalg.cond(y)))
    q_basis, _ = np.linalg.qr(y)
  q_basis = canonical_signs(q_basis[:, :rank])
  diag = {"kind": "subspace_iteration", "cond": worst_cond, "sign_margin": sign_margin(q_basis)}
  return q_basis, diag


def dct_projection(x: np.ndarray, rank: int) -> tuple[np.ndarray, dict]:
  """MATH.md §5 ``dct`` (left form): the r DCT columns with largest ||B_j^T X||.

  The kept columns are in ascending index order. The diagnostic ``score_gap`` is
  the relative gap between the r-th and (r+1)-th best scores.
  """
  basis = dct_basis(x.shape[0])
  scores = np.linalg.norm(basis.T @ x, axis=1)
  best = np.argsort(-scores, kind="stable")
  kept = np.sort(best[:rank])
  sorted_scores = scores[best]
  gap = (sorted_scores[rank - 1] - sorted_scores[rank]) / sorted_scores[0]
  diag = {"kind": "dct", "score_gap": float(gap), "indices": kept.tolist()}
  return basis[:, kept], diag


def compute_projection(
  x: np.ndarray, q_old: np.ndarray | None, cfg: Config, side: str
) -> tuple[np.ndarray, dict]:
  """MATH.md §5 ComputeProjection(X), either side (right = left of X^T).

  With ``subspace_iteration`` and no previous basis (the initial projection,
  MATH.md §4.7) it is an exact SVD.
  """
  xl = x if side == "left" else x.T
  if cfg.projection == "svd" or (cfg.projection == "subspace_iteration" and q_old is None):
    return svd_projection(xl, cfg.rank)
  if cfg.projection == "subspace_iteration":
    return subspace_iteration_projection(xl, q_old, cfg.rank, cfg.subspace_iterations)
  if cfg.projection == "dct":
    return dct_projection(xl, cfg.rank)
  raise ValueError(f"unknown projection {cfg.projection!r}")


# --------------------------------------------------------------------------- §3


@dataclasses.dataclass
class LowRankState:
  """One worker's state of one low-rank leaf (MATH.md §3): moments and error buffer."""

  u: np.ndarray
  v: np.ndarray
  e: np.ndarray


@dataclasses.dataclass
class AdamState:
  """One worker's state of one full-rank leaf (MATH.md §3, last bullet)."""

  m: np.ndarray
  v: np.ndarray


def full_rank_scale(denom: np.ndarray, cfg: Config, side: str) -> np.ndarray:
  """MATH.md §3: s, the mean of D (``scalar``) or its mean over the r axis (``vector``)."""
  if cfg.full_rank_scale == "scalar":
    return np.mean(denom)
  if cfg.full_rank_scale == "vector":
    axis = 0 if side == "left" else 1  # left: D is r x q; right: D is p x r.
    return np.mean(denom, axis=axis, keepdims=True)
  raise ValueError(f"unknown full_rank_scale {cfg.full_rank_scale!r}")


def low_rank_direction(
  g: np.ndarray,
  q_basis: np.ndarray,
  st: LowRankState,
  t: int,
  cfg: Config,
  side: str,
) -> np.ndarray:
  """MATH.md §3: the quasi-hyperbolic direction of one low-rank leaf; updates ``st``.

  With the variants' flags: the numerator of L is ``(1 - qh_nu) c + qh_nu uh``,
  divided by D unless ``low_rank_term="momentum"``; the full-rank term's numerator
  is ``a = G + E`` (E before this step) with ``full_rank_numerator="error_fed"``.
  """
  a = g + st.e if cfg.error_feedback else g
  c = project(q_basis, a, side)
  if cfg.error_feedback:
    st.e = a - unproject(q_basis, c, side)
  st.u = cfg.b1 * st.u + (1 - cfg.b1) * c
  st.v = cfg.b2 * st.v + (1 - cfg.b2) * c**2
  uh = st.u / (1 - cfg.b1**t)
  vh = st.v / (1 - cfg.b2**t)
  denom = np.sqrt(vh) + cfg.eps
  numerator = (1 - cfg.qh_nu) * c + cfg.qh_nu * uh
  if cfg.low_rank_term == "adam":
    numerator = numerator / denom
  elif cfg.low_rank_term != "momentum":
    raise ValueError(f"unknown low_rank_term {cfg.low_rank_term!r}")
  low = unproject(q_basis, numerator, side)
  if cfg.full_rank_numerator not in ("gradient", "error_fed"):
    raise ValueError(f"unknown full_rank_numerator {cfg.full_rank_numerator!r}")
  full_numerator = a if cfg.full_rank_numerator == "error_fed" else g
  full = full_numerator / (cfg.mu * full_rank_scale(denom, cfg, side))
  return (1 - cfg.omega) * full + cfg.omega * low


def adam_direction(g: np.ndarray, st: AdamState, t: int, cfg: Config) -> np.ndarray:
  """MATH.md §3 (full-rank path): the Adam direction of AdamW; updates ``st``.

  QHAdam's numerator ``(1 - full_rank_nu) g + full_rank_nu mh`` (``mh`` by default).
  """
  st.m = cfg.b1 * st.m + (1 - cfg.b1) * g
  st.v = cfg.b2 * st.v + (1 - cfg.b2) * g**2
  mh = st.m / (1 - cfg.b1**t)
  vh = st.v / (1 - cfg.b2**t)
  return ((1 - cfg.full_rank_nu) * g + cfg.full_rank_nu * mh) / (np.sqrt(vh) + cfg.eps)


# --------------------------------------------------------------------------- §4


def transport_moments(
  st: LowRankState,
  q_old: np.ndarray,
  q_new: np.ndarray,
  t: int,
  cfg: Config,
  side: str,
) -> None:
  """MATH.md §4.6: move u, v into the new basis (``rotate`` / ``keep`` / ``reset``)."""
  if cfg.transport == "keep":
    return
  if cfg.transport == "reset":
    st.u = np.zeros_like(st.u)
    st.v = np.zeros_like(st.v)
    return
  if cfg.transport != "rotate":
    raise ValueError(f"unknown transport {cfg.transport!r}")
  rot = q_new.T @ q_old  # r x r
  mh = st.u / (1 - cfg.b1**t)
  vh = st.v / (1 - cfg.b2**t)
  var = np.maximum(vh - mh**2, 0.0)
  if side == "left":
    st.u = rot @ st.u
    vh_new = np.abs((rot * rot) @ var + (rot @ mh) ** 2)
  else:
    st.u = st.u @ rot.T
    vh_new = np.abs(var @ (rot * rot).T + (mh @ rot.T) ** 2)
  st.v = vh_new * (1 - cfg.b2**t)


class Reference:
  """M LoRDO workers in float64 (MATH.md §3-5), default outer optimizer (averaging).

  Usage: ``ref = Reference(cfg, params, num_workers)``, then once per step
  ``ref.step(grads)`` with ``grads`` a list (one dict per worker). After the call,
  ``ref.params[m]`` are worker m's parameters, ``ref.local_params[m]`` its
  parameters right after the local step (before any sync), ``ref.bases`` the
  current projection of each low-rank leaf.
  """

  def __init__(self, cfg: Config, params: Params, num_workers: int):
    if cfg.init_projection != "gradient":
      raise NotImplementedError("only init_projection='gradient' is modelled")
    self.cfg = cfg
    self.num_workers = num_workers
    self.t = 0
    params = {k: np.asarray(v, np.float64) for k, v in params.items()}
    self.params = [{k: v.copy() for k, v in params.items()} for _ in range(num_workers)]
    self.local_params = [dict(p) for p in self.params]
    self.anchor = {k: v.copy() for k, v in params.items()}
    self.sides: dict[str, str] = {}
    self.bases: dict[str, np.ndarray] = {}
    self.states: list[dict[str, Any]] = []
    for _ in range(num_workers):
      per_leaf = {}
      for k, w in params.items():
        if is_low_rank(w, cfg.rank):
          side = resolve_side(w.shape, cfg.side)
          self.sides[k] = side
          cshape = (cfg.rank, w.shape[1]) if side == "left" else (w.shape[0], cfg.rank)
          per_leaf[k] = LowRankState(np.zeros(cshape), np.zeros(cshape), np.zeros_like(w))
        else:
          per_leaf[k] = AdamState(np.zeros_like(w), np.zeros_like(w))
      self.states.append(per_leaf)
    self.diagnostics: list[dict] = []

  def _refresh(self, name: str, x: np.ndarray, q_old: np.ndarray | None):
    q_new, diag = compute_projection(x, q_old, self.cfg, self.sides[name])
    diag.update(leaf=name, t=self.t)
    self.diagnostics.append(diag)
    return q_new

  def _mean(self, arrays: list[np.ndarray]) -> np.ndarray:
    return np.mean(np.stack(arrays), axis=0)

  def _first_mean(self, arrays: list[np.ndarray]) -> np.ndarray:
    """The workers' mean of a leaf's first gradient (a variant may send it compressed)."""
    return self._mean(arrays)

  def step(self, grads: list[Params]) -> list[Params]:
    """One step t on every worker: init projection, local step, maybe a sync."""
    cfg = self.cfg
    self.t += 1
    t = self.t
    if t == 1:  # MATH.md §4 initial projection from the averaged first gradient.
      for name in self.sides:
        self.bases[name] = self._refresh(name, self._first_mean([g[name] for g in grads]), None)
    for m in range(self.num_workers):  # MATH.md §3, local step.
      new = {}
      for name, w in self.params[m].items():
        st = self.states[m][name]
        if name in self.sides:
          direction = self._low_rank_direction(grads[m][name], name, st, t)
        else:
          direction = adam_direction(grads[m][name], st, t, cfg)
        new[name] = w - cfg.learning_rate * (direction + cfg.weight_decay * w)
      self.params[m] = new
    self.local_params = [dict(p) for p in self.params]
    if t % cfg.sync_every == 0:
      self._sync()
    return self.params

  def _sync(self) -> None:
    """MATH.md §4 steps 1-6 with the default outer optimizer (plain averaging)."""
    cfg, t = self.cfg, self.t
    deltas = {}
    for name, a in self.anchor.items():
      deltas[name] = self._mean([a - p[name] for p in self.params])
      theta = a - deltas[name]
      self.anchor[name] = theta
      for m in range(self.num_workers):
        self.params[m][name] = theta.copy()
    if t % (cfg.sync_every * cfg.sync_moments_every) == 0:
      for name in self.anchor:
        sts = [s[name] for s in self.states]
        for field in ("u", "v") if name in self.sides else ("m", "v"):
          avg = self._mean([getattr(s, field) for s in sts])
          for s in sts:
            setattr(s, field, avg.copy())
    for name in self.sides:
      q_old = self.bases[name]
      q_new = self._refresh(name, deltas[name], q_old)
      for m in range(self.num_workers):
        self._transport(self.states[m][name], name, q_old, q_new, t)
      self.bases[name] = q_new

  # The low-rank pieces, as methods so a variant (two-sided) can replace them.

  def _low_rank_direction(self, g, name, st, t):
    return low_rank_direction(g, self.bases[name], st, t, self.cfg, self.sides[name])

  def _transport(self, st, name, q_old, q_new, t):
    transport_moments(st, q_old, q_new, t, self.cfg, self.sides[name])


# ------------------------------------------------------------- a test problem


def make_regression(
  p: int,
  q: int,
  num_workers: int,
  steps: int,
  n: int = 32,
  seed: int = 0,
  spectrum: tuple[float, ...] = (4.0, 2.0, 1.0, 0.5),
  heterogeneity: float = 0.5,
  basis: str = "random",
  switch_at: int | None = None,
  spectrum_after: tuple[float, ...] | None = None,
) -> dict[str, np.ndarray]:
  """Per-worker, per-step least-squares data: Y = X (W*_t + H_m) + 0.3 + noise.

  W*_t = U diag(spectrum) V^T has well separated leading singular values; U and V
  are random orthonormal (``basis="random"``) or distinct DCT columns (``"dct"``).
  From step ``switch_at`` on (if given) the target is a second such matrix with
  ``spectrum_after``, in other directions, so the useful subspace moves. Each
  worker m adds its own random full-rank H_m, so pseudo-gradients leave any rank-r
  subspace, and draws a fresh X every step. Returns float64 arrays
  ``x`` (steps, M, n, p) and ``y`` (steps, M, n, q).
  """
  rng = np.random.default_rng(seed)
  k = len(spectrum)

  def factors(size, offset):
    if basis == "dct":
      cols = rng.permutation(size)[:k] if offset == 0 else None
      return dct_basis(size)[:, cols], cols
    return np.linalg.qr(rng.standard_normal((size, k)))[0], None

  u, cols_u = factors(p, 0)
  v, cols_v = factors(q, 0)
  targets = [(u * np.asarray(spectrum)) @ v.T]
  if switch_at is not None:
    if basis == "dct":  # frequencies not used by the first target
      free_u = np.setdiff1d(np.arange(p), cols_u)[:k]
      free_v = np.setdiff1d(np.arange(q), cols_v)[:k]
      u2, v2 = dct_basis(p)[:, free_u], dct_basis(q)[:, free_v]
    else:
      u2 = np.linalg.qr(rng.standard_normal((p, k)))[0]
      v2 = np.linalg.qr(rng.standard_normal((q, k)))[0]
    targets.append((u2 * np.asarray(spectrum_after or spectrum)) @ v2.T)
  hetero = [heterogeneity * rng.standard_normal((p, q)) / np.sqrt(p) for _ in range(num_workers)]
  xs = rng.standard_normal((steps, num_workers, n, p)) / np.sqrt(n)
  ys = np.empty((steps, num_workers, n, q))
  for t in range(steps):
    w_t = targets[1 if switch_at is not None and t + 1 >= switch_at else 0]
    for m in range(num_workers):
      noise = 0.05 * rng.standard_normal((n, q))
      ys[t, m] = xs[t, m] @ (w_t + hetero[m]) + 0.3 + noise
  return {"x": xs, "y": ys}


def regression_grads(params: Params, x: np.ndarray, y: np.ndarray) -> Params:
  """Gradient of 0.5 ||X W + 1 b^T - Y||^2 w.r.t. ``w`` (p x q) and ``b`` (q)."""
  r = x @ params["w"] + params["b"] - y
  return {"w": x.T @ r, "b": r.sum(axis=0)}


def initial_params(p: int, q: int, seed: int = 0) -> Params:
  """Starting point shared by all workers: small random W (p x q), zero bias."""
  rng = np.random.default_rng(1000 + seed)
  return {"w": 0.1 * rng.standard_normal((p, q)), "b": np.zeros(q)}


def run_low_rank_ddp(cfg: Config, params: Params, x: np.ndarray, y: np.ndarray, refresh_every: int):
  """Low-rank DDP (MATH.md §6) on the regression data; ``cfg.sync_every`` is not used.

  One model for all workers. At step t the workers' gradients are averaged,
  G = mean_m(G_m); at t = 1, T + 1, 2T + 1, ... (T = ``refresh_every``) every
  low-rank leaf's basis is computed from G (MATH.md §5) before the step, and from the
  second refresh on the moments are transported into it (MATH.md §4.6) with the count
  t - 1 of the steps they hold; then MATH.md §3's step on G (error feedback on G), the
  full-rank path's Adam on G, and update = -lr (direction + wd W).

  Returns ``(trajectory, diagnostics)``: the parameters after every step, and the
  conditioning of every projection computed (as ``Reference.diagnostics``).
  """
  params = {k: np.asarray(v, np.float64).copy() for k, v in params.items()}
  sides = {
    k: resolve_side(w.shape, cfg.side) for k, w in params.items() if is_low_rank(w, cfg.rank)
  }
  states: dict[str, Any] = {}
  for k, w in params.items():
    if k in sides:
      cshape = (cfg.rank, w.shape[1]) if sides[k] == "left" else (w.shape[0], cfg.rank)
      states[k] = LowRankState(np.zeros(cshape), np.zeros(cshape), np.zeros_like(w))
    else:
      states[k] = AdamState(np.zeros_like(w), np.zeros_like(w))
  bases: dict[str, np.ndarray] = {}
  trajectory, diagnostics = [], []
  for t in range(1, x.shape[0] + 1):
    per_worker = [regression_grads(params, x[t - 1, m], y[t - 1, m]) for m in range(x.shape[1])]
    g = {k: np.mean([gm[k] for gm in per_worker], axis=0) for k in params}
    if (t - 1) % refresh_every == 0:
      for k, side in sides.items():
        q_new, diag = compute_projection(g[k], bases.get(k), cfg, side)
        diagnostics.append({**diag, "leaf": k, "t": t})
        if k in bases:
          transport_moments(states[k], bases[k], q_new, t - 1, cfg, side)
        bases[k] = q_new
    for k, w in params.items():
      if k in sides:
        direction = low_rank_direction(g[k], bases[k], states[k], t, cfg, sides[k])
      else:
        direction = adam_direction(g[k], states[k], t, cfg)
      params[k] = w - cfg.learning_rate * (direction + cfg.weight_decay * w)
    trajectory.append({k: v.copy() for k, v in params.items()})
  return trajectory, diagnostics


def run(cfg: Config, params: Params, x: np.ndarray, y: np.ndarray, reference=None):
  """Run the reference on the regression data ``x[t-1]``, ``y[t-1]`` at step t.

  ``reference``: what builds the workers from ``(cfg, params, num_workers)``, a
  :class:`Reference` (default) or a variant of it (two-sided bases, a message in flight).
  Returns ``(reference, trajectory)``; ``trajectory[i]`` is a dict with the
  per-worker parameters after step i+1 (``params``), the per-worker parameters
  right after the local step (``local``) and the bases (``bases``).
  """
  ref = (reference or Reference)(cfg, params, x.shape[1])
  trajectory = []
  for t in range(x.shape[0]):  # t is the 0-based step index here
    grads = [regression_grads(ref.params[m], x[t, m], y[t, m]) for m in range(ref.num_workers)]
    ref.step(grads)
    trajectory.append(
      {
        "params": [{k: v.copy() for k, v in p.items()} for p in ref.params],
        "local": [{k: v.copy() for k, v in p.items()} for p in ref.local_params],
        "bases": {k: _copied(v) for k, v in ref.bases.items()},
      }
    )
  return ref, trajectory


def _copied(basis):
  """A copy of a basis: one array, or a tuple of them (two-sided)."""
  return tuple(b.copy() for b in basis) if isinstance(basis, tuple) else basis.copy()
