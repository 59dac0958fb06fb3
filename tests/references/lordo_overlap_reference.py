"""LoRDO with a message in flight in float64 NumPy: ``lordo_reference``'s workers with
the freeze, window and landing of MATH.md §9 in place of §4's blocking sync.

The landing refreshes every basis from the landed mean pseudo-gradient and carries the
corrected moments into it (§4.5, §4.6), which ``overlap_reference`` (SGD and Adam on
whole leaves) does not model. The outer step is plain averaging (``Reference``'s).

With fragments (Streaming DiLoCo, ``overlap=tau`` only) the leaves are labelled
f in [0, F); fragment f freezes at the end of the steps t with t % K == o_f,
o_f = ((f + 1) K // F) % K, and lands tau steps later, on its own leaves only. Without
labels every leaf is in fragment 0, F = 1, o_0 = 0: the freeze at every round boundary.

With ``compression`` ("int8" or "bfloat16") the message is sent in compressed chunks
(``chunk_codec_reference``; MATH.md §9, "Chunks and codecs") of two parts: the
pseudo-gradient, its leaves raveled in name order; and the moments, the first moments
then the second, each of the full-rank leaves then of the low-rank ones (their r x q
or p x r coordinates), in name order: the order of the local optimizer's state.
"""

import dataclasses

import numpy as np

from tests.references import chunk_codec_reference as codec_ref
from tests.references import lordo_reference as ref


@dataclasses.dataclass(frozen=True)
class Overlap:
  tau: int | str  # an int in [1, K), or "round"
  merge: str  # "rebase" | "streaming" (tau < K); "eager" | "delayed" ("round")
  merge_alpha: float = 0.0
  delay_correction: str = "none"  # "round", eager or delayed: "none" | "step" | ...


def delay_weights(overlap: Overlap, workers: int) -> tuple[float, float]:
  """(f, g): eager lands f D_new / M + g (Dbar - D_old / M), delayed g Dbar (MATH.md §9).
  The mean error's recursion e' = e - c((1 - w) e_old + w e), w = 1/M eager, 0 delayed,
  is critically damped at c = 1 by the step c = 1 / (1 + sqrt(1 - w))^2 ("step": both
  parts scaled by it) or by the stale part scaled by (1 - w) / 4 ("staleness");
  "damped" scales both parts by 0.7 unless one worker lands eager (w = 1)."""
  w = 1.0 / workers if overlap.merge == "eager" else 0.0
  if overlap.delay_correction == "step":
    c = 1.0 / (1.0 + np.sqrt(1.0 - w)) ** 2
    return c, c
  if overlap.delay_correction == "staleness":
    return 1.0, (1.0 - w) / 4.0
  if overlap.delay_correction == "damped" and w < 1.0:
    return 0.7, 0.7
  return 1.0, 1.0


def fragment_offsets(sync_every: int, count: int) -> list[int]:
  """o_f = ((f + 1) K // F) % K: fragment f syncs at the steps t with t % K == o_f."""
  return [((f + 1) * sync_every // count) % sync_every for f in range(count)]


class InFlight(ref.Reference):
  """M LoRDO workers whose round's message lands ``overlap.tau`` steps (or a round) late.

  ``fragments``: {leaf name: f} (tau an int only), or None (one fragment). ``landings``
  lists the (t, f) of every landing of a window. ``compression``: the chunks' codec
  (None: plain means); ``residuals[m]`` is then worker m's error feedback, row
  f * chunks + j that of chunk j of fragment f.
  """

  def __init__(
    self,
    cfg: ref.Config,
    params,
    num_workers: int,
    overlap: Overlap,
    fragments=None,
    compression: str | None = None,
  ):
    super().__init__(cfg, params, num_workers)
    self.overlap = overlap
    self.compression = compression
    self.residuals: list | None = None  # with compression, from the first landing on
    self.anchors = [dict(self.anchor) for _ in range(num_workers)]  # per worker (eager)
    self.frozen: list | None = None  # "round": per worker (D_m, {leaf: (u_m, v_m)})
    labels = fragments or dict.fromkeys(self.anchor, 0)
    count = max(labels.values()) + 1
    self.fragments = [[n for n in self.anchor if labels[n] == f] for f in range(count)]
    self.offsets = fragment_offsets(cfg.sync_every, count)
    self.in_flight: dict[int, list] = {}  # tau: fragment -> its frozen message, per worker
    self.landings: list[tuple[int, int]] = []
    if overlap.tau == "round" and count > 1:
      raise NotImplementedError("overlap='round' with fragments is not modelled")
    if overlap.tau != "round":
      k, s = cfg.sync_every, sorted(self.offsets)
      gaps = [(s[(i + 1) % count] - s[i]) % k for i in range(count)] if count > 1 else [k]
      if not 0 < overlap.tau < min(gaps):
        raise ValueError(f"tau={overlap.tau} must be in [1, {min(gaps)}): one message in flight")

  def _moments(self, m, names=None):
    """Worker m's moments of ``names`` (all leaves): (u, v) low-rank, (m, v) full-rank."""
    fields = lambda name: ("u", "v") if name in self.sides else ("m", "v")  # noqa: E731
    return {
      name: tuple(getattr(self.states[m][name], f).copy() for f in fields(name))
      for name in (self.anchor if names is None else names)
    }

  def _freeze(self, names=None):
    """Per worker m: (D_m = anchor_m - theta_m, the moments), on ``names`` (all leaves)."""
    names = list(self.anchor) if names is None else names
    return [
      ({k: self.anchors[m][k] - self.params[m][k] for k in names}, self._moments(m, names))
      for m in range(self.num_workers)
    ]

  def _first_mean(self, arrays):
    """With ``compression`` the first gradient is sent in its codec, leaf by leaf and
    without feedback (MATH.md §4.2)."""
    if self.compression is None:
      return self._mean(arrays)
    return codec_ref.leaf_mean(np.stack(arrays), self.compression)

  def _landed_means(self, frozen, names, fragment=0):
    """The workers' means of the messages ``frozen`` on ``names``: ``(Dbar, moments)``,
    ``Dbar[name]`` and ``moments[name] = (Ubar, Vbar)``; sent in chunks with
    ``compression``, plain means without."""
    if self.compression is None:
      deltas = {k: self._mean([fr[0][k] for fr in frozen]) for k in names}
      moments = {
        k: tuple(self._mean([fr[1][k][i] for fr in frozen]) for i in (0, 1)) for k in names
      }
      return deltas, moments
    return self._chunked_means(frozen, names, fragment)

  def _parts(self, names):
    """The leaves of a message's two parts: the pseudo-gradient's, and the moments'
    (full-rank leaves, then low-rank ones), each in name order."""
    ordered = sorted(names)
    moments = [n for n in ordered if n not in self.sides] + [n for n in ordered if n in self.sides]
    return ordered, moments

  def _chunked_means(self, frozen, names, fragment):
    chunks = self.cfg.sync_every if self.overlap.tau == "round" else self.overlap.tau
    shapes = {k: v[0].shape for k, v in self._moments(0).items()}  # name: (u or m).shape

    def sizes(leaves):
      d, mo = self._parts(leaves)
      return (
        sum(self.anchor[k].size for k in d),
        2 * sum(int(np.prod(shapes[k])) for k in mo),
      )

    each = [sizes(leaves) for leaves in self.fragments]
    widths = [max(codec_ref.columns(n[i], chunks) for n in each) for i in (0, 1)]
    if self.residuals is None:
      rows = len(self.fragments) * chunks
      self.residuals = [np.zeros((rows, widths[0])) for _ in range(self.num_workers)]
    d_names, m_names = self._parts(names)
    messages = [
      [
        np.concatenate([d[k].ravel() for k in d_names]),
        np.concatenate([mo[k][i].ravel() for i in (0, 1) for k in m_names]),
      ]
      for d, mo in frozen
    ]
    codecs = (self.compression, codec_ref.MOMENT_CODEC)
    (d_mean, m_mean), self.residuals = codec_ref.chunked_means(
      messages, chunks, widths, codecs, self.residuals, fragment * chunks
    )
    deltas, at = {}, 0
    for k in d_names:
      deltas[k] = d_mean[at : at + self.anchor[k].size].reshape(self.anchor[k].shape)
      at += self.anchor[k].size
    moments, at = {k: [None, None] for k in m_names}, 0
    for i in (0, 1):
      for k in m_names:
        n = int(np.prod(shapes[k]))
        moments[k][i] = m_mean[at : at + n].reshape(shapes[k])
        at += n
    return deltas, moments

  def _correct(self, frozen, means, steps, names=None):
    """u_m += b1^steps (Ubar - U_m), v_m += b2^steps (Vbar - V_m) (§9, step 3), with
    ``means[name] = (Ubar, Vbar)``."""
    decays = (self.cfg.b1**steps, self.cfg.b2**steps)
    for name in self.anchor if names is None else names:
      fields = ("u", "v") if name in self.sides else ("m", "v")
      for i, field in enumerate(fields):
        mean = means[name][i]
        for m, f in enumerate(frozen):
          st = self.states[m][name]
          setattr(st, field, getattr(st, field) + decays[i] * (mean - f[1][name][i]))

  def _refresh_all(self, deltas, names=None):
    """Q_new = ComputeProjection(Dbar) and the moments rotated into it, per low-rank leaf."""
    for name in self.sides if names is None else [n for n in names if n in self.sides]:
      q_old = self.bases[name]
      q_new = self._refresh(name, deltas[name], q_old)
      for m in range(self.num_workers):
        self._transport(self.states[m][name], name, q_old, q_new, self.t)
      self.bases[name] = q_new

  def _sync(self) -> None:  # called by Reference.step at every boundary
    if self.overlap.tau == "round":
      self._land_round()

  def step(self, grads):
    """The local step; then each fragment f lands if t % K == (o_f + tau) % K and its
    message is in flight, and freezes if t % K == o_f (never the same step: tau < K)."""
    super().step(grads)
    k, tau = self.cfg.sync_every, self.overlap.tau
    if tau == "round":
      return self.params
    for f, names in enumerate(self.fragments):
      if f in self.in_flight and self.t % k == (self.offsets[f] + tau) % k:
        self._land_window(f)
      if self.t % k == self.offsets[f]:
        assert f not in self.in_flight, "a fragment froze again before it landed"
        self.in_flight[f] = self._freeze(names)
    return self.params

  def _land_window(self, f):
    """§9's landing on fragment f's leaves: Dbar = mean_m D_m, anchor -= Dbar, the merge,
    the moment correction, and the refresh of f's low-rank leaves from Dbar."""
    names, frozen = self.fragments[f], self.in_flight.pop(f)
    self.landings.append((self.t, f))
    deltas, moments = self._landed_means(frozen, names, f)
    for m, (d_m, _) in enumerate(frozen):
      for k in names:
        a_old = self.anchors[m][k]
        new = a_old - deltas[k]
        if self.overlap.merge == "rebase":
          self.params[m][k] = new + (self.params[m][k] - (a_old - d_m[k]))
        else:
          alpha = self.overlap.merge_alpha
          self.params[m][k] = alpha * self.params[m][k] + (1 - alpha) * new
        self.anchors[m][k] = new
    self._correct(frozen, moments, self.overlap.tau, names)
    self._refresh_all(deltas, names)

  def _land_round(self):
    """A whole round in flight (§9): the mean of the last round's messages lands, each
    worker merges (eager: its own fresh pseudo-gradient at 1/M; delayed: the mean alone;
    rebase and streaming: onto the new anchor, with its steps since the last freeze),
    the moments are corrected, the bases refreshed (from the fresh pseudo-gradient with
    one worker, but delayed), and this round's message is frozen."""
    fresh = self._freeze()  # anchor_m - theta_m now; the moments are taken after the landing
    landed = self.frozen is not None
    previous = self.frozen or [
      ({k: np.zeros_like(v) for k, v in d.items()}, {n: (0 * a, 0 * b) for n, (a, b) in mo.items()})
      for d, mo in fresh
    ]
    deltas, moments = self._landed_means(previous, list(self.anchor))
    merge, sent = self.overlap.merge, []
    f, g = delay_weights(self.overlap, self.num_workers)
    n = self.num_workers
    for m in range(self.num_workers):
      d_fresh, d_old = fresh[m][0], previous[m][0]
      for k in self.anchor:
        step = deltas[k]
        if merge == "eager":
          step = f * d_fresh[k] / n + g * (deltas[k] - d_old[k] / n)
        elif merge == "delayed":
          step = g * deltas[k]
        a_old, new = self.anchors[m][k], self.anchors[m][k] - step
        if merge == "rebase":
          self.params[m][k] = new + (self.params[m][k] - (a_old - d_old[k]))
        elif merge == "streaming":
          alpha = self.overlap.merge_alpha
          self.params[m][k] = alpha * self.params[m][k] + (1 - alpha) * new
        else:
          self.params[m][k] = new.copy()
        self.anchors[m][k] = new
      if merge in ("rebase", "streaming"):
        d_fresh = {k: self.anchors[m][k] - self.params[m][k] for k in d_fresh}
      sent.append(d_fresh)
    if landed:
      self._correct(previous, moments, self.cfg.sync_every)
    # The bases come from the freshest pseudo-gradient every worker holds: the landed
    # mean, and with one worker (but delayed, one round late by design) its fresh one.
    if self.num_workers == 1 and merge != "delayed":
      self._refresh_all(sent[0])
    elif landed:
      self._refresh_all(deltas)
    self.frozen = [(d, self._moments(m)) for m, d in enumerate(sent)]
