"""LoRDO with a message in flight in float64 NumPy: ``lordo_reference``'s workers with
the freeze, window and landing of MATH.md §9 in place of §4's blocking sync.

The landing refreshes every basis from the landed mean pseudo-gradient and carries the
corrected moments into it (§4.5, §4.6), which ``overlap_reference`` (SGD and Adam on
whole leaves) does not model. The outer step is plain averaging (``Reference``'s).
"""

import dataclasses

import lordo_reference as ref
import numpy as np


@dataclasses.dataclass(frozen=True)
class Overlap:
  tau: int | str  # an int in [1, K), or "round"
  merge: str  # "rebase" | "streaming" (tau < K); "eager" | "delayed" ("round")
  merge_alpha: float = 0.0


class InFlight(ref.Reference):
  """M LoRDO workers whose round's message lands ``overlap.tau`` steps (or a round) late."""

  def __init__(self, cfg: ref.Config, params, num_workers: int, overlap: Overlap):
    super().__init__(cfg, params, num_workers)
    self.overlap = overlap
    self.anchors = [dict(self.anchor) for _ in range(num_workers)]  # per worker (eager)
    self.frozen: list | None = None  # per worker: (D_m, {leaf: (u_m, v_m)})

  def _moments(self, m):
    """Worker m's averaged moments, per leaf: (u, v) low-rank, (m, v) full-rank."""
    fields = lambda name: ("u", "v") if name in self.sides else ("m", "v")  # noqa: E731
    return {
      name: tuple(getattr(self.states[m][name], f).copy() for f in fields(name))
      for name in self.anchor
    }

  def _freeze(self):
    return [
      ({k: self.anchors[m][k] - p for k, p in self.params[m].items()}, self._moments(m))
      for m in range(self.num_workers)
    ]

  def _correct(self, frozen, steps):
    """u_m += b1^steps (Ubar - U_m), v_m += b2^steps (Vbar - V_m) (§9, step 3)."""
    decays = (self.cfg.b1**steps, self.cfg.b2**steps)
    for name in self.anchor:
      fields = ("u", "v") if name in self.sides else ("m", "v")
      for i, field in enumerate(fields):
        mean = self._mean([f[1][name][i] for f in frozen])
        for m, f in enumerate(frozen):
          st = self.states[m][name]
          setattr(st, field, getattr(st, field) + decays[i] * (mean - f[1][name][i]))

  def _refresh_all(self, deltas):
    for name in self.sides:
      q_old = self.bases[name]
      q_new = self._refresh(name, deltas[name], q_old)
      for m in range(self.num_workers):
        self._transport(self.states[m][name], name, q_old, q_new, self.t)
      self.bases[name] = q_new

  def _sync(self) -> None:  # called by Reference.step at every boundary
    if self.overlap.tau == "round":
      self._land_round()
    else:
      self.frozen = self._freeze()

  def step(self, grads):
    super().step(grads)
    k, tau = self.cfg.sync_every, self.overlap.tau
    if tau != "round" and self.frozen is not None and self.t % k == tau:
      self._land_window()
    return self.params

  def _land_window(self):
    frozen, self.frozen = self.frozen, None
    deltas = {k: self._mean([f[0][k] for f in frozen]) for k in self.anchor}
    for m, (d_m, _) in enumerate(frozen):
      for k, a_old in self.anchors[m].items():
        new = a_old - deltas[k]
        if self.overlap.merge == "rebase":
          self.params[m][k] = new + (self.params[m][k] - (a_old - d_m[k]))
        else:
          alpha = self.overlap.merge_alpha
          self.params[m][k] = alpha * self.params[m][k] + (1 - alpha) * new
      self.anchors[m] = {k: a - deltas[k] for k, a in self.anchors[m].items()}
    self._correct(frozen, self.overlap.tau)
    self._refresh_all(deltas)

  def _land_round(self):
    fresh = self._freeze()  # D_m now; its moments are taken after the landing, below
    landed = self.frozen is not None
    previous = self.frozen or [
      ({k: np.zeros_like(v) for k, v in d.items()}, {n: (0 * a, 0 * b) for n, (a, b) in mo.items()})
      for d, mo in fresh
    ]
    deltas = {k: self._mean([p[0][k] for p in previous]) for k in self.anchor}
    for m in range(self.num_workers):
      for k in self.anchor:
        step = deltas[k]
        if self.overlap.merge == "eager":
          step = step + (fresh[m][0][k] - previous[m][0][k]) / self.num_workers
        self.anchors[m][k] = self.anchors[m][k] - step
        self.params[m][k] = self.anchors[m][k].copy()
    if landed:
      self._correct(previous, self.cfg.sync_every)
      self._refresh_all(deltas)
    self.frozen = [(d, self._moments(m)) for m, (d, _) in enumerate(fresh)]
