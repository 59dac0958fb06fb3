"""A message in flight (MATH.md §9), the steps of :func:`lordo_jax.synchronize` with
``overlap``: :func:`round_step` (``"round"``) sends one chunk of the last round's message
at every step, outside any conditional, and lands it at the next boundary (:func:`land`,
``"eager"`` or ``"delayed"``); :func:`window_step` (tau < K) sends tau chunks after a
boundary and lands them (:func:`land_window`, ``"rebase"`` or ``"streaming"``), outside
any conditional in the programs of :func:`overlap_phase` ``"send"``. :func:`check` says
what overlap takes.
"""

import functools
import math
import numbers
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lordo_jax import _checks as checks
from lordo_jax.comm import _chunks as chunks_lib
from lordo_jax.comm import _compression as compression_lib
from lordo_jax.round import _moment_trees as moment_trees
from lordo_jax.round import _offload as offload_lib
from lordo_jax.round import _outer_step as outer_lib
from lordo_jax.round import _periods as periods
from lordo_jax.round import _schedule as schedule
from lordo_jax.round._round_parts import RoundParts

WINDOW_MERGES = ("rebase", "streaming")  # overlap=tau < K, and "round" (tau = K)
MERGES = ("eager", "delayed", *WINDOW_MERGES)  # overlap="round"
# overlap="round" with merge "eager" or "delayed": how the outer step corrects for the
# delay (MATH.md §9, the delay-corrected outer step); None chooses (correction_of).
CORRECTIONS = ("none", "step", "staleness", "damped")
# delay_correction="damped": the direction's scale from two workers on (MATH.md §9), the
# averaging outer's best rate with a round in flight (the overlap guide).
DAMPED_SCALE = 0.7
CORRECTED_MERGES = ("eager", "delayed")
PHASES = ("send", "local")  # update(..., overlap_phase=...): a static value
# The named scope of the message's collectives (send_chunk): their op_name in the
# compiled HLO holds it, so that a compiler pass can find them (_overlap_compile).
IN_FLIGHT_SCOPE = "lordo_jax_in_flight"


class InFlight(NamedTuple):
  """The round's message in flight: one buffer per part, one row per chunk, each in its
  part's dtype (:func:`lordo_jax.comm._chunks.freeze`; a bfloat16 model's D_m in
  bfloat16, as section 4's round sends it)."""

  message: tuple  # This worker's frozen message: D_m's buffer, the moments U_m, V_m's.
  means: tuple  # The workers' means of the chunks sent so far, buffers like message's.
  residual: Any = ()  # With compression: float32, the error feedback of D_m's columns.


def _message(parts: RoundParts, delta, inner_state, fragment=None) -> tuple:
  """What a boundary freezes, in two parts: the pseudo-gradient, and the moments
  averaged every sync (each sent with its codec); of the leaves in ``fragment`` only
  (``None``: all; the others ``optax.MaskedNode()``)."""
  fields = [f for _, group in parts.moment_groups for f in group]
  moments = tuple(moment_trees.moment_tree(inner_state, f, fragment) for f in fields)
  return (moment_trees.select(delta, fragment), moments)


class MessageLayout(NamedTuple):
  """How the message in flight sits in its buffers: one fragment at a time (streaming),
  each part's padded to the columns of its widest fragment."""

  masks: list  # The fragments' leaves (schedule.fragment_masks); [None]: one.
  columns: tuple  # Each part's columns, its widest fragment's.


def message_layout(parts: RoundParts, like, inner_state) -> MessageLayout:
  """The :class:`MessageLayout` for params shaped like ``like`` and the inner state."""
  masks = schedule.fragment_masks(like, parts.fragments)
  each = [chunks_lib.widths(_message(parts, like, inner_state, m), chunks(parts)) for m in masks]
  return MessageLayout(masks, tuple(max(w) for w in zip(*each, strict=True)))


def _frozen(
  parts: RoundParts, delta, inner_state, lay, fragment=None, take=slice(None), dtypes=None
):
  """The buffers of the parts ``take`` of the message of ``fragment``, laid out by
  ``lay``, in ``dtypes`` (default: the whole message's); their columns split as the
  whole message's leaves are (the same sharding whichever fragment is frozen)."""
  whole = _message(parts, delta, inner_state)
  return chunks_lib.freeze(
    _message(parts, delta, inner_state, fragment)[take],
    chunks(parts),
    columns=lay.columns[take],
    split_like=whole[take],
    dtypes=dtypes,
  )


def _dtypes(flight: InFlight) -> tuple:
  """The dtype of each part in flight (its buffer's; ``None`` for a part of no columns):
  :func:`init` takes them from the params and the moments, and every message frozen
  later keeps them (its pseudo-gradient is formed in float32)."""
  return tuple(None if b is None else b.dtype for b in flight.message)


def _codecs(parts: RoundParts) -> tuple:
  """The codecs of the message's two parts: ``compression`` for the pseudo-gradient,
  the moments' own (:data:`lordo_jax.comm._compression.MOMENT_CODECS`)."""
  if parts.compression is None:
    return ()
  return (parts.compression, compression_lib.MOMENT_CODECS[parts.compression])


def chunks(parts: RoundParts) -> int:
  """Chunks of a message: K for a whole round in flight, else tau."""
  return parts.sync_every if parts.overlap == "round" else parts.overlap


def init(parts: RoundParts, params, inner_state) -> InFlight:
  """Nothing in flight before the first boundary: zeros (a mean of zero lands there).
  With compression the residual has the rows of every fragment's chunks."""
  lay = message_layout(parts, params, inner_state)
  if parts.overlap != "round":
    check_spacing(parts.name, parts.sync_every, len(lay.masks), parts.overlap)
  zeros = jax.tree.map(jnp.zeros_like, _frozen(parts, params, inner_state, lay, lay.masks[0]))
  residual = ()
  if parts.compression is not None:  # Float32 like section 4's, whatever D_m's dtype.
    (rows,) = _frozen(parts, params, inner_state, lay, lay.masks[0], take=slice(0, 1))
    residual = jnp.zeros_like(jnp.concatenate([rows] * len(lay.masks)), jnp.float32)
  return InFlight(message=zeros, means=zeros, residual=residual)


def send_chunk(parts: RoundParts, state, index, residual_row=None, sending=None):
  """Chunk ``index`` (a traced int) of the message in flight, averaged and counted:
  ``(in_flight, ledger)``. The residual is the one of row ``residual_row`` (default
  ``index``: that of the fragment in flight). With ``sending`` (a traced bool) the mean
  and the residual are kept only where it holds; with offload one row of each buffer
  comes in from host memory and goes back. The collectives run in the named scope
  :data:`IN_FLIGHT_SCOPE`, which names no value and changes no number: it marks them in
  the compiled program (:func:`lordo_jax.compile_overlapped` reads it there)."""
  residual_row = index if residual_row is None else residual_row
  flight, compressed, offload = state.in_flight, parts.compression is not None, parts.offload
  read = functools.partial(chunks_lib.row, index=index, to_device=offload)
  write = functools.partial(chunks_lib.with_row, index=index, to_host=offload)
  own = chunks_lib.row(flight.residual, residual_row, to_device=offload) if compressed else None
  chunk = read(flight.message)
  with jax.named_scope(IN_FLIGHT_SCOPE):
    averaged, ledger, fed = chunks_lib.chunk_mean(
      chunk, state.ledger, parts.axis_name, codecs=_codecs(parts), residual=own
    )
  if sending is not None:  # A chunk sent for nothing changes nothing but the ledger.
    averaged = jax.tree.map(
      lambda new, old: jnp.where(sending, new, old), averaged, read(flight.means)
    )
    fed = jnp.where(sending, fed, own) if compressed else None
  residual = ()
  if compressed:
    residual = chunks_lib.with_row(flight.residual, fed, residual_row, to_host=offload)
  return flight._replace(means=write(flight.means, averaged), residual=residual), ledger


def state_layout(parts: RoundParts, state) -> MessageLayout:
  """The :class:`MessageLayout` of ``state``'s message (its shapes only)."""
  like = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, jnp.float32), state.anchor)
  return message_layout(parts, like, state.inner_state)


def land(parts: RoundParts, state, params, local_updates, grads):
  r"""At a boundary: the message in flight lands and this round's is frozen.

  With :math:`\bar D, \bar U, \bar V` the means that landed and :math:`D_m, U_m, V_m`
  this worker's part of them, and :math:`D'_m = \text{anchor} - \theta_m` the fresh
  pseudo-gradient:

  .. math::
    \tilde D_m = \bar D + (D'_m - D_m) / M \ \text{(eager)}, \quad \bar D \
      \text{(the others)}; \qquad
    \text{anchor} \leftarrow \text{anchor} + \text{outer}(\tilde D_m), \quad
    \theta_m = \text{anchor}

  (eager, delayed), or :func:`_merged`'s rebase or streaming; and the moments
  :math:`u \mathrel{+}= \beta_1^K (\bar U - U_m)`,
  :math:`v \mathrel{+}= \beta_2^K (\bar V - V_m)`. The bases, one on every worker, are
  computed from :math:`\bar D`, the freshest pseudo-gradient all workers hold (kept at
  the first boundary, when nothing has landed); with one worker (but delayed) from its
  fresh message, the mean: eager, and rebase under the averaging outer, are then the
  blocking round. The message frozen now holds :math:`D'_m` (rebase, streaming:
  :math:`\text{anchor} - \theta_m` after the merge, the steps since the last freeze)
  and the moments after this landing (corrected and carried into the new bases), so
  that the next landing corrects moments of the bases they are in:
  :math:`v - \beta_2^K V_m \ge 0`, and ``v`` stays non-negative.

  Returns the state and this worker's parameters after the landing.
  """
  landed = (state.syncs[0] > 0).astype(jnp.float32)
  local_params = optax.apply_updates(params, local_updates)
  delta = _pseudo_gradient(state.anchor, local_params)
  fresh = _message(parts, delta, state.inner_state)
  old, averaged = (chunks_lib.thaw(b, fresh) for b in state.in_flight[:2])
  workers = 1 if parts.axis_name is None else jax.lax.axis_size(parts.axis_name)
  direction = _direction(parts, averaged[0], delta, old[0], workers)
  anchor, outer_state = outer_lib.outer_step(
    parts.outer, None, state.anchor, direction, state.outer_state[0], jnp.float32(1)
  )
  merged = _merged(parts, anchor, state.anchor, local_params, old[0])
  if parts.merge in WINDOW_MERGES:  # The round's steps from where the last freeze left it.
    delta = _pseudo_gradient(anchor, merged)
  # The bases must be one on every worker: computed from the freshest pseudo-gradient
  # they all hold, the landed mean; with one worker the fresh one is the mean.
  fresh_bases = workers == 1 and parts.merge != "delayed"
  basis_source, refreshed = (delta, jnp.float32(1)) if fresh_bases else (averaged[0], landed)
  inner_state = _corrected_moments(
    parts, state.inner_state, old[1], averaged[1], landed, parts.sync_every
  )
  inner_state = parts.refresh.at_sync(inner_state, basis_source, grads, None, refreshed)
  state = state._replace(
    inner_state=inner_state,
    anchor=anchor,
    outer_state=(outer_state,),
    syncs=state.syncs + 1,
    # The moments frozen after this landing, in the bases the next landing corrects in.
    in_flight=state.in_flight._replace(
      message=chunks_lib.freeze(
        _message(parts, delta, inner_state), chunks(parts), dtypes=_dtypes(state.in_flight)
      )
    ),
  )
  return state, merged


def correction_scales(correction: str, merge: str, workers: int) -> tuple[float, float]:
  r"""``(f, g)``: the weights of the fresh part :math:`D'_m / M` and of the stale part
  :math:`\bar D - D_m / M` of the direction a landing hands the outer optimizer
  (MATH.md §9, the delay-corrected outer step), with :math:`w = 1/M` eager, 0 delayed:

  ``"step"``: :math:`f = g = s = 1 / (1 + \sqrt{1 - w})^2`, the outer step that
  critically damps the mean recursion :math:`e' = e - c((1 - w) e_\text{old} + w e)` at
  :math:`c = 1` (1 with one worker eager; 1/4 delayed); ``"staleness"``: :math:`f = 1`,
  :math:`g = (1 - w) / 4`, the stale part alone scaled to the same damping; ``"damped"``:
  :math:`f = g =` :data:`DAMPED_SCALE` (1 with one worker eager), the averaging outer's
  step shortened; ``"none"``: ``(1, 1)``."""
  w = 1.0 / workers if merge == "eager" else 0.0
  if correction == "step":
    s = 1.0 / (1.0 + math.sqrt(1.0 - w)) ** 2
    return s, s
  if correction == "staleness":
    return 1.0, (1.0 - w) / 4.0
  if correction == "damped" and w < 1.0:
    return DAMPED_SCALE, DAMPED_SCALE
  return 1.0, 1.0


def _direction(parts: RoundParts, averaged, delta, frozen, workers: int):
  r"""What the outer optimizer takes at a landing of a whole round: eager
  :math:`f D'_m / M + g (\bar D - D_m / M)`, delayed :math:`g \bar D`, rebase and
  streaming :math:`\bar D` (:func:`correction_scales` gives ``f, g``; ``(1, 1)`` is
  Kale et al.'s eager, :math:`\bar D + (D'_m - D_m) / M`)."""
  f, g = correction_scales(parts.delay_correction, parts.merge, workers)
  if parts.merge == "eager" and (f, g) == (1.0, 1.0):
    return jax.tree.map(lambda b, d, o: b + (d - o) / workers, averaged, delta, frozen)
  if parts.merge == "eager" and f == g:
    return jax.tree.map(lambda b, d, o: f * (b + (d - o) / workers), averaged, delta, frozen)
  if parts.merge == "eager":
    return jax.tree.map(
      lambda b, d, o: f * (d / workers) + g * (b - o / workers), averaged, delta, frozen
    )
  if parts.merge == "delayed" and g != 1.0:
    return jax.tree.map(lambda b: g * b, averaged)
  return averaged


def correction_of(r, outer_optimizer) -> str:
  """The delay correction a round with the options ``r`` and ``outer_optimizer`` takes:
  ``r.delay_correction``, or (``None``) for a whole round merged eager or delayed
  ``"staleness"`` with an outer optimizer given (a momentum outer, DiLoCo's, grows with a
  mean a round late), and with the averaging outer (``None``), whose mean recursion has
  spectral radius at most 1 at every M (MATH.md §9), ``"damped"`` eager (its fast
  directions damped, its slow ones kept near their pace) and ``"none"`` delayed; else
  ``"none"``."""
  if r.delay_correction is not None:
    return r.delay_correction
  merge = merge_of(r)
  if r.overlap != "round" or merge not in CORRECTED_MERGES:
    return "none"
  if outer_optimizer is not None:
    return "staleness"
  return "damped" if merge == "eager" else "none"


def mean_radius(rate: float, momentum: float, nesterov: bool, fresh: float, stale: float) -> float:
  r"""The largest spectral radius, over the share :math:`a \in (0, 1]` of the way a round
  covers, of the round's mean recursion (MATH.md §9) with an outer ``optax.sgd(rate,
  momentum, nesterov)`` taking :math:`a (\text{fresh}\, e_k + \text{stale}\, e_{k-1})`:
  below 1 the error of the workers' mean shrinks, above 1 it grows."""
  worst = 0.0
  for a in np.linspace(0.02, 1.0, 50):
    d = np.array([a * fresh, a * stale, 0.0])  # the direction, on (e_k, e_{k-1}, b)
    b = d + np.array([0.0, 0.0, momentum])  # b' = momentum b + d
    step = d + momentum * b if nesterov else b
    matrix = np.stack([np.array([1.0, 0.0, 0.0]) - rate * step, [1.0, 0.0, 0.0], b])
    worst = max(worst, float(np.max(np.abs(np.linalg.eigvals(matrix)))))
  return worst


def warn_if_unstable(
  name: str, merge: str, correction: str, rate: float, momentum: float, nesterov: bool
) -> None:
  """A warning where an outer ``optax.sgd(rate, momentum, nesterov)`` with a whole round
  merged eager or delayed and ``delay_correction=correction`` makes the round's mean
  recursion grow at some worker count (:func:`mean_radius` of the delayed mean, the limit
  of eager at many workers, scaled as ``correction`` scales it, at or above 1), naming the
  stable setting."""
  if merge not in CORRECTED_MERGES:
    return
  _, stale = correction_scales(correction, "delayed", 1)
  radius = mean_radius(rate, momentum, nesterov, 0.0, stale)
  if radius < 1.0:
    return
  checks.warn(
    f"{name}: outer_learning_rate={rate!r}, outer_momentum={momentum!r} with "
    f"overlap='round', merge={merge!r} and delay_correction={correction!r} is unstable "
    f"with a mean that lands a round late: the round's mean recursion has spectral radius "
    f"up to {radius:.2f} at many workers (MATH.md §9), and training can diverge (it does "
    "at 8 workers whose data differ). Use delay_correction='staleness' (the default) or "
    "'step', which keep this outer optimizer stable at any worker count."
  )


def _pseudo_gradient(anchor, params):
  """``anchor - params`` in float32."""
  return jax.tree.map(lambda a, p: (a - p).astype(jnp.float32), anchor, params)


def _merged(parts: RoundParts, anchor, old_anchor, local_params, frozen):
  r"""A worker's parameters after a landing onto ``anchor`` (MATH.md §9): the anchor
  (eager, delayed); *rebase*: :math:`\text{anchor} + (\theta_m - (\text{anchor}_\text{old}
  - D_m))`, the worker's steps since its message ``frozen`` (:math:`D_m`) was frozen
  added; *streaming*: :math:`\alpha \theta_m + (1 - \alpha)\, \text{anchor}`."""
  if parts.merge == "rebase":
    return jax.tree.map(
      lambda new, x, a, d: new + (x - (a - d)).astype(new.dtype),
      anchor,
      local_params,
      old_anchor,
      frozen,
    )
  if parts.merge == "streaming":
    alpha = parts.merge_alpha
    return jax.tree.map(lambda new, x: alpha * x + (1 - alpha) * new, anchor, local_params)
  return anchor


def freeze(parts: RoundParts, state, params, local_updates, lay, fragment=None):
  """At a boundary with ``overlap=tau`` (of ``fragment``'s round, streaming): this
  worker's message of the fragment's leaves frozen, nothing sent."""
  local_params = optax.apply_updates(params, local_updates)
  delta = jax.tree.map(lambda a, p: (a - p).astype(jnp.float32), state.anchor, local_params)
  dtypes = _dtypes(state.in_flight)
  message = _frozen(parts, delta, state.inner_state, lay, fragment, dtypes=dtypes)
  return state._replace(in_flight=state.in_flight._replace(message=message))


def land_window(parts: RoundParts, state, params, local_updates, grads, lay, f=0, fragment=None):
  r"""At :math:`t_0 + \tau` with ``overlap=tau``: the message frozen at :math:`t_0` lands
  (fragment ``f``'s leaves, ``fragment``, with its own outer state, streaming).

  .. math::
    \tilde\theta = \text{anchor} + \text{outer}(\bar D), \qquad
    \theta_m \leftarrow \tilde\theta + (\theta_m - (\text{anchor}_\text{old} - D_m))
    \ \text{(rebase)}, \quad
    \alpha \theta_m + (1 - \alpha) \tilde\theta \ \text{(streaming)}

  with the moments corrected by :math:`\beta^\tau` and the bases computed from
  :math:`\bar D`. Returns the state and this worker's new parameters.
  """
  local_params = optax.apply_updates(params, local_updates)
  as_float32 = jax.tree.map(lambda p: p.astype(jnp.float32), params)
  like = _message(parts, as_float32, state.inner_state, fragment)
  old, averaged = (chunks_lib.thaw(b, like) for b in state.in_flight[:2])
  anchor, outer_state = outer_lib.outer_step(
    parts.outer, fragment, state.anchor, averaged[0], state.outer_state[f], jnp.float32(1)
  )
  mine = functools.partial(moment_trees.select, fragment=fragment)
  merged = _merged(parts, mine(anchor), mine(state.anchor), mine(local_params), old[0])
  inner_state = _corrected_moments(
    parts, state.inner_state, old[1], averaged[1], jnp.float32(1), parts.overlap, fragment
  )
  inner_state = parts.refresh.at_sync(inner_state, averaged[0], grads, fragment, jnp.float32(1))
  outer_states = state.outer_state
  state = state._replace(
    inner_state=inner_state,
    anchor=anchor,
    outer_state=(*outer_states[:f], outer_state, *outer_states[f + 1 :]),
    syncs=state.syncs.at[f].add(1),
  )
  return state, moment_trees.merge(local_params, merged)


def _corrected_moments(
  parts: RoundParts, inner_state, own, means, landed, steps, fragment=None
) -> Any:
  """Each averaged moment of the leaves in ``fragment`` as if the mean had replaced this
  worker's at the boundary it was frozen: :math:`x \\mathrel{+}= \\beta^K (\\bar X - X_m)`
  (an EMA is linear in its start); ``steps`` is how long it was in flight."""
  fields = [f for _, group in parts.moment_groups for f in group]
  decays = dict(zip(("mu", "nu"), parts.moment_decays, strict=True))
  for field, mine, averaged in zip(fields, own, means, strict=True):
    factor = landed * decays[field] ** steps
    current = moment_trees.moment_tree(inner_state, field, fragment)
    corrected = jax.tree.map(lambda x, b, m, f=factor: x + f * (b - m), current, averaged, mine)
    inner_state = moment_trees.with_moments(inner_state, field, corrected)
  return inner_state


def _is_window(overlap) -> bool:
  """``overlap`` is tau, an int >= 1 (not ``"round"``, ``None`` or 0)."""
  return isinstance(overlap, int) and not isinstance(overlap, bool) and overlap > 0


def merge_of(r) -> str | None:
  """The merge a round with the options ``r`` takes: ``r.merge``, or the overlap's
  default (``"eager"`` for ``"round"``, ``"rebase"`` for tau); ``None`` without overlap."""
  if not r.overlap:
    return None
  if r.merge is not None:
    return r.merge
  return (WINDOW_MERGES if _is_window(r.overlap) else MERGES)[0]


def check(name, r, sync_every, fragments):
  """``overlap``, ``merge`` and ``merge_alpha``, checked against the options they need
  (``fragments``: ``None`` is 1)."""
  window = _is_window(r.overlap)
  if window and not (callable(sync_every) or r.overlap < sync_every):
    raise ValueError(
      f"{name}: overlap={r.overlap!r} is not accepted with sync_every={sync_every}; "
      "expected an int in [1, sync_every), or 'round' for a whole round in flight."
    )
  if not window:
    checks.one_of(name, "overlap", r.overlap, (None, 0, "round"))
  if not r.overlap:
    if r.merge is not None:
      raise ValueError(f"{name}: merge={r.merge!r} needs an overlap; drop merge.")
    _check_correction(name, r, None)
    return
  merge = merge_of(r)
  checks.one_of(name, "merge", merge, WINDOW_MERGES if window else MERGES)
  _check_correction(name, r, merge)
  checks.in_interval(name, "merge_alpha", r.merge_alpha, 0.0, 1.0, closed_high=False)
  if isinstance(r.merge_alpha, numbers.Real) and r.merge_alpha != 0 and merge != "streaming":
    raise ValueError(
      f"{name}: merge_alpha={r.merge_alpha!r} needs merge='streaming'; drop merge_alpha."
    )
  fragments = 1 if fragments is None else fragments
  refused = {  # option: (its value, whether it is refused, why)
    "fragments": (
      fragments,
      r.overlap == "round" and fragments != 1,
      "the round already streams, one chunk a step",
    ),
    "sync_every": (sync_every, callable(sync_every), "the round's length must be a fixed int"),
    "fault_tolerant": (r.fault_tolerant, r.fault_tolerant, "a late message has no presence"),
  }
  for option, (value, bad, why) in refused.items():
    if bad:
      raise ValueError(
        f"{name}: {option}={value!r} is not available with overlap={r.overlap!r} ({why}); "
        "use overlap=None for it."
      )
  if window and isinstance(fragments, int):
    check_spacing(name, sync_every, fragments, r.overlap)


def _check_correction(name, r, merge) -> None:
  """``delay_correction``: one of :data:`CORRECTIONS` (or ``None``), and a correction
  only where a whole round lands eager or delayed."""
  correction = r.delay_correction
  if correction is None:
    return
  checks.one_of(name, "delay_correction", correction, (None, *CORRECTIONS))
  if correction != "none" and (r.overlap != "round" or merge not in CORRECTED_MERGES):
    raise ValueError(
      f"{name}: delay_correction={correction!r} corrects the outer step for a whole "
      "round in flight merged 'eager' or 'delayed', but this round has "
      f"overlap={r.overlap!r} and merge={merge!r}; use overlap='round' with "
      "merge='eager' or 'delayed', or drop delay_correction."
    )


def check_moment_periods(name, overlap, moment_periods, decays) -> None:
  """With an ``overlap``, moments averaged at every sync or never, and their decays
  given: what a method built on the round gives it (DES-LOC's periods, LoRDO's)."""
  if not overlap:
    return
  if any(p not in (None, 1) for p in moment_periods):
    raise ValueError(
      f"{name}: moments averaged every {moment_periods} syncs are not available with "
      f"overlap={overlap!r} (each message freezes the moments of every round); average them "
      "every sync, or use overlap=None."
    )
  if any(p is not None for p in moment_periods) and decays is None:
    raise ValueError(
      f"{name}: overlap={overlap!r} with moment averaging needs moment_decays=(b1, b2), the "
      "inner optimizer's, to correct the moments at a landing."
    )


def overlap_phase(step: int, *, sync_every: int, overlap: Any, fragments: int = 1) -> str:
  """The phase of update number ``step`` of an optimizer built with ``overlap``: pass it
  as ``update(..., overlap_phase=...)``, a static value (MATH.md §9).

  ``"send"`` when that update sends a chunk of the message in flight (every update
  with ``overlap="round"``; with an int ``overlap=tau``, the first tau updates of every
  round after the first, and with ``fragments`` the tau updates after each fragment's
  sync), else ``"local"``. Compiled with ``"send"``, a step's chunk is
  one collective outside any conditional that reads only the state carried in, which
  XLA may run under the step's forward and backward pass; so a training step jitted
  with the phase static compiles two programs, each once. The phase only places the
  collective: a wrong one costs a chunk sent for nothing (``"send"``) or the chunk sent
  inside a conditional (``"local"``), never a wrong number; without it every step takes
  the traced path (the same numbers, the chunks inside a conditional).

  Args:
    step: the number of updates before this one (the optimizer's step count, 0 first),
      a Python int computed on the host.
    sync_every: K, the optimizer's ``sync_every``.
    overlap: the optimizer's ``overlap``.
    fragments: the optimizer's ``fragments``, an int (for a function of the params, the
      number of fragments it gives).

  Returns:
    ``"send"`` or ``"local"``.

  Examples:
    >>> import lordo_jax
    >>> [lordo_jax.overlap_phase(s, sync_every=4, overlap=2) for s in range(9)]
    ['local', 'local', 'local', 'local', 'send', 'send', 'local', 'local', 'send']
  """
  if isinstance(step, jax.core.Tracer) or not isinstance(step, numbers.Integral) or step < 0:
    raise TypeError(
      f"overlap_phase: step={step!r} must be a non-negative Python int, the count of "
      "updates so far kept on the host (a training loop's counter), not a traced value."
    )
  if overlap == "round":
    return "send"
  if not overlap:
    return "local"
  checks.positive_int("overlap_phase", "fragments", fragments)
  check_spacing("overlap_phase", sync_every, fragments, overlap)
  senders, indices = window_positions(sync_every, fragments, overlap)
  t = step + 1  # the update's count, 1-based
  frozen_at = t - indices[t % sync_every] - 1
  return "send" if senders[t % sync_every] >= 0 and frozen_at >= 1 else "local"


def check_phase(name: str, overlap: Any, phase: Any) -> None:
  """``update(..., overlap_phase=phase)``, checked against the optimizer's ``overlap``."""
  if phase is None:
    return
  maker = "lordo_jax.overlap_phase(step, sync_every=..., overlap=...)"
  checks.static_phase(name, "overlap_phase", phase, PHASES, maker)
  if not overlap and phase == "send":
    raise ValueError(
      f"{name}: overlap_phase='send' was given, but this optimizer was built with "
      "overlap=None, which sends nothing between syncs; build it with an overlap."
    )
  if overlap == "round" and phase != "send":
    raise ValueError(
      f"{name}: overlap_phase={phase!r} with overlap='round', where every step sends a "
      "chunk; pass 'send' or no phase."
    )


def window_step(parts: RoundParts, grads, state, params, local_updates, count, phase=None):
  """``overlap=tau``: the chunks at steps t0+1 .. t0+tau, the landing at t0+tau and the
  freeze at a boundary, each fragment at its own boundaries t0 (streaming:
  :func:`window_positions`). With ``phase="send"`` the chunk is sent unconditionally
  (kept only on a step that sends, :func:`overlap_phase`), otherwise inside a
  conditional."""
  k, tau = parts.sync_every, parts.overlap
  lay = state_layout(parts, state)
  check_spacing(parts.name, k, len(lay.masks), tau)
  senders, indices = (jnp.asarray(x, jnp.int32) for x in window_positions(k, len(lay.masks), tau))
  sender, index = senders[count % k], indices[count % k]
  # A message is in flight when the step that froze it (count - index - 1) was taken.
  sending = (sender >= 0) & (count - index > 1)
  send = functools.partial(send_chunk, parts, index=index)
  residual_row = jnp.maximum(sender, 0) * tau + index
  if phase == "send":
    in_flight_state, ledger = send(state, residual_row=residual_row, sending=sending)
  else:
    in_flight_state, ledger = jax.lax.cond(
      sending,
      lambda s: send(s, residual_row=residual_row),
      lambda s: (s.in_flight, s.ledger),
      state,
    )
  state = state._replace(in_flight=in_flight_state, ledger=ledger)
  new_params = optax.apply_updates(params, local_updates)
  offsets = periods.fragment_offsets(k, len(lay.masks))
  for f, (fragment, offset) in enumerate(zip(lay.masks, offsets, strict=True)):
    land = functools.partial(
      land_window, parts, params=params, local_updates=local_updates, grads=grads, lay=lay, f=f
    )
    land = _on_device(parts, functools.partial(land, fragment=fragment))
    state, new_params = jax.lax.cond(  # At most one fragment lands at a step.
      (count % k == (offset + tau) % k) & (count > tau),
      lambda s, n, land=land: land(s),
      lambda s, n: (s, n),
      state,
      new_params,
    )
  for fragment, offset in zip(lay.masks, offsets, strict=True):
    state = jax.lax.cond(
      count % k == offset,
      _on_device(
        parts, lambda s, fragment=fragment: freeze(parts, s, params, local_updates, lay, fragment)
      ),
      lambda s: s,
      state,
    )
  updates = jax.tree.map(lambda n, p, u: (n - p).astype(u.dtype), new_params, params, local_updates)
  return updates, state


def window_positions(sync_every: int, fragments: int, tau: int) -> tuple[list, list]:
  r"""Which fragment sends which chunk at each position of a round, ``overlap=tau``.

  Fragment f is frozen at the steps :math:`t \equiv o_f \pmod K`
  (:func:`lordo_jax.round._periods.fragment_offsets`; F = 1: the round's end) and sends
  chunk j at :math:`t \equiv o_f + 1 + j`, j < tau; it lands at :math:`o_f + \tau`.
  With tau below the spacing of the offsets (:func:`check_spacing`) one fragment at a
  time is in flight.

  Returns:
    ``(senders, chunks)``, each K ints indexed by :math:`t \bmod K`: the fragment
    sending (-1: none) and its chunk (0 where none sends).
  """
  senders, indices = [-1] * sync_every, [0] * sync_every
  for f, offset in enumerate(periods.fragment_offsets(sync_every, fragments)):
    for j in range(tau):
      senders[(offset + 1 + j) % sync_every], indices[(offset + 1 + j) % sync_every] = f, j
  return senders, indices


def check_spacing(name: str, sync_every: int, fragments: int, tau: int) -> None:
  """``overlap=tau`` with F fragments: tau below the fewest steps between two fragments'
  syncs, so that one fragment's message at a time is in flight (Streaming DiLoCo)."""
  offsets = sorted(periods.fragment_offsets(sync_every, fragments))
  following = [*offsets[1:], offsets[0] + sync_every]
  spacing = min(b - a for a, b in zip(offsets, following, strict=True))
  if tau >= spacing:
    raise ValueError(
      f"{name}: overlap={tau} with fragments={fragments} and sync_every={sync_every} is "
      f"not accepted: a fragment syncs every {spacing} steps, and a fragment's message "
      f"must land before the next one is frozen. Use overlap < {spacing}, fewer "
      "fragments, or a longer sync_every."
    )


def round_step(parts: RoundParts, grads, state, params, local_updates, count):
  """A whole round in flight (:mod:`lordo_jax.round._overlap`): this step's chunk
  (unconditional), and at a boundary the landing, whose update lands on the anchor."""
  index = (count - 1) % parts.sync_every
  in_flight, ledger = send_chunk(parts, state, index)
  state = state._replace(ledger=ledger, in_flight=in_flight)

  def landing(s):
    s, merged = land(parts, s, params, local_updates, grads)
    onto = jax.tree.map(lambda a, p, u: (a - p).astype(u.dtype), merged, params, local_updates)
    return s, onto

  state, updates = jax.lax.cond(
    count % parts.sync_every == 0,
    _on_device(parts, landing),
    lambda s: (s, local_updates),
    state,
  )
  return updates, state


def _on_device(parts: RoundParts, branch):
  """``branch(state)`` with what offload keeps in host memory (the anchor, the outer
  state, the message in flight) moved to the device for it and back after it."""
  if not parts.offload:
    return branch

  def run(state):
    out = branch(offload_lib.placed(state, offload_lib.to_device))
    if isinstance(out, tuple) and not hasattr(out, "_fields"):
      return (offload_lib.placed(out[0], offload_lib.to_host), *out[1:])
    return offload_lib.placed(out, offload_lib.to_host)

  return run
