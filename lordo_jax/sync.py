r"""Infrequent synchronisation: the K-step round of SPEC section 4.

:func:`synchronize` wraps a local optimizer. Every step it applies the local
optimizer; at the end of every step with :math:`t \bmod K = 0` it also

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

All collectives go through :func:`lordo_jax.collectives.counted_pmean`, inside
``lax.cond`` branches, so nothing is sent or computed for the round on other steps.
"""

from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from lordo_jax import collectives
from lordo_jax import low_rank as low_rank_lib

PROJECTION_SOURCES = ("pseudo_gradient", "local_gradient")


class SynchronizeState(NamedTuple):
  """State of :func:`synchronize`."""

  count: jax.Array  # int32 scalar: steps taken.
  inner_state: Any  # The local optimizer's state.
  anchor: Any  # Params at the last sync, the same on every worker (host-offloadable).
  outer_state: Any  # The outer optimizer's state.
  ledger: collectives.Ledger  # What this wrapper has all-reduced since init.
  faults: "FaultCounts"  # Workers left out of syncs (fault_tolerant=True).


class FaultCounts(NamedTuple):
  """Who was left out of the averages, with ``fault_tolerant=True``."""

  round_ok: jax.Array  # bool scalar, per worker: no non-finite gradient this round.
  excluded: jax.Array  # int32: worker exclusions summed over syncs (same on all).
  empty_syncs: jax.Array  # int32: syncs at which no worker was present.


def _is_moment_node(x) -> bool:
  return isinstance(x, (low_rank_lib.LowRankAdamState, optax.ScaleByAdamState))


def _moment_tree(inner_state: Any, field: str) -> Any:
  """The ``field`` ("mu" or "nu") moments of every Adam-like node, None elsewhere."""

  def pick(node):
    if isinstance(node, optax.ScaleByAdamState):
      return getattr(node, field)
    if isinstance(node, low_rank_lib.LowRankAdamState):
      return low_rank_lib.map_matrices(lambda m: getattr(m, field), node.moments)
    return None

  return jax.tree.map(pick, inner_state, is_leaf=_is_moment_node)


def _with_moments(inner_state: Any, field: str, moments: Any) -> Any:
  """``inner_state`` with the ``field`` moments replaced by ``moments``."""

  def put(node, new):
    if isinstance(node, optax.ScaleByAdamState):
      return node._replace(**{field: new})
    if isinstance(node, low_rank_lib.LowRankAdamState):
      merged = low_rank_lib.map_matrices(lambda m, x: m._replace(**{field: x}), node.moments, new)
      return node._replace(moments=merged)
    return node

  return jax.tree.map(put, inner_state, moments, is_leaf=_is_moment_node)


def average_moments(inner_state, ledger, fields: tuple[str, ...], axis_name):
  """``pmean`` of the ``fields`` moments of every Adam-like node, in one message."""
  moments = {f: _moment_tree(inner_state, f) for f in fields}
  moments, ledger = collectives.counted_pmean(moments, ledger, axis_name)
  for f in fields:
    inner_state = _with_moments(inner_state, f, moments[f])
  return inner_state, ledger


def refresh_projections(inner_state, low_rank, source, *, first=False):
  """``low_rank.refresh`` on every low-rank Adam node of ``inner_state``."""

  def one(node):
    if isinstance(node, low_rank_lib.LowRankAdamState):
      return low_rank.refresh(node, source, first=first)
    return node

  is_node = lambda x: isinstance(x, low_rank_lib.LowRankAdamState)  # noqa: E731
  return jax.tree.map(one, inner_state, is_leaf=is_node)


def low_rank_leaves(inner_state, tree):
  """``tree`` with every leaf that is not a low-rank matrix replaced by MaskedNode."""
  masks = [
    node.moments
    for node in jax.tree.leaves(
      inner_state, is_leaf=lambda x: isinstance(x, low_rank_lib.LowRankAdamState)
    )
    if isinstance(node, low_rank_lib.LowRankAdamState)
  ]
  if not masks:
    return None
  if len(masks) > 1:
    raise ValueError(
      "synchronize found more than one scale_by_low_rank_adam state in the local "
      "optimizer; use one low-rank transformation (route leaves with "
      "optax.partition)."
    )
  return low_rank_lib.map_matrices(lambda m, x: x, masks[0], tree)


def synchronize(
  inner: optax.GradientTransformation,
  *,
  sync_every: int,
  axis_name: str | None = None,
  outer_optimizer: optax.GradientTransformation | None = None,
  first_moment_every: int | None = 1,
  second_moment_every: int | None = 1,
  low_rank: low_rank_lib.LowRankAdam | None = None,
  init_projection: str | None = "gradient",
  projection_source: str = "pseudo_gradient",
  fault_tolerant: bool = False,
  name: str = "synchronize",
) -> optax.GradientTransformationExtraArgs:
  r"""Local steps with ``inner``, a synchronisation every ``sync_every`` steps.

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
      :class:`~lordo_jax.low_rank.LowRankAdamState`) are what gets averaged.
    sync_every: K, steps per round.
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
    (arXiv 2505.22549); Jovanović et al., LoRDO, 2026 (arXiv 2602.04396).
  """
  outer = optax.sgd(1.0) if outer_optimizer is None else outer_optimizer
  inner = optax.with_extra_args_support(inner)

  def init_fn(params):
    return SynchronizeState(
      count=jnp.zeros([], jnp.int32),
      inner_state=inner.init(params),
      anchor=params,
      outer_state=outer.init(params),
      ledger=collectives.init_ledger(),
      faults=FaultCounts(
        round_ok=jnp.ones([], jnp.bool_),
        excluded=jnp.zeros([], jnp.int32),
        empty_syncs=jnp.zeros([], jnp.int32),
      ),
    )

  def mean(tree, present, ledger):
    """(mean over the present workers, share present, ledger)."""
    if fault_tolerant:
      return collectives.counted_mean_of_present(tree, present, ledger, axis_name)
    tree, ledger = collectives.counted_pmean(tree, ledger, axis_name)
    return tree, jnp.ones([], jnp.float32), ledger

  def initial_projection(grads, state, present):
    source = low_rank_leaves(state.inner_state, grads)
    ledger = state.ledger
    if projection_source == "pseudo_gradient":
      source, _, ledger = mean(source, present, ledger)
    inner_state = refresh_projections(state.inner_state, low_rank, source, first=True)
    return state._replace(inner_state=inner_state, ledger=ledger)

  def moment_fields(sync_index):
    """The moments to average at this sync, as (predicate, fields) pairs."""
    periods = {"mu": first_moment_every, "nu": second_moment_every}
    groups: dict[int, list[str]] = {}
    for field, period in periods.items():
      if period is not None:
        groups.setdefault(period, []).append(field)
    return [(sync_index % period == 0, tuple(fields)) for period, fields in groups.items()]

  def average(inner_state, ledger, fields, present):
    if not fault_tolerant:
      return average_moments(inner_state, ledger, fields, axis_name)
    moments = {f: _moment_tree(inner_state, f) for f in fields}
    averaged, fraction, ledger = mean(moments, present, ledger)
    for f in fields:
      kept = jax.tree.map(lambda a, own: jnp.where(fraction > 0, a, own), averaged[f], moments[f])
      inner_state = _with_moments(inner_state, f, kept)
    return inner_state, ledger

  def round_end(grads, params, local_updates, state, inner_state, present):
    local_params = optax.apply_updates(params, local_updates)
    delta = jax.tree.map(lambda a, x: a - x, state.anchor, local_params)
    if fault_tolerant:
      finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(delta)]))
      present = present & finite
    delta, fraction, ledger = mean(delta, present, state.ledger)
    anyone = fraction > 0
    outer_updates, outer_state = outer.update(delta, state.outer_state, state.anchor)
    synced = optax.apply_updates(state.anchor, outer_updates)

    sync_index = (state.count + 1) // sync_every
    for predicate, fields in moment_fields(sync_index):
      inner_state, ledger = jax.lax.cond(
        predicate,
        lambda s, led, f=fields: average(s, led, f, present),
        lambda s, led: (s, led),
        inner_state,
        ledger,
      )
    if low_rank is not None:
      source = delta if projection_source == "pseudo_gradient" else grads
      refreshed = refresh_projections(inner_state, low_rank, source)
      inner_state = _where(anyone, refreshed, inner_state)
    synced = _where(anyone, synced, state.anchor)
    outer_state = _where(anyone, outer_state, state.outer_state)
    updates = jax.tree.map(lambda s, p: (s - p).astype(p.dtype), synced, params)
    workers = 1 if axis_name is None else jax.lax.axis_size(axis_name)
    absent = jnp.round((1 - fraction) * workers).astype(jnp.int32)
    faults = FaultCounts(
      round_ok=state.faults.round_ok | True,  # a new round; stays per-worker (varying)
      excluded=state.faults.excluded + absent,
      empty_syncs=state.faults.empty_syncs + (~anyone).astype(jnp.int32),
    )
    return updates, inner_state, synced, outer_state, ledger, faults

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
    local_updates, inner_state = inner.update(grads, state.inner_state, params, **extra_args)
    faults = state.faults
    if fault_tolerant:
      local_updates = _where(finite_grads, local_updates, jax.tree.map(jnp.zeros_like, grads))
      inner_state = _keep_values_on_skip(finite_grads, inner_state, state.inner_state)
      faults = faults._replace(round_ok=faults.round_ok & finite_grads)
      present = present & faults.round_ok

    def keep(*_):
      return local_updates, inner_state, state.anchor, state.outer_state, state.ledger, faults

    updates, inner_state, anchor, outer_state, ledger, faults = jax.lax.cond(
      count % sync_every == 0,
      lambda: round_end(
        grads, params, local_updates, state._replace(faults=faults), inner_state, present
      ),
      keep,
    )
    return updates, SynchronizeState(count, inner_state, anchor, outer_state, ledger, faults)

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
