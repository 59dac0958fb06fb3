r"""Fault bookkeeping of :func:`lordo_jax.synchronize` with ``fault_tolerant=True``.

A worker whose gradient is not finite skips its local step (zero update, its
floating-point optimizer state unchanged, its step counters advanced) and is marked
failed for the round (``round_ok``). At a sync the averages leave out the workers that
are failed, absent or hold a non-finite pseudo-gradient, and :class:`FaultCounts`
counts them (:func:`count_sync`). Everything here is local arithmetic.
"""

from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp


class FaultCounts(NamedTuple):
  """Who was left out of the averages, with ``fault_tolerant=True``."""

  round_ok: jax.Array  # bool scalar, per worker: no non-finite gradient this round.
  excluded: jax.Array  # int32: worker exclusions summed over syncs (same on all).
  empty_syncs: jax.Array  # int32: syncs at which no worker was present.


def init_fault_counts() -> FaultCounts:
  """No fault yet: the round is ok, nobody excluded, no empty sync."""
  return FaultCounts(
    round_ok=jnp.ones([], jnp.bool_),
    excluded=jnp.zeros([], jnp.int32),
    empty_syncs=jnp.zeros([], jnp.int32),
  )


def all_finite(tree: Any) -> jax.Array:
  """A bool scalar: every element of every leaf of ``tree`` is finite."""
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def keep_values_on_skip(step_ok, stepped, before):
  """After a skipped step: the old floating-point state, but the new step counters.

  Counters (integer leaves) advance either way, so that bias corrections and
  schedules stay in lockstep with the other workers.
  """

  def pick(new, old):
    if jnp.issubdtype(new.dtype, jnp.floating):
      return jnp.where(step_ok, new, old)
    return new

  return jax.tree.map(pick, stepped, before)


def skip_non_finite_step(grads, updates, inner_state, before, counts: FaultCounts):
  r"""A local step that is skipped when ``grads`` is not finite.

  With :math:`g` finite the step is kept as it is; otherwise the update is 0, the
  state keeps its floating-point values (:func:`keep_values_on_skip`) and the worker
  is failed for the round, :math:`\text{round\_ok} \leftarrow \text{round\_ok} \wedge
  [g \text{ finite}]`.

  Args:
    grads: the step's gradient.
    updates: the local optimizer's updates for it.
    inner_state: the local optimizer's state after it.
    before: the local optimizer's state before it.
    counts: the fault counts before it.

  Returns:
    ``(updates, inner_state, counts)`` after the step or its skip.
  """
  step_ok = all_finite(grads)
  zeros = jax.tree.map(jnp.zeros_like, grads)
  updates = jax.tree.map(lambda u, z: jnp.where(step_ok, u, z), updates, zeros)
  inner_state = keep_values_on_skip(step_ok, inner_state, before)
  return updates, inner_state, counts._replace(round_ok=counts.round_ok & step_ok)


def keep_every_step(grads, updates, inner_state, before, counts: FaultCounts):
  """A local step kept whatever the gradient (no fault tolerance): the identity."""
  del grads, before
  return updates, inner_state, counts


def count_sync(counts: FaultCounts, fraction, axis_name: str | None) -> FaultCounts:
  r"""The counts after a sync at which the share ``fraction`` of workers was present.

  A new round starts (``round_ok`` true again, still per worker), and with
  :math:`\phi` the share of the M workers present,

  .. math::
    \text{excluded} \mathrel{+}= \operatorname{round}((1 - \phi) M), \qquad
    \text{empty\_syncs} \mathrel{+}= [\phi = 0].
  """
  workers = 1 if axis_name is None else jax.lax.axis_size(axis_name)
  absent = jnp.round((1 - fraction) * workers).astype(jnp.int32)
  return FaultCounts(
    round_ok=counts.round_ok | True,  # a new round; stays per-worker (varying)
    excluded=counts.excluded + absent,
    empty_syncs=counts.empty_syncs + (~(fraction > 0)).astype(jnp.int32),
  )
