"""Overlapped synchronisation in float64 NumPy: the merges of MATH.md §9, written plainly.

M workers take local steps on their own gradients; the message frozen at a round
boundary t0 lands tau steps later (``tau`` in 1..K-1, merges ``"rebase"`` and
``"streaming"``) or a whole round later (``tau == K``: ``"round"``, merges ``"eager"``
and ``"delayed"``); ``tau == 0`` is the plain round. The inner step is SGD or Adam on
whole leaves (the low-rank step and the basis refresh are the plain round's, in
``lordo_reference``), the moments are averaged at every sync, and the outer step is
plain averaging (an update of ``-D``) or Nesterov SGD (DiLoCo), as in MATH.md §4.3.
Chunking does not change the values without a codec: each message is sent whole.

With ``fragment_of`` (a fragment label per element, F fragments: streaming) fragment f
is frozen at the steps t = o_f mod K, o_f = floor((f + 1) K / F) mod K, and lands tau
steps later, its elements only; tau is below the spacing of the offsets, so one
fragment's message at a time is in flight.
"""

import dataclasses

import numpy as np


@dataclasses.dataclass
class Setup:
  workers: int = 4
  sync_every: int = 4  # K
  tau: int = 0  # 0: the plain round; 1..K-1; K: a whole round in flight
  merge: str = "rebase"  # "rebase" | "streaming" (tau < K); "eager" | "delayed" (tau = K)
  merge_alpha: float = 0.0
  inner: str = "sgd"  # "sgd" | "adam"
  learning_rate: float = 0.05
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  outer_learning_rate: float = 1.0  # with outer_momentum 0: plain averaging
  outer_momentum: float = 0.0
  fragment_of: np.ndarray | None = None  # a label per element of the params; None: one


@dataclasses.dataclass
class Worker:
  params: np.ndarray
  u: np.ndarray
  v: np.ndarray
  anchor: np.ndarray  # shared, except with the eager merge
  outer_momentum: np.ndarray
  frozen: tuple | None = None  # (D_m, U_m, V_m) of the message in flight
  fragment: int = 0  # the fragment whose message is in flight (tau < K)


def _inner_step(s: Setup, w: Worker, g: np.ndarray, t: int) -> None:
  """One local step at step ``t`` (1-based): SGD, or Adam with its moments."""
  w.u = s.b1 * w.u + (1 - s.b1) * g
  w.v = s.b2 * w.v + (1 - s.b2) * g * g
  if s.inner == "sgd":
    w.params = w.params - s.learning_rate * g
    return
  u_hat, v_hat = w.u / (1 - s.b1**t), w.v / (1 - s.b2**t)
  w.params = w.params - s.learning_rate * u_hat / (np.sqrt(v_hat) + s.eps)


def _outer(s: Setup, anchor, momentum, delta):
  """``(new anchor, new momentum)``: ``anchor + outer(delta)``, with ``outer`` the update
  of ``optax.sgd`` (Nesterov when it has momentum)."""
  momentum = s.outer_momentum * momentum + delta
  step = delta + s.outer_momentum * momentum if s.outer_momentum else momentum
  return anchor - s.outer_learning_rate * step, momentum


def _land(s: Setup, ws: list[Worker], decay_steps: int, mask=True) -> None:
  """The frozen messages land on the elements in ``mask``: outer step, the parameters
  merged, the moments corrected; the other elements are left as they are."""
  deltas, us, vs = (np.mean([w.frozen[i] for w in ws], axis=0) for i in range(3))
  anchor, momentum = _outer(s, ws[0].anchor, ws[0].outer_momentum, deltas)
  anchor = np.where(mask, anchor, ws[0].anchor)
  momentum = np.where(mask, momentum, ws[0].outer_momentum)
  for w in ws:
    d_m, u_m, v_m = w.frozen
    if s.merge == "rebase":
      merged = anchor + (w.params - (w.anchor - d_m))
    else:  # streaming
      merged = s.merge_alpha * w.params + (1 - s.merge_alpha) * anchor
    w.params = np.where(mask, merged, w.params)
    w.u = np.where(mask, w.u + s.b1**decay_steps * (us - u_m), w.u)
    w.v = np.where(mask, w.v + s.b2**decay_steps * (vs - v_m), w.v)
    w.anchor, w.outer_momentum, w.frozen = anchor, momentum, None


def _land_round(s: Setup, ws: list[Worker], fresh: list[tuple]) -> None:
  """A boundary with a whole round in flight: the previous message lands by ``merge``
  (its mean is zero at the first boundary) and ``fresh`` is frozen in its place."""
  m = len(ws)
  previous = [
    w.frozen or tuple(np.zeros_like(x) for x in f) for w, f in zip(ws, fresh, strict=True)
  ]
  deltas, us, vs = (np.mean([p[i] for p in previous], axis=0) for i in range(3))
  for w, (d_new, _, _), (d_old, u_m, v_m) in zip(ws, fresh, previous, strict=True):
    if s.merge == "eager":  # Kale et al. Algorithm 3: own fresh part now, the rest late.
      d = deltas + (d_new - d_old) / m
      w.anchor, w.outer_momentum = _outer(s, w.anchor, w.outer_momentum, d)
    else:  # delayed, their Algorithm 2: the shared anchor takes the late mean only.
      w.anchor, w.outer_momentum = _outer(s, w.anchor, w.outer_momentum, deltas)
    w.params = w.anchor.copy()
    w.u = w.u + s.b1**s.sync_every * (us - u_m) if ws[0].frozen else w.u
    w.v = w.v + s.b2**s.sync_every * (vs - v_m) if ws[0].frozen else w.v
  for w, f in zip(ws, fresh, strict=True):  # the moments after the landing (MATH.md §9)
    w.frozen = (f[0], w.u.copy(), w.v.copy())


def _window(s: Setup, ws: list[Worker], t: int) -> None:
  """Step t with tau < K: the fragment whose offset t is frozen, and the fragment in
  flight lands tau steps after its freeze (at once with tau = 0)."""
  labels = np.zeros(ws[0].params.shape, int) if s.fragment_of is None else s.fragment_of
  count = int(labels.max()) + 1
  offsets = [((f + 1) * s.sync_every // count) % s.sync_every for f in range(count)]
  for f, offset in enumerate(offsets):
    if t % s.sync_every == offset:
      for w in ws:
        w.frozen, w.fragment = (w.anchor - w.params, w.u.copy(), w.v.copy()), f
  in_flight = ws[0].frozen is not None
  if in_flight and t % s.sync_every == (offsets[ws[0].fragment] + s.tau) % s.sync_every:
    _land(s, ws, s.tau, labels == ws[0].fragment)


def run(s: Setup, params0: np.ndarray, grads, steps: int) -> list[list[Worker]]:
  """Every worker's state after each of ``steps`` steps; ``grads(m, t, params)``."""
  ws = [
    Worker(
      params0.copy(),
      np.zeros_like(params0),
      np.zeros_like(params0),
      params0.copy(),
      np.zeros_like(params0),
    )
    for _ in range(s.workers)
  ]
  history = []
  for t in range(1, steps + 1):
    for m, w in enumerate(ws):
      _inner_step(s, w, grads(m, t, w.params), t)
    boundary = t % s.sync_every == 0
    if s.tau == s.sync_every and boundary:
      _land_round(s, ws, [(w.anchor - w.params, w.u.copy(), w.v.copy()) for w in ws])
    elif s.tau < s.sync_every:
      _window(s, ws, t)
    history.append([dataclasses.replace(w) for w in ws])
  return history
