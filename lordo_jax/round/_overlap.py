"""A whole round in flight (``overlap="round"``, MATH.md §9): the step of
:func:`lordo_jax.synchronize` that sends one chunk of the last round's message at every
step, outside any conditional, and lands it at the next boundary (``"eager"`` or
``"delayed"``). The chunk depends only on state carried in, so XLA may run it under
the step's compute; nothing at a boundary communicates.
"""

from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from lordo_jax.comm import _chunks as chunks_lib
from lordo_jax.round import _moment_trees as moment_trees
from lordo_jax.round import _outer_step as outer_lib

MERGES = ("eager", "delayed")  # overlap="round"
WINDOW_MERGES = ("rebase", "streaming")  # overlap=tau < K


class InFlight(NamedTuple):
  """The round's message in flight, each a ``K x size`` float32 buffer (one row a chunk)."""

  message: jax.Array  # This worker's frozen message: D_m, then the moments U_m, V_m.
  means: jax.Array  # The workers' means of the chunks sent so far.


def _message(parts, delta, inner_state) -> tuple:
  """What a boundary freezes: the pseudo-gradient and the moments averaged every sync."""
  fields = [f for _, group in parts.moment_groups for f in group]
  return (delta, *(moment_trees.moment_tree(inner_state, f) for f in fields))


def chunks(parts) -> int:
  """Chunks of a message: K for a whole round in flight, else tau."""
  return parts.sync_every if parts.overlap == "round" else parts.overlap


def init(parts, params, inner_state) -> InFlight:
  """Nothing in flight before the first boundary: zeros (a mean of zero lands there)."""
  like = _message(parts, params, inner_state)
  zeros = jnp.zeros_like(chunks_lib.freeze(like, chunks(parts)))
  return InFlight(message=zeros, means=zeros)


def send_chunk(parts, state, count):
  """This step's chunk, ``(count - 1) mod K``, averaged and counted: ``(in_flight, ledger)``."""
  index = (count - 1) % parts.sync_every
  flight = state.in_flight
  mean, ledger, _ = chunks_lib.chunk_mean(flight.message, index, state.ledger, parts.axis_name)
  means = jax.lax.dynamic_update_index_in_dim(flight.means, mean, index, 0)
  return flight._replace(means=means), ledger


def land(parts, state, params, local_updates, grads):
  r"""At a boundary: the message in flight lands and this round's is frozen.

  With :math:`\bar D, \bar U, \bar V` the means that landed and :math:`D_m, U_m, V_m`
  this worker's part of them, and :math:`D'_m = \text{anchor} - \theta_m` the fresh
  pseudo-gradient:

  .. math::
    \tilde D_m = \bar D + (D'_m - D_m) / M \ \text{(eager)}, \quad \bar D \
      \text{(delayed)}; \qquad
    \text{anchor} \leftarrow \text{anchor} + \text{outer}(\tilde D_m), \quad
    \theta_m = \text{anchor}

  and the moments :math:`u \mathrel{+}= \beta_1^K (\bar U - U_m)`,
  :math:`v \mathrel{+}= \beta_2^K (\bar V - V_m)`; the bases are computed from
  :math:`\bar D` (kept at the first boundary, when nothing has landed).
  """
  landed = (state.syncs[0] > 0).astype(jnp.float32)
  local_params = optax.apply_updates(params, local_updates)
  delta = jax.tree.map(lambda a, p: (a - p).astype(jnp.float32), state.anchor, local_params)
  fresh = _message(parts, delta, state.inner_state)
  old, mean = (chunks_lib.thaw(b, fresh) for b in state.in_flight)
  direction = mean[0]
  if parts.merge == "eager":
    workers = 1 if parts.axis_name is None else jax.lax.axis_size(parts.axis_name)
    direction = jax.tree.map(lambda b, d, o: b + (d - o) / workers, mean[0], delta, old[0])
  anchor, outer_state = outer_lib.outer_step(
    parts.outer, None, state.anchor, direction, state.outer_state[0], jnp.float32(1)
  )
  inner_state = _corrected_moments(
    parts, state.inner_state, old[1:], mean[1:], landed, parts.sync_every
  )
  inner_state = parts.refresh.at_sync(inner_state, mean[0], grads, None, landed)
  return state._replace(
    inner_state=inner_state,
    anchor=anchor,
    outer_state=(outer_state,),
    syncs=state.syncs + 1,
    in_flight=InFlight(chunks_lib.freeze(fresh, chunks(parts)), state.in_flight.means),
  )


def freeze(parts, state, params, local_updates):
  """At a boundary with ``overlap=tau``: this worker's message frozen, nothing sent."""
  local_params = optax.apply_updates(params, local_updates)
  delta = jax.tree.map(lambda a, p: (a - p).astype(jnp.float32), state.anchor, local_params)
  message = chunks_lib.freeze(_message(parts, delta, state.inner_state), chunks(parts))
  return state._replace(in_flight=state.in_flight._replace(message=message))


def land_window(parts, state, params, local_updates, grads):
  r"""At :math:`t_0 + \tau` with ``overlap=tau``: the message frozen at :math:`t_0` lands.

  .. math::
    \tilde\theta = \text{anchor} + \text{outer}(\bar D), \qquad
    \theta_m \leftarrow \tilde\theta + (\theta_m - (\text{anchor}_\text{old} - D_m))
    \ \text{(rebase)}, \quad
    \alpha \theta_m + (1 - \alpha) \tilde\theta \ \text{(streaming)}

  with the moments corrected by :math:`\beta^\tau` and the bases computed from
  :math:`\bar D`. Returns the state and this worker's new parameters.
  """
  local_params = optax.apply_updates(params, local_updates)
  like = _message(parts, jax.tree.map(lambda p: p.astype(jnp.float32), params), state.inner_state)
  old, mean = (chunks_lib.thaw(b, like) for b in state.in_flight)
  anchor, outer_state = outer_lib.outer_step(
    parts.outer, None, state.anchor, mean[0], state.outer_state[0], jnp.float32(1)
  )
  if parts.merge == "rebase":
    merged = jax.tree.map(
      lambda new, x, a, d: new + (x - (a - d)).astype(new.dtype),
      anchor,
      local_params,
      state.anchor,
      old[0],
    )
  else:
    alpha = parts.merge_alpha
    merged = jax.tree.map(lambda new, x: alpha * x + (1 - alpha) * new, anchor, local_params)
  inner_state = _corrected_moments(
    parts, state.inner_state, old[1:], mean[1:], jnp.float32(1), parts.overlap
  )
  inner_state = parts.refresh.at_sync(inner_state, mean[0], grads, None, jnp.float32(1))
  state = state._replace(
    inner_state=inner_state, anchor=anchor, outer_state=(outer_state,), syncs=state.syncs + 1
  )
  return state, merged


def _corrected_moments(parts, inner_state, own: tuple, means: tuple, landed, steps) -> Any:
  """Each averaged moment as if the mean had replaced this worker's at the boundary it
  was frozen: :math:`x \\mathrel{+}= \\beta^K (\\bar X - X_m)` (an EMA is linear in its
  start); ``steps`` is how long it was in flight."""
  fields = [f for _, group in parts.moment_groups for f in group]
  decays = dict(zip(("mu", "nu"), parts.moment_decays, strict=True))
  for field, mine, mean in zip(fields, own, means, strict=True):
    factor = landed * decays[field] ** steps
    current = moment_trees.moment_tree(inner_state, field)
    corrected = jax.tree.map(lambda x, b, m, f=factor: x + f * (b - m), current, mean, mine)
    inner_state = moment_trees.with_moments(inner_state, field, corrected)
  return inner_state
