r"""Infrequent synchronisation: :func:`synchronize`, the K-step round of MATH.md §4.

The round's parts are modules of their own: when it ends (``_periods``,
``_schedule``), how messages are averaged (``_averaging``), the pseudo-gradient and
outer step (``_outer_step``), the moments (``_moment_averaging``), the bases
(``_basis_refresh``), failed workers (``_faults``) and host offload (``_offload``).
Every collective goes through :mod:`lordo_jax.comm._collectives`, inside the round's
``lax.cond``, so nothing is sent or computed for the round on other steps (a program
compiled for a round's end, ``round_phase="boundary"``, runs it with no conditional).
"""

import functools
from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from lordo_jax import _checks as checks
from lordo_jax import _keywords as keywords
from lordo_jax import _tree_structure as state_structure
from lordo_jax.comm import _collectives as collectives
from lordo_jax.comm import _compression as compression_lib
from lordo_jax.local import _low_rank_adam as low_rank_lib
from lordo_jax.round import _averaging as averaging_lib
from lordo_jax.round import _basis_refresh as basis_refresh
from lordo_jax.round import _faults as faults_lib
from lordo_jax.round import _moment_averaging as moment_averaging
from lordo_jax.round import _moment_trees as moment_trees
from lordo_jax.round import _offload as offload_lib
from lordo_jax.round import _outer_step as outer_lib
from lordo_jax.round import _overlap as overlap_lib
from lordo_jax.round import _periods as periods
from lordo_jax.round import _round_phase as round_phases
from lordo_jax.round import _schedule as schedule
from lordo_jax.round._faults import FaultCounts
from lordo_jax.round._round_options import BASIC_KEYWORDS
from lordo_jax.round._round_options import ROUND_KEYWORDS
from lordo_jax.round._round_options import RoundOptions
from lordo_jax.round._round_parts import RoundParts

PROJECTION_SOURCES = basis_refresh.SOURCES


class SynchronizeState(NamedTuple):
  """State of :func:`synchronize`.

  A feature that is off keeps its field as the empty tuple ``()`` (``residual`` without
  compression, ``in_flight`` without overlap): a pytree with no leaves, so it holds no
  memory and adds nothing to a checkpoint, and every state has the same fields, whatever
  the options.
  """

  count: jax.Array  # int32 scalar: steps taken.
  inner_state: Any  # The local optimizer's state.
  anchor: Any  # Params at the last sync, the same on every worker (host-offloadable).
  outer_state: tuple  # The outer optimizer's state, one per fragment (host-offloadable).
  ledger: collectives.Ledger  # What this wrapper has all-reduced since init.
  faults: FaultCounts  # Workers left out of syncs (fault_tolerant=True).
  syncs: jax.Array  # int32[F]: syncs completed, per fragment.
  next_sync: jax.Array  # int32 scalar: the step that ends the current round.
  residual: Any  # float32 like params: compression error feedback; () without compression.
  in_flight: overlap_lib.InFlight | tuple[()] = ()  # With overlap: the message in flight.


def check_round(name: str, sync_every: periods.SyncPeriod, r: RoundOptions) -> None:
  """The round's options, each checked once, in the name of the public factory ``name``
  that was given them: ``sync_every`` (an int >= 1, or a rule, which warns when its first
  round never ends), ``compression``, ``fragments`` (at most K, not with a rule),
  ``fault_tolerant`` (not with streaming or compression), ``offload``, and ``overlap``,
  ``merge`` and ``merge_alpha`` (:func:`lordo_jax.round._overlap.check`). That none is
  an array was checked when the factory bound its keywords (:mod:`lordo_jax._keywords`)."""
  periods.warn_if_first_round_never_ends(sync_every, name)
  if not callable(sync_every):
    checks.positive_int(name, "sync_every", sync_every)
  compression, fault_tolerant = r.compression, r.fault_tolerant
  fragments = 1 if r.fragments is None else r.fragments
  if compression is not None:
    checks.one_of(name, "compression", compression, (None, *compression_lib.CODECS))
  if callable(fragments):
    streaming = True
  else:
    checks.positive_int(name, "fragments", fragments)
    streaming = fragments > 1
  if streaming and callable(sync_every):
    raise ValueError(
      f"{name}: fragments={fragments!r} staggers the fragments' syncs over a fixed "
      "round, but sync_every is a function of the step; use an int sync_every with "
      "fragments, or fragments=1 with a schedule."
    )
  if isinstance(fragments, int) and not callable(sync_every) and fragments > sync_every:
    raise ValueError(
      f"{name}: fragments={fragments} is not accepted with sync_every={sync_every}; "
      f"expected at most {sync_every} fragments (each syncs at its own step of the "
      "round)."
    )
  if fault_tolerant and (streaming or compression is not None):
    raise ValueError(
      f"{name}: fault_tolerant=True is not available with fragments={fragments!r} or "
      f"compression={compression!r}; use fragments=1 and compression=None to leave "
      "failed workers out of the averages."
    )
  checks.one_of(name, "offload", r.offload, (False, True))
  overlap_lib.check(name, r, sync_every, fragments)


@keywords.takes(BASIC_KEYWORDS, ROUND_KEYWORDS)
def synchronize(
  inner: optax.GradientTransformation,
  *,
  sync_every: periods.SyncPeriod,
  axis_name: str | None = None,
  outer_optimizer: optax.GradientTransformation | None = None,
  first_moment_every: int | None = 1,
  second_moment_every: int | None = 1,
  low_rank: low_rank_lib.LowRankAdam | None = None,
  init_projection: str | None = "gradient",
  projection_source: str = "pseudo_gradient",
  moment_decays: tuple[float, float] | None = None,
  name: str = "synchronize",
  compression: str | None = None,
  fragments: int | Callable | None = None,
  fault_tolerant: bool = False,
  overlap: str | int | None = None,
  merge: str | None = None,
  delay_correction: str | None = None,
  merge_alpha: float = 0.0,
  offload: bool = False,
) -> optax.GradientTransformationExtraArgs:
  r"""Local steps with ``inner``, a synchronisation at the end of every round.

  Every step applies the local optimizer; at the end of every round (step :math:`t`
  with :math:`t \bmod K = 0` for an int ``sync_every``) each worker also

  1. forms the pseudo-gradient :math:`\Delta_m = \text{anchor} - \theta_m`, where
     :math:`\theta_m` is this worker's parameters after its local step;
  2. averages it, :math:`\Delta = \mathrm{pmean}_m(\Delta_m)` (the one full-size
     message of the round);
  3. takes the outer step :math:`\theta = \text{anchor} + \text{outer}(\Delta)`, with
     :math:`\text{outer}(\Delta)` the outer optimizer's update, and sets the anchor to
     :math:`\theta` (default outer ``optax.sgd(1.0)``, whose update is :math:`-\Delta`:
     :math:`\theta` is the mean of the workers' parameters);
  4. averages the optimizer moments (low-rank ones, ``r x q``, and the full-rank
     path's Adam moments) every ``first_moment_every`` / ``second_moment_every`` syncs;
  5. refreshes every low-rank basis from :math:`\Delta` (identical on every worker, so
     the subspace is shared for free) and transports the moments into it;
  6. returns :math:`\theta - \text{params}` as the update, so that
     ``optax.apply_updates`` lands every worker on :math:`\theta`.

  Before the first step with ``init_projection="gradient"`` the first gradient is
  averaged (one counted full-size message) and every basis is computed from it.

  Beyond the paper, three options change how a round communicates:

  * ``compression="bfloat16" | "int8"``: every message is sent compressed
    (MATH.md §4.2); the pseudo-gradient with per-worker
    error feedback of what the rounding lost (:attr:`SynchronizeState.residual`), so
    nothing is lost over time; the moments without (each sync replaces them by their
    average, so there is nothing to feed a residual into), and in bfloat16 when the
    pseudo-gradient goes in int8.
  * ``fragments=F`` (streaming, as in Streaming DiLoCo): the parameters are cut into F
    fragments that sync at staggered steps of the round, fragment f at the steps
    :math:`t \equiv o_f \pmod K`, :math:`o_f = \lfloor (f + 1) K / F \rfloor`. Each
    fragment has its own outer-optimizer state; its moments are averaged and its bases
    refreshed at its own syncs. Every leaf still syncs once per K steps, so the total
    sent is unchanged and the largest message is about 1/F of the model.
  * ``sync_every`` a function of the step, such as the
    Quadratic Synchronization Rule: rounds of varying length, with no recompilation.

  The update needs ``params``. It must be the
  last transformation that changes the update: at a sync the update lands every
  worker on the synchronised parameters, and a transformation chained after it would
  make the workers part (:func:`lordo_jax.worker_disagreement` shows it).

  With ``fault_tolerant=True`` a worker can drop out of rounds without harming the
  others. A local step whose gradient is not finite is skipped (zero update, local
  state unchanged) and marks the worker failed for the round; the caller can also
  mark it absent with the extra argument ``update(..., worker_present=False)``, read
  at the steps that end a round (and at step 1, for the first gradient). At the
  sync, the pseudo-gradient and the moments are averaged over the workers that are
  present (not failed, not marked absent, finite pseudo-gradient); every worker,
  absent ones included, then takes the synchronised parameters, moments and bases,
  and an absent worker's error-feedback buffers are zeroed: nothing of its dropped
  round survives, and a worker away for whole rounds counts again at the first sync
  it is present at. If no worker is present the sync keeps the anchor, the outer
  state and the bases. :attr:`SynchronizeState.faults` counts both. The cost is one
  float32 scalar more per averaged message (the presence weight), which the ledger
  counts; an absent worker still takes part in every all-reduce (zeros, weight 0),
  so the ledger is that of a run with every worker present.

  Args:
    inner: the local optimizer (it produces the per-step update, learning rate
      included). Its Adam-like states (``optax.ScaleByAdamState`` and
      :class:`~lordo_jax.local._low_rank_adam.LowRankAdamState`) are what gets averaged. It
      must not communicate: a sync step runs it twice (see ``_sync_fragment``).
    {options}
    first_moment_every: average the first moments every this many syncs (``None``:
      never).
    second_moment_every: the same for the second moments.
    low_rank: the :class:`~lordo_jax.local._low_rank_adam.LowRankAdam` inside ``inner``, if
      any: its bases are refreshed at every sync.
    init_projection: ``"gradient"``: before step 1 the first gradient is averaged
      and the bases are computed from it; ``None``: ``low_rank`` sets its own first
      basis.
    projection_source: ``"pseudo_gradient"`` (the averaged :math:`\Delta`, shared by
      all workers) or ``"local_gradient"`` (each worker's own gradient of the sync
      step, no message; the bases then differ between workers, so moments should
      not be averaged).
    moment_decays: ``(b1, b2)`` of the inner optimizer's Adam moments; needed only by
      ``overlap="round"`` with moment averaging (the correction of MATH.md §9).
    name: how errors name this transformation.

  Returns:
    An ``optax.GradientTransformationExtraArgs``; extra args other than
    ``worker_present`` and :func:`~lordo_jax.overlap_phase` go to ``inner``. With an int
    ``overlap``,
    ``update(..., overlap_phase=lordo_jax.overlap_phase(step, ...))``, a static value,
    compiles the steps that send a chunk with the chunk outside any conditional
    (:func:`lordo_jax.overlap_phase`); without it the same numbers, no overlap.

  Examples:
    >>> import jax.numpy as jnp, optax, lordo_jax
    >>> tx = lordo_jax.synchronize(optax.adamw(1e-3), sync_every=4)
    >>> params = {"w": jnp.ones((3, 2))}
    >>> state = tx.init(params)
    >>> updates, state = tx.update({"w": jnp.ones((3, 2))}, state, params)

  References:
    Douillard et al., DiLoCo, 2023 (arXiv 2311.08105); Iacob et al., DES-LOC, 2025
    (arXiv 2505.22549); Jovanović et al., LoRDO, 2026 (arXiv 2602.04396); Douillard
    et al., Streaming DiLoCo, 2025 (arXiv 2501.18512).
  """
  r = keywords.build(RoundOptions, locals())
  check_round(name, sync_every, r)
  checks.positive_int(name, "first_moment_every", first_moment_every, optional=True)
  checks.positive_int(name, "second_moment_every", second_moment_every, optional=True)
  checks.one_of(name, "projection_source", projection_source, PROJECTION_SOURCES)
  checks.one_of(name, "init_projection", init_projection, ("gradient", None))
  return synchronized(
    inner,
    sync_every=sync_every,
    axis_name=axis_name,
    outer_optimizer=outer_optimizer,
    first_moment_every=first_moment_every,
    second_moment_every=second_moment_every,
    low_rank=low_rank,
    init_projection=init_projection,
    projection_source=projection_source,
    moment_decays=moment_decays,
    name=name,
    options=r,
  )


def synchronized(
  inner: optax.GradientTransformation,
  *,
  sync_every: periods.SyncPeriod,
  axis_name: str | None,
  outer_optimizer: optax.GradientTransformation | None,
  first_moment_every: int | None,
  second_moment_every: int | None,
  low_rank: low_rank_lib.LowRankAdam | None,
  init_projection: str | None,
  projection_source: str,
  moment_decays: tuple[float, float] | None,
  name: str,
  options: RoundOptions,
) -> optax.GradientTransformationExtraArgs:
  """:func:`synchronize` of ``inner``, every argument already checked by the public
  factory ``name`` (its round's ``options`` by :func:`check_round`), except the one
  that joins the round's options to the method's: whether an overlap takes the moment
  periods. The methods built on the round call this, so that each option is checked
  once, at the public entry."""
  moment_periods = (first_moment_every, second_moment_every)
  overlap_lib.check_moment_periods(name, options.overlap, moment_periods, moment_decays)
  averaging = averaging_lib.choose(
    axis_name, fault_tolerant=options.fault_tolerant, compression=options.compression
  )
  parts = RoundParts(
    inner=optax.with_extra_args_support(inner),
    outer=outer_lib.outer_transform(outer_optimizer),
    sync_every=sync_every,
    fragments=1 if options.fragments is None else options.fragments,
    averaging=averaging,
    moment_groups=moment_averaging.moment_groups(first_moment_every, second_moment_every),
    refresh=basis_refresh.BasisRefresh(
      low_rank, init_projection, projection_source, averaging.gradient_mean
    ),
    axis_name=axis_name,
    offload=bool(options.offload),
    name=name,
    fault_tolerant=options.fault_tolerant,
    overlap=options.overlap or None,
    merge=overlap_lib.merge_of(options),
    delay_correction=overlap_lib.correction_of(options, outer_optimizer),
    merge_alpha=options.merge_alpha,
    moment_decays=moment_decays or (0.9, 0.999),
    compression=options.compression,
  )

  init_fn = functools.partial(_init, parts)
  update_fn = functools.partial(_update, parts)
  return optax.GradientTransformationExtraArgs(
    init_fn, state_structure.conformed(init_fn, update_fn, name)
  )


def _update(
  parts: RoundParts,
  grads,
  state,
  params=None,
  *,
  worker_present=True,
  overlap_phase=None,
  round_phase=None,
  **extra_args,
):
  """One step of :func:`synchronize`: the local step, and the rounds that end now."""
  overlap_lib.check_phase(parts.name, parts.overlap, overlap_phase)
  round_phases.check(parts.name, parts.overlap, round_phase)
  _check_update(parts.name, params, parts.axis_name, parts.fault_tolerant, worker_present)
  if parts.offload:  # A state placed in device memory (device_put of init) moves now.
    state = offload_lib.placed(state, offload_lib.to_host)
  count = optax.safe_int32_increment(state.count)
  if parts.overlap:
    return _update_in_flight(parts, grads, state, params, count, overlap_phase, **extra_args)
  averaging = parts.averaging
  if round_phase == "local":
    return _local_update(parts, grads, state, params, count, extra_args)
  masks = schedule.fragment_masks(params, parts.fragments)
  if round_phase == "first" and not round_phases.ends_a_round(1, parts.sync_every, len(masks)):
    return _first_update(parts, grads, state, params, count, worker_present, extra_args)
  # A boundary is not the first update (no first bases), and with one fragment its
  # round ends there: it syncs with no conditional (on a GPU the conditional copied the
  # state in and out of its branch).
  boundary = round_phase == "boundary"
  always = boundary and len(masks) == 1
  present = jnp.asarray(worker_present, jnp.bool_)
  if not boundary:
    inner_state, ledger = parts.refresh.before_first_step(
      count, grads, state.inner_state, state.ledger, averaging.admit(present, grads)
    )
    state = state._replace(inner_state=inner_state, ledger=ledger)

  def local_step():
    """(local updates, inner state, faults) of this step's local optimizer step."""
    updates, inner_state = parts.inner.update(grads, state.inner_state, params, **extra_args)
    return averaging.guard_step(grads, updates, inner_state, state.inner_state, state.faults)

  local_updates, inner_state, faults = local_step()
  present = present & faults.round_ok  # A worker that failed a step this round is absent.
  predicates = schedule.sync_predicates(parts.sync_every, len(masks), count, state.next_sync)
  new_state = state._replace(count=count, inner_state=inner_state, faults=faults)
  # The branch recomputes the local step (see _sync_fragment): an update carried
  # through a conditional is materialised and cannot fuse with apply_updates. A round
  # with no conditional takes the step as computed: traced and compiled once.
  computed = (local_updates, inner_state, faults)
  sync = functools.partial(
    _sync_fragment,
    parts,
    grads=grads,
    params=params,
    local_step=(lambda: computed) if always else local_step,
    present=present,
  )
  rounds = zip(masks, [True] if always else predicates, strict=True)
  new_state, anchor = _end_rounds(parts.offload, sync, rounds, new_state, params)
  # 6. Synchronised leaves land on the anchor, the others take their local step.
  synced_now = schedule.synced_now(params, masks, [True] if always else predicates)
  updates = jax.tree.map(_landing, synced_now, anchor, params, local_updates)
  if boundary:  # Run where no round ends, or at the first update: NaN, never a wrong round.
    updates = round_phases.poisoned(updates, ~round_phases.boundary_due(count, predicates))
  next_sync = schedule.next_sync(parts.sync_every, count, state.next_sync, predicates[-1])
  return updates, new_state._replace(next_sync=next_sync)


def _local_update(parts: RoundParts, grads, state, params, count, extra_args):
  """A step compiled with ``round_phase="local"``: the local step alone, the anchor and
  the outer state passed through; NaN updates where a round ends or the first bases
  are due (:mod:`lordo_jax.round._round_phase`)."""
  masks = schedule.fragment_masks(params, parts.fragments)
  predicates = schedule.sync_predicates(parts.sync_every, len(masks), count, state.next_sync)
  updates, state = _local_step_alone(parts, grads, state, params, count, extra_args)
  return round_phases.poisoned(updates, round_phases.any_due(count, predicates)), state


def _first_update(parts: RoundParts, grads, state, params, count, worker_present, extra_args):
  """A step compiled with ``round_phase="first"`` where no round can end at the first
  update (K > 1, no fragment's offset at 1): the first bases, then the local step alone;
  NaN updates at any other update."""
  present = parts.averaging.admit(jnp.asarray(worker_present, jnp.bool_), grads)
  inner_state, ledger = parts.refresh.before_first_step(
    count, grads, state.inner_state, state.ledger, present
  )
  state = state._replace(inner_state=inner_state, ledger=ledger)
  updates, state = _local_step_alone(parts, grads, state, params, count, extra_args)
  return round_phases.poisoned(updates, ~round_phases.first_due(count)), state


def _local_step_alone(parts: RoundParts, grads, state, params, count, extra_args):
  """The local optimizer's step and its guard, the anchor and outer state passed
  through: ``(updates, state)``."""
  updates, inner_state = parts.inner.update(grads, state.inner_state, params, **extra_args)
  updates, inner_state, faults = parts.averaging.guard_step(
    grads, updates, inner_state, state.inner_state, state.faults
  )
  return updates, state._replace(count=count, inner_state=inner_state, faults=faults)


def _end_rounds(offload, sync, rounds, state, params):
  """Each fragment's ``sync(f, fragment, state)`` where its round ends (a ``lax.cond``;
  none where the predicate is ``True``, a round known to end here).

  Returns the state and the anchor step 6 lands on, on the device. With offload the
  state's anchor is in host memory, so the one returned is the synchronised one the
  sync branch leaves on the device, and a do-nothing buffer between syncs.
  """
  anchor = jax.tree.map(jnp.zeros_like, params) if offload else state.anchor
  for f, (fragment, predicate) in enumerate(rounds):
    sync_now = functools.partial(sync, f, fragment)
    if predicate is True:  # Due for certain (a boundary program): no conditional.
      if offload:
        state, anchor = _sync_offloaded(sync_now, state)
      else:
        state = sync_now(state)
        anchor = state.anchor
    elif offload:
      state, anchor = jax.lax.cond(
        predicate,
        lambda s, a, sync_now=sync_now: _sync_offloaded(sync_now, s),
        lambda s, a: (s, a),
        state,
        anchor,
      )
    else:
      state = jax.lax.cond(predicate, sync_now, lambda s: s, state)
      anchor = state.anchor
  return state, anchor


def _landing(synced_now, anchor, params, local_updates):
  """Step 6 for one leaf: onto the anchor if it synced now, else the local update."""
  return jnp.where(synced_now, (anchor - params).astype(local_updates.dtype), local_updates)


def _init(parts: RoundParts, params) -> SynchronizeState:
  """The state before step 1: the anchor is ``params``, nothing synced or sent."""
  masks = schedule.fragment_masks(params, parts.fragments)
  state = SynchronizeState(
    count=jnp.zeros([], jnp.int32),
    inner_state=parts.inner.init(params),
    anchor=jax.tree.map(jnp.copy, params),  # Its own buffers, so a donated step can update it.
    outer_state=outer_lib.init_outer_states(parts.outer, params, masks),
    ledger=collectives.init_ledger(),
    faults=faults_lib.init_fault_counts(),
    syncs=jnp.zeros([len(masks)], jnp.int32),
    next_sync=periods.round_length(parts.sync_every, 0),
    residual=parts.averaging.init_residual(params),
  )
  if parts.overlap:  # The message's residual is per chunk, in the message in flight.
    in_flight = overlap_lib.init(parts, params, state.inner_state)
    state = state._replace(residual=(), in_flight=in_flight)
  return offload_lib.placed(state, offload_lib.to_host) if parts.offload else state


def _sync_offloaded(sync_now, state):
  """``sync_now(state)`` with the sync-only state in host memory: moved to the device,
  synchronised, moved back; returns the new state and its anchor on the device."""
  state = sync_now(offload_lib.placed(state, offload_lib.to_device))
  return offload_lib.placed(state, offload_lib.to_host), state.anchor


def _sync_fragment(parts: RoundParts, f, fragment, state, *, grads, params, local_step, present):
  """Steps 1-5 of the round for the leaves in ``fragment`` (fragment ``f``): the new
  state, whose anchor holds the synchronised parameters of those leaves.

  The local updates are recomputed inside the sync branch (``local_step()``) rather
  than taken as an operand: a conditional's operands are materialised buffers, so
  carrying the update through it made every local step write it out and read it back,
  and kept ``optax.apply_updates`` from fusing with the step (a third of a local step
  on a 768 x 3072 matrix on CPU, ``benchmarks/speed/step_speed.py``). Hence the inner optimizer
  must not communicate: a sync step runs it twice.

  Args:
    parts: the round's parts.
    f: the fragment's index.
    fragment: the fragment's leaves (``None``: all).
    state: the state after this step's local step (its count advanced).
    grads: this step's gradient.
    params: the parameters before this step.
    local_step: ``() -> (updates, ...)``, this step's local step.
    present: whether this worker counts in the averages (fault tolerance).
  """
  averaging = parts.averaging
  local_params = optax.apply_updates(params, local_step()[0])
  delta = outer_lib.pseudo_gradient(state.anchor, local_params, fragment)  # 1.
  present = averaging.admit(present, delta)
  delta, fraction, ledger, residual = averaging.pseudo_gradient_mean(  # 2.
    delta, present, state.ledger, state.residual, fragment
  )
  anchor, outer_state = outer_lib.outer_step(  # 3.
    parts.outer, fragment, state.anchor, delta, state.outer_state[f], fraction
  )
  inner_state, ledger = moment_averaging.average_due_moments(  # 4.
    state.inner_state,
    ledger,
    state.syncs[f] + 1,
    parts.moment_groups,
    present,
    fragment,
    averaging.moment_mean,
  )
  inner_state = parts.refresh.at_sync(inner_state, delta, grads, fragment, fraction)  # 5.
  if parts.fault_tolerant:
    inner_state = _errors_dropped_if_absent(inner_state, present)
  outer_states = state.outer_state
  return state._replace(
    inner_state=inner_state,
    anchor=anchor,
    outer_state=(*outer_states[:f], outer_state, *outer_states[f + 1 :]),
    ledger=ledger,
    faults=faults_lib.count_sync(state.faults, fraction, parts.axis_name),
    syncs=state.syncs.at[f].add(1),
    residual=residual,
  )


def _errors_dropped_if_absent(inner_state, present):
  """``inner_state`` with this worker's error-feedback buffers zeroed if it was left out
  of the sync (``present`` false): they hold what its own steps of the dropped round
  left unprojected, and no average replaces them as it does the moments."""
  node = moment_trees.low_rank_state(inner_state)
  if node is None:
    return inner_state

  def drop(m):
    return m._replace(error=jax.tree.map(lambda e: jnp.where(present, e, 0), m.error))

  moments = node.moments.map_groups(drop)  # Elementwise: on the groups' stacks.
  return moment_trees.with_low_rank_state(inner_state, node._replace(moments=moments))


def _check_update(name, params, axis_name, fault_tolerant, worker_present):
  """Errors for an ``update`` call that cannot be served, raised at trace time."""
  if params is None:
    raise ValueError(
      f"{name}: update() needs the current params, to form the pseudo-gradient "
      f"and the synchronised parameters: call tx.update(grads, state, params)."
    )
  collectives.check_axis_bound(axis_name, name)
  if not fault_tolerant and worker_present is not True:
    raise ValueError(
      f"{name}: worker_present was given, but this optimizer was built with "
      "fault_tolerant=False; build it with fault_tolerant=True to leave absent "
      "workers out of the averages."
    )


def _update_in_flight(parts: RoundParts, grads, state, params, count, phase, **extra_args):
  """Step ``count`` with a message in flight: a whole round's, or a window of tau steps."""
  present = parts.averaging.admit(jnp.asarray(True), grads)
  inner_state, ledger = parts.refresh.before_first_step(
    count, grads, state.inner_state, state.ledger, present
  )
  state = state._replace(inner_state=inner_state, ledger=ledger)
  local_updates, inner_state = parts.inner.update(grads, state.inner_state, params, **extra_args)
  state = state._replace(count=count, inner_state=inner_state)
  if parts.overlap == "round":
    return overlap_lib.round_step(parts, grads, state, params, local_updates, count)
  return overlap_lib.window_step(parts, grads, state, params, local_updates, count, phase)
