r"""Infrequent synchronisation: the K-step round of SPEC section 4.

:func:`synchronize` wraps a local optimizer. Every step it applies the local
optimizer; at the end of every round (step :math:`t` with :math:`t \bmod K = 0` for
an int ``sync_every``) it also

1. forms the pseudo-gradient :math:`\Delta_m = \text{anchor} - \theta_m`, where
   :math:`\theta_m` is this worker's parameters after its local step;
2. averages it, :math:`\Delta = \mathrm{pmean}_m(\Delta_m)` (the one full-size
   message of the round);
3. takes the outer step :math:`\theta = \text{anchor} - \text{outer}(\Delta)` and sets
   the anchor to :math:`\theta` (default outer: plain averaging, so :math:`\theta` is
   the mean of the workers' parameters);
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
  (:func:`lordo_jax.collectives.counted_mean`); the pseudo-gradient with per-worker
  error feedback of what the rounding lost (:attr:`SynchronizeState.residual`), so
  nothing is lost over time; the moments without (each sync replaces them by their
  average, so there is nothing to feed a residual into), and in bfloat16 when the
  pseudo-gradient goes in int8 (:data:`lordo_jax.compression.MOMENT_CODECS`).
* ``fragments=F`` (streaming, as in Streaming DiLoCo): the parameters are cut into F
  fragments that sync at staggered steps of the round, fragment f at the steps
  :math:`t \equiv o_f \pmod K` (:func:`lordo_jax.schedules.fragment_offsets`). Each
  fragment has its own outer-optimizer state; its moments are averaged and its bases
  refreshed at its own syncs. Every leaf still syncs once per K steps, so the total
  sent is unchanged and the largest message is about 1/F of the model.
* ``sync_every`` a function of the step (:mod:`lordo_jax.schedules`), such as the
  Quadratic Synchronization Rule: rounds of varying length, with no recompilation.

All collectives go through :mod:`lordo_jax.collectives`, inside ``lax.cond``
branches, so nothing is sent or computed for the round on other steps.

Cost of a local step: the update is ``where(synced now, anchor - params, local
update)``, leaf by leaf, outside the round's ``lax.cond``, and the sync branch
recomputes the local step it needs for the pseudo-gradient instead of taking it as an
operand. A conditional's operands and results are materialised buffers, so carrying
the local update through it made every local step write the full-size update out and
read it back, and kept ``optax.apply_updates`` from fusing with the local step (on CPU
a third of a local step on a 768 x 3072 matrix, ``benchmarks/step_speed.py``). The
price is one more local step inside each sync step, and the inner optimizer must be
local (no collectives), as every chain in this library is.
"""

from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from lordo_jax import checks
from lordo_jax import collectives
from lordo_jax import compression as compression_lib
from lordo_jax import inner_state as trees
from lordo_jax import low_rank as low_rank_lib
from lordo_jax import precision
from lordo_jax import schedules

PROJECTION_SOURCES = ("pseudo_gradient", "local_gradient")


class SynchronizeState(NamedTuple):
  """State of :func:`synchronize`."""

  count: jax.Array  # int32 scalar: steps taken.
  inner_state: Any  # The local optimizer's state.
  anchor: Any  # Params at the last sync, the same on every worker (host-offloadable).
  outer_state: tuple  # The outer optimizer's state, one per fragment (host-offloadable).
  ledger: collectives.Ledger  # What this wrapper has all-reduced since init.
  faults: "FaultCounts"  # Workers left out of syncs (fault_tolerant=True).
  syncs: jax.Array  # int32[F]: syncs completed, per fragment.
  next_sync: jax.Array  # int32 scalar: the step that ends the current round.
  residual: Any  # float32 like params: compression error feedback; () without compression.


class FaultCounts(NamedTuple):
  """Who was left out of the averages, with ``fault_tolerant=True``."""

  round_ok: jax.Array  # bool scalar, per worker: no non-finite gradient this round.
  excluded: jax.Array  # int32: worker exclusions summed over syncs (same on all).
  empty_syncs: jax.Array  # int32: syncs at which no worker was present.


def _check_options(name, sync_every, fragments, compression, fault_tolerant):
  if not callable(sync_every):
    checks.positive_int(name, "sync_every", sync_every)
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


def synchronize(
  inner: optax.GradientTransformation,
  *,
  sync_every: schedules.SyncPeriod,
  axis_name: str | None = None,
  outer_optimizer: optax.GradientTransformation | None = None,
  first_moment_every: int | None = 1,
  second_moment_every: int | None = 1,
  low_rank: low_rank_lib.LowRankAdam | None = None,
  init_projection: str | None = "gradient",
  projection_source: str = "pseudo_gradient",
  fault_tolerant: bool = False,
  compression: str | None = None,
  fragments: Any = None,
  name: str = "synchronize",
) -> optax.GradientTransformationExtraArgs:
  r"""Local steps with ``inner``, a synchronisation at the end of every round.

  See the module docstring for the round. The update needs ``params``.

  With ``fault_tolerant=True`` a worker can drop out of a round without harming the
  others. A local step whose gradient is not finite is skipped (zero update, local
  state unchanged) and marks the worker failed for the round; the caller can also
  mark it absent with the extra argument ``update(..., worker_present=False)``. At
  the sync, the pseudo-gradient and the moments are averaged over the workers that
  are present (not failed, not marked absent, finite pseudo-gradient); every worker,
  absent ones included, then takes the synchronised parameters, moments and bases.
  If no worker is present the sync keeps the anchor, the outer state and the bases.
  :attr:`SynchronizeState.faults` counts both. The cost is one float32 scalar more
  per averaged message (the presence weight), which the ledger counts.

  Args:
    inner: the local optimizer (it produces the per-step update, learning rate
      included). Its Adam-like states (``optax.ScaleByAdamState`` and
      :class:`~lordo_jax.low_rank.LowRankAdamState`) are what gets averaged. It
      must not communicate: a sync step runs it twice (see the module docstring).
    sync_every: K, steps per round; or a function of the step giving each round's
      length (:mod:`lordo_jax.schedules`, e.g. :func:`lordo_jax.quadratic_sync_rule`).
    axis_name: the worker axis (``shard_map`` mesh axis or ``pmap`` axis name);
      ``None`` for a single worker, where every collective is the identity.
    outer_optimizer: the optax transformation applied to the averaged
      pseudo-gradient, with the anchor as params. ``None`` is plain averaging
      (``optax.sgd(1.0)``); DiLoCo uses ``optax.sgd(0.7, momentum=0.9,
      nesterov=True)``.
    first_moment_every: average the first moments every this many syncs (``None``:
      never).
    second_moment_every: the same for the second moments.
    low_rank: the :class:`~lordo_jax.low_rank.LowRankAdam` inside ``inner``, if
      any: its bases are refreshed at every sync.
    init_projection: ``"gradient"``: before step 1 the first gradient is averaged
      and the bases are computed from it; ``None``: ``low_rank`` sets its own first
      basis.
    projection_source: ``"pseudo_gradient"`` (the averaged :math:`\Delta`, shared by
      all workers) or ``"local_gradient"`` (each worker's own gradient of the sync
      step, no message; the bases then differ between workers, so moments should
      not be averaged).
    fault_tolerant: leave failed or absent workers out of the averages (see above).
    compression: ``None`` (messages in the dtype of what is sent), ``"bfloat16"`` or
      ``"int8"`` (per-row scales), with error feedback of the pseudo-gradient; with
      ``"int8"`` the moments go in bfloat16.
    fragments: F, the number of fragments synced at staggered steps (streaming),
      at most K; or a function of the params returning a tree of fragment indices
      (:func:`lordo_jax.schedules.fragment_labels`). ``None`` (default) or 1: no
      streaming. A Python value, fixed when the optimizer is built (inside
      ``optax.inject_hyperparams``, list it in ``static_args``).
    name: how errors name this transformation.

  Returns:
    An ``optax.GradientTransformationExtraArgs``; extra args other than
    ``worker_present`` go to ``inner``.

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
  fragments = 1 if fragments is None else fragments
  _check_options(name, sync_every, fragments, compression, fault_tolerant)
  # The outer optimizer's state (DiLoCo's momentum) is float32 whatever the params.
  outer = precision.in_float32(optax.sgd(1.0) if outer_optimizer is None else outer_optimizer)
  inner = optax.with_extra_args_support(inner)

  def fragment_masks(params) -> list:
    """One ``keep`` tree per fragment (``[None]``: no streaming)."""
    if not callable(fragments) and fragments == 1:
      return [None]
    labels = schedules.fragment_labels(params, fragments)
    treedef = jax.tree.structure(params)
    return [treedef.unflatten([lab == f for lab in labels]) for f in range(max(labels) + 1)]

  def outer_for(keep):
    return outer if keep is None else optax.masked(outer, keep)

  def init_fn(params):
    masks = fragment_masks(params)
    residual = ()
    if compression is not None:
      residual = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), params)
    return SynchronizeState(
      count=jnp.zeros([], jnp.int32),
      inner_state=inner.init(params),
      anchor=jax.tree.map(jnp.copy, params),  # Its own buffers, so a donated step can update it.
      outer_state=tuple(outer_for(keep).init(params) for keep in masks),
      ledger=collectives.init_ledger(),
      faults=FaultCounts(
        round_ok=jnp.ones([], jnp.bool_),
        excluded=jnp.zeros([], jnp.int32),
        empty_syncs=jnp.zeros([], jnp.int32),
      ),
      syncs=jnp.zeros([len(masks)], jnp.int32),
      next_sync=schedules.round_length(sync_every, 0),
      residual=residual,
    )

  def mean(tree, present, ledger, residual=None, codec=compression):
    """(mean over the present workers, share present, ledger, residual)."""
    if fault_tolerant:
      tree, fraction, ledger = collectives.counted_mean_of_present(tree, present, ledger, axis_name)
      return tree, fraction, ledger, residual
    tree, ledger, residual = collectives.counted_mean(
      tree,
      ledger,
      axis_name,
      compression_codec=codec,
      residual=residual,
    )
    return tree, jnp.ones([], jnp.float32), ledger, residual

  def initial_projection(grads, state, present):
    source = trees.low_rank_leaves(state.inner_state, grads)
    ledger = state.ledger
    if projection_source == "pseudo_gradient":
      source, _, ledger, _ = mean(source, present, ledger)
    inner_state = trees.refresh_projections(state.inner_state, low_rank, source, first=True)
    return state._replace(inner_state=inner_state, ledger=ledger)

  def moment_fields(sync_index):
    """The moments to average at this sync, as (predicate, fields) pairs."""
    periods = {"mu": first_moment_every, "nu": second_moment_every}
    groups: dict[int, list[str]] = {}
    for field, period in periods.items():
      if period is not None:
        groups.setdefault(period, []).append(field)
    return [(sync_index % period == 0, tuple(fields)) for period, fields in groups.items()]

  def average(inner_state, ledger, fields, present, keep):
    """The ``fields`` moments of the parameters in ``keep``, averaged."""
    moments = {f: trees.moment_tree(inner_state, f, keep) for f in fields}
    codec = None if compression is None else compression_lib.MOMENT_CODECS[compression]
    averaged, fraction, ledger, _ = mean(moments, present, ledger, codec=codec)
    for f in fields:
      kept = jax.tree.map(lambda a, own: jnp.where(fraction > 0, a, own), averaged[f], moments[f])
      inner_state = trees.with_moments(inner_state, f, kept)
    return inner_state, ledger

  def fragment_sync(f, keep, carry, grads, params, local_updates, present):
    """The round's end for the parameters in ``keep`` (fragment ``f``): the new carry,
    whose anchor holds the synchronised parameters of the leaves in ``keep``."""
    inner_state, anchor, outer_states, ledger, faults, syncs, residual = carry
    local_params = optax.apply_updates(params, local_updates)
    delta = trees.select(jax.tree.map(lambda a, x: a - x, anchor, local_params), keep)
    if fault_tolerant:
      finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(delta)]))
      present = present & finite
    own_residual = None if compression is None else trees.select(residual, keep)
    delta, fraction, ledger, own_residual = mean(delta, present, ledger, own_residual)
    if compression is not None:
      residual = trees.merge(residual, own_residual)
    anyone = fraction > 0
    full_delta = trees.merge(jax.tree.map(jnp.zeros_like, anchor), delta)
    outer_updates, outer_state = outer_for(keep).update(full_delta, outer_states[f], anchor)
    synced = trees.merge(anchor, trees.select(optax.apply_updates(anchor, outer_updates), keep))

    sync_index = syncs[f] + 1
    for predicate, fields in moment_fields(sync_index):
      inner_state, ledger = jax.lax.cond(
        predicate,
        lambda s, led, fs=fields: average(s, led, fs, present, keep),
        lambda s, led: (s, led),
        inner_state,
        ledger,
      )
    if low_rank is not None:
      source = delta if projection_source == "pseudo_gradient" else trees.select(grads, keep)
      source = trees.low_rank_leaves(inner_state, source)
      refreshed = trees.refresh_projections(inner_state, low_rank, source, keep=keep)
      inner_state = _where(anyone, refreshed, inner_state)
    synced = _where(anyone, synced, anchor)
    outer_state = _where(anyone, outer_state, outer_states[f])
    outer_states = (*outer_states[:f], outer_state, *outer_states[f + 1 :])
    workers = 1 if axis_name is None else jax.lax.axis_size(axis_name)
    absent = jnp.round((1 - fraction) * workers).astype(jnp.int32)
    faults = FaultCounts(
      round_ok=faults.round_ok | True,  # a new round; stays per-worker (varying)
      excluded=faults.excluded + absent,
      empty_syncs=faults.empty_syncs + (~anyone).astype(jnp.int32),
    )
    syncs = syncs.at[f].add(1)
    return inner_state, synced, outer_states, ledger, faults, syncs, residual

  def update_fn(grads, state, params=None, *, worker_present=True, **extra_args):
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
    count = optax.safe_int32_increment(state.count)
    present = jnp.asarray(worker_present, jnp.bool_)
    finite_grads = jnp.ones([], jnp.bool_)
    if fault_tolerant:
      leaves = jax.tree.leaves(grads)
      finite_grads = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))
    if low_rank is not None and init_projection == "gradient":
      state = jax.lax.cond(
        count == 1,
        lambda s: initial_projection(grads, s, present & finite_grads),
        lambda s: s,
        state,
      )

    def local_step():
      """(local updates, inner state, faults) of this step's local optimizer step."""
      local_updates, inner_state = inner.update(grads, state.inner_state, params, **extra_args)
      if not fault_tolerant:
        return local_updates, inner_state, state.faults
      local_updates = _where(finite_grads, local_updates, jax.tree.map(jnp.zeros_like, grads))
      inner_state = _keep_values_on_skip(finite_grads, inner_state, state.inner_state)
      return (
        local_updates,
        inner_state,
        state.faults._replace(round_ok=state.faults.round_ok & finite_grads),
      )

    local_updates, inner_state, faults = local_step()
    if fault_tolerant:
      present = present & faults.round_ok

    masks = fragment_masks(params)
    if callable(sync_every):
      predicates = [count == state.next_sync]
    else:
      offsets = schedules.fragment_offsets(sync_every, len(masks))
      predicates = [count % sync_every == offset for offset in offsets]
    carry = (
      inner_state,
      state.anchor,
      state.outer_state,
      state.ledger,
      faults,
      state.syncs,
      state.residual,
    )
    for f, (keep, predicate) in enumerate(zip(masks, predicates, strict=True)):
      carry = jax.lax.cond(
        predicate,
        # The branch recomputes the local updates: see "Cost of a local step" above.
        lambda c, f=f, keep=keep: fragment_sync(
          f, keep, c, grads, params, local_step()[0], present
        ),
        lambda c: c,
        carry,
      )
    inner_state, anchor, outer_state, ledger, faults, syncs, residual = carry
    if masks[0] is None:
      leaf_syncs = jax.tree.map(lambda _: predicates[0], params)
    else:
      leaf_syncs = jax.tree.map(lambda *keeps: predicates[keeps.index(True)], *masks)
    updates = jax.tree.map(
      lambda synced_now, a, p, u: jnp.where(synced_now, (a - p).astype(u.dtype), u),
      leaf_syncs,
      anchor,
      params,
      local_updates,
    )
    ends_round = predicates[-1]
    next_sync = jnp.where(
      ends_round, count + schedules.round_length(sync_every, count), state.next_sync
    )
    new_state = SynchronizeState(
      count, inner_state, anchor, outer_state, ledger, faults, syncs, next_sync, residual
    )
    return updates, new_state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _where(condition, on_true, on_false):
  """Leafwise ``jnp.where`` of two trees of the same structure."""
  return jax.tree.map(lambda a, b: jnp.where(condition, a, b), on_true, on_false)


def _keep_values_on_skip(step_ok, stepped, before):
  """After a skipped step: the old floating-point state, but the new step counters.

  Counters (integer leaves) advance either way, so that bias corrections and
  schedules stay in lockstep with the other workers.
  """

  def pick(new, old):
    if jnp.issubdtype(new.dtype, jnp.floating):
      return jnp.where(step_ok, new, old)
    return new

  return jax.tree.map(pick, stepped, before)
