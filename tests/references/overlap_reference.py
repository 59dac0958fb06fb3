"""Overlapped synchronisation in float64 NumPy: the merges of MATH.md §9, written plainly.

M workers take local steps on their own gradients; the message frozen at a round
boundary t0 lands tau steps later (``tau`` in 1..K-1, merges ``"rebase"`` and
``"streaming"``) or a whole round later (``tau == K``: ``"round"``, merges ``"eager"``,
``"delayed"``, ``"rebase"`` and ``"streaming"``); ``tau == 0`` is the plain round.
The inner step is SGD or Adam on whole leaves (the low-rank step and the basis
refresh are the plain round's, in ``lordo_reference``), the moments are averaged at
every sync, and the outer step is plain averaging (an update of ``-D``) or Nesterov SGD
(DiLoCo), as in MATH.md §4.3.
Chunking does not change the values without a codec: each message is sent whole.

With ``compression`` ("int8" or "bfloat16", tau >= 1) the chunks are modelled as the
library sends them (MATH.md §9, "Chunks and codecs"). A message is cut into
``chunks`` (K for a whole round in flight, else tau) rows of two parts: the
pseudo-gradient D_m, raveled, zero-padded to a multiple of ``chunks`` and cut into
``chunks`` contiguous rows; then (Adam inside: the moments are averaged) mu and nu
raveled one after the other and cut the same way. Each part's slice of chunk j is a
1-D piece of n values sent as a compressed mean (``chunk_codec_reference``): the
piece (plus, for D_m, the residual of chunk j) as M rows of ceil(n / M) values, each
worker's rows encoded, row r averaged by worker r and encoded again. D_m's codec is
``compression`` with error feedback; the moments' is bfloat16 without it. Elements go
in C order (of a fragment's elements): the library's, when its leaves are consecutive
blocks of rows of the reference's array.

With ``fragment_of`` (a fragment label per element, F fragments: streaming) fragment f
is frozen at the steps t = o_f mod K, o_f = floor((f + 1) K / F) mod K, and lands tau
steps later, its elements only; tau is below the spacing of the offsets, so one
fragment's message at a time is in flight.
"""

import dataclasses

import numpy as np

from tests.references import chunk_codec_reference as codec_ref


@dataclasses.dataclass
class Setup:
  workers: int = 4
  sync_every: int = 4  # K
  tau: int = 0  # 0: the plain round; 1..K-1; K: a whole round in flight
  merge: str = "rebase"  # "rebase" | "streaming"; with tau = K also "eager" | "delayed"
  merge_alpha: float = 0.0
  inner: str = "sgd"  # "sgd" | "adam"
  learning_rate: float = 0.05
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  outer_learning_rate: float = 1.0  # with outer_momentum 0: plain averaging
  outer_momentum: float = 0.0
  fragment_of: np.ndarray | None = None  # a label per element of the params; None: one
  compression: str | None = None  # None | "int8" | "bfloat16": the chunks' codec (tau >= 1)
  delay_correction: str = "none"  # tau = K, eager or delayed: "none" | "step" | ...
  average_moments: bool = True  # False: DiLoCo's round, the moments stay on each worker


@dataclasses.dataclass
class Worker:
  params: np.ndarray
  u: np.ndarray
  v: np.ndarray
  anchor: np.ndarray  # shared, except with the eager merge
  outer_momentum: np.ndarray
  frozen: tuple | None = None  # (D_m, U_m, V_m) of the message in flight
  fragment: int = 0  # the fragment whose message is in flight (tau < K)
  residual: np.ndarray | None = None  # compression: D's error feedback, row f * chunks + j


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


def delay_weights(s: Setup, m: int) -> tuple[float, float]:
  """(f, g) of MATH.md §9's delay-corrected outer step: the direction a worker hands its
  outer optimizer is f D_new / M + g (Dbar - D_old / M) eager, g Dbar delayed. With
  w = 1/M eager (0 delayed) the round's mean error follows e' = e - c((1-w) e_old + w e);
  "step" scales both parts by the c that makes its two roots meet at c = 1,
  (1 - w) ** 2 = 4 c (1 - w) ... solved: c = 1 / (1 + sqrt(1 - w)) ** 2;
  "staleness" keeps the fresh part and scales the stale one to the same damping,
  g (1 - w) = (1 - w) ** 2 / 4; "damped" scales both by 0.7 unless w = 1 (one worker
  eager)."""
  w = 1 / m if s.merge == "eager" else 0.0
  if s.delay_correction == "step":
    c = (1 - np.sqrt(1 - w)) ** 2 / w**2 if w > 0 else 0.25  # = 1 / (1 + sqrt(1 - w))^2
    return c, c
  if s.delay_correction == "staleness":
    return 1.0, (1 - w) / 4
  if s.delay_correction == "damped" and w != 1:
    return 0.7, 0.7
  return 1.0, 1.0


def _land(s: Setup, ws: list[Worker], decay_steps: int, mask=True) -> None:
  """The frozen messages land on the elements in ``mask``: outer step, the parameters
  merged, the moments corrected; the other elements are left as they are."""
  deltas, us, vs = _means(s, ws, [w.frozen for w in ws], mask)
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
  deltas, us, vs = _means(s, ws, previous)
  sent = []
  for w, (d_new, _, _), (d_old, u_m, v_m) in zip(ws, fresh, previous, strict=True):
    a_old = w.anchor
    fresh, stale = delay_weights(s, m)
    if s.merge == "eager":  # Kale et al. Algorithm 3: own fresh part now, the rest late.
      d = fresh * d_new / m + stale * (deltas - d_old / m)
      w.anchor, w.outer_momentum = _outer(s, w.anchor, w.outer_momentum, d)
    elif s.merge == "delayed":  # their Algorithm 2: the late mean only
      w.anchor, w.outer_momentum = _outer(s, w.anchor, w.outer_momentum, stale * deltas)
    else:  # rebase, streaming: the late mean only
      w.anchor, w.outer_momentum = _outer(s, w.anchor, w.outer_momentum, deltas)
    if s.merge == "rebase":  # the worker's steps since its last freeze, on the new anchor
      w.params = w.anchor + (w.params - (a_old - d_old))
    elif s.merge == "streaming":
      w.params = s.merge_alpha * w.params + (1 - s.merge_alpha) * w.anchor
    else:
      w.params = w.anchor.copy()
    # Rebase and streaming send the steps from where the last freeze left the worker.
    sent.append(w.anchor - w.params if s.merge in ("rebase", "streaming") else d_new)
    corrected = ws[0].frozen and s.average_moments
    w.u = w.u + s.b1**s.sync_every * (us - u_m) if corrected else w.u
    w.v = w.v + s.b2**s.sync_every * (vs - v_m) if corrected else w.v
  for w, d in zip(ws, sent, strict=True):  # the moments after the landing (MATH.md §9)
    w.frozen = (d, w.u.copy(), w.v.copy())


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


def _means(s: Setup, ws: list[Worker], messages: list[tuple], mask=True) -> tuple:
  """The workers' means (Dbar, Ubar, Vbar) of ``messages``, the (D_m, U_m, V_m) in flight:
  plain means, or with ``compression`` the decoded means of the chunks
  (:func:`_chunked_means`) on the elements in ``mask``."""
  if s.compression is None:
    return tuple(np.mean([msg[i] for msg in messages], axis=0) for i in range(3))
  return _chunked_means(s, ws, messages, np.broadcast_to(mask, ws[0].params.shape))


def _chunked_means(s: Setup, ws: list[Worker], messages: list[tuple], mask) -> tuple:
  """The decoded means of a compressed message (:func:`codec_ref.chunked_means`).

  The parts of worker m's message are D_m on the elements in ``mask`` and (Adam inside)
  mu then nu there, each part as wide as its widest fragment's; worker m's residual
  rows f * chunks + j follow D's chunk j of fragment f. Dbar, Ubar, Vbar are zero
  outside ``mask``; with SGD inside no moment is sent and Ubar, Vbar (unused) are the
  plain means.
  """
  labels = np.zeros(mask.shape, int) if s.fragment_of is None else s.fragment_of
  chunks = s.sync_every if s.tau == s.sync_every else s.tau
  sizes = [int(np.count_nonzero(labels == f)) for f in range(int(labels.max()) + 1)]
  parts = [[msg[0][mask]] for msg in messages]
  widths = [max(codec_ref.columns(n, chunks) for n in sizes)]
  codecs = [s.compression]
  if s.inner == "adam":  # mu then nu, one part
    for p, msg in zip(parts, messages, strict=True):
      p.append(np.concatenate([msg[1][mask], msg[2][mask]]))
    widths.append(max(codec_ref.columns(2 * n, chunks) for n in sizes))
    codecs.append(codec_ref.MOMENT_CODEC)
  for w in ws:
    if w.residual is None:
      w.residual = np.zeros((len(sizes) * chunks, widths[0]))
  means, residuals = codec_ref.chunked_means(
    parts, chunks, widths, codecs, [w.residual for w in ws], ws[0].fragment * chunks
  )
  for w, r in zip(ws, residuals, strict=True):
    w.residual = r  # a new array: the history keeps the old one
  deltas = np.zeros(mask.shape)
  deltas[mask] = means[0]
  if s.inner != "adam":
    return deltas, *(np.mean([msg[i] for msg in messages], axis=0) for i in (1, 2))
  us, vs = np.zeros(mask.shape), np.zeros(mask.shape)
  us[mask], vs[mask] = np.split(means[1], 2)
  return deltas, us, vs


def run(s: Setup, params0: np.ndarray, grads, steps: int) -> list[list[Worker]]:
  """Every worker's state after each of ``steps`` steps; ``grads(m, t, params)``."""
  if s.compression is not None and s.tau == 0:
    raise ValueError("compression is modelled on the chunks of a message in flight: tau >= 1")
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
