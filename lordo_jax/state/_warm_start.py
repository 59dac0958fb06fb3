r"""Warm start: :func:`warm_start_state`, a fresh state with another run's inner optimizer state.

The LoRDO authors start LoRDO from a low-rank DDP checkpoint a third of the way into
the run, optimizer state included (``docs/FIDELITY.md``, point 1); the function's
docstring has the table of what is taken and what is kept.
"""

import dataclasses
from typing import Any

import jax
import numpy as np
import optax

from lordo_jax import _checks as checks
from lordo_jax.local import _low_rank_adam as low_rank_lib

# What becomes of the moments at the switch: copied, or zeros (the authors' switch,
# ``HP_SWITCH_RESET_MOMENTA="exp_avg,exp_avg_sq"``, docs/FIDELITY.md point 10).
MOMENTS = ("keep", "reset")
INNER_STATES = (optax.ScaleByAdamState, optax.ScaleByScheduleState, low_rank_lib.LowRankAdamState)
_WHO = "warm_start_state"


def is_matrix_state(node: Any) -> bool:
  """Whether ``node`` is one low-rank matrix's state (basis Q, moments u, v, error E)."""
  return isinstance(node, low_rank_lib.LowRankMoments)


def is_inner_state(node: Any) -> bool:
  """Whether ``node`` is an inner optimizer state a warm start takes over (``INNER_STATES``)."""
  return isinstance(node, INNER_STATES)


def inner_states(tree: Any) -> list:
  """Every inner optimizer state in ``tree`` (:func:`is_inner_state`), in tree order."""
  return [x for x in jax.tree.leaves(tree, is_leaf=is_inner_state) if is_inner_state(x)]


def _shapes(tree: Any) -> Any:
  return jax.tree.map(np.shape, tree)


def _moments(source: Any, target: Any, moments: str) -> dict:
  """``mu`` and ``nu``: the source's (``keep``) or the target's fresh zeros (``reset``)."""
  if _shapes((source.mu, source.nu)) != _shapes((target.mu, target.nu)):
    raise ValueError(
      f"{_WHO}: the source's moments are not shaped as the target's; warm-start from "
      "a state of the same model, rank and projection side."
    )
  chosen = source if moments == "keep" else target
  return {"mu": chosen.mu, "nu": chosen.nu}


def _matrix(source: Any, target: Any, moments: str) -> Any:
  """One matrix's state: the source's basis, error buffer (if both have one) and moments."""
  if _shapes(source.basis) != _shapes(target.basis):
    raise ValueError(
      f"{_WHO}: the source's basis is shaped {_shapes(source.basis)}, the target's "
      f"{_shapes(target.basis)}; warm-start from a state of the same rank and projection "
      "side."
    )
  error = source.error if np.shape(source.error) == np.shape(target.error) else target.error
  return target._replace(basis=source.basis, error=error, **_moments(source, target, moments))


def _take(source: Any, target: Any, moments: str) -> Any:
  """``target`` (an inner optimizer state) with the source's counter, bases and moments."""
  taken = {"count": source.count}
  if isinstance(target, low_rank_lib.LowRankAdamState):
    old, new = source.moments, target.moments
    if not old.layout.same_matrices(new.layout):
      raise ValueError(
        f"{_WHO}: the source's low-rank matrices are not the target's; warm-start from "
        "a state of the same model, rank and low-rank leaves."
      )
    groups = zip(old.groups, new.groups, strict=True)  # Per shape group, stacked alike.
    taken["moments"] = dataclasses.replace(
      new, groups=tuple(_matrix(s, t, moments) for s, t in groups)
    )
  elif isinstance(target, optax.ScaleByAdamState):
    taken |= _moments(source, target, moments)
  return target._replace(**taken)


def warm_start_state(source_state: Any, target_state: Any, *, moments: str = "keep") -> Any:
  """``target_state`` with every inner optimizer state taken from ``source_state``.

  The LoRDO authors start LoRDO from the checkpoint of a low-rank DDP run at a third of
  the run, its optimizer state included, so that every worker begins LoRDO in the
  subspace, with the moments and error buffers, of the shared low-rank DDP phase
  (``docs/FIDELITY.md``, point 1). :func:`warm_start_state` builds that state: the new
  method's ``tx.init(theta_S)`` (``theta_S`` the parameters at the switch), with every
  *inner optimizer state* taken from the source's. The inner optimizer states are the
  nodes of these types, found in tree order; the source's and the target's must list
  the same types in the same order (both follow the parameter tree and the
  ``optax.partition`` of the low-rank methods' local step):

  ===========================================  =========================================
  source (low-rank DDP: the chain after the    target (LoRDO: the same chain, in
  gradient average)                            ``SynchronizeState.inner_state``)
  ===========================================  =========================================
  ``LowRankMoments.basis`` Q, per matrix       the same matrix's ``basis`` (exactly)
  ``LowRankMoments.mu, nu`` (u, v; r-sized)    ``mu, nu`` (``moments="keep"``) or zeros
                                               (``"reset"``: the authors' switch)
  ``LowRankMoments.error`` E (p x q)           ``error``, when both have error feedback;
                                               else the target's (zeros, or ``()``)
  ``LowRankAdamState.count``                   ``count`` (the bias correction continues)
  ``ScaleByAdamState.count, mu, nu`` (the      ``count``; ``mu, nu`` as the low-rank
  full-rank leaves' Adam, or QHAdam)           moments (kept, or zeros with "reset")
  ``ScaleByScheduleState.count``               ``count``: a learning-rate schedule goes
                                               on at step S + 1
  ===========================================  =========================================

  Everything else is the target's: LoRDO's anchor (the parameters it was initialised
  with), its step and round counters (its first sync is K steps after the switch), its
  outer optimizer state, its ledger (zero: the source phase's bytes are the source's),
  its fault counts and ``LowRankAdamState.refresh_failures``. Build the target with
  ``init_projection="random"``, so that it does not recompute its bases from its first
  gradient: its random bases are replaced by the source's here.

  With ``moments="keep"``, a warm start into the source's own method continues the
  source run exactly.

  Args:
    source_state: the source run's optimizer state at the switch (for instance a
      :func:`~lordo_jax.low_rank_ddp` state restored from its checkpoint).
    target_state: the new method's fresh state, ``tx.init`` of the parameters at the
      switch (for instance a :func:`lordo(..., init_projection="random")
      <lordo_jax.lordo>` state).
    moments: ``"keep"`` copies the moments; ``"reset"`` leaves the target's zeros
      (the step counters continue either way).

  Returns:
    ``target_state`` with each inner optimizer state's counter, and each low-rank
    matrix's basis and error buffer, from ``source_state``; the moments as
    ``moments`` says; every other leaf (anchor, ledger, round counters) the target's.

  Raises:
    ValueError: the two states do not hold the same inner optimizer states, or hold a
      basis or moment of another shape (another model, rank or side).

  Examples:
    >>> import jax.numpy as jnp, lordo_jax
    >>> params = {"w": jnp.ones((16, 8)), "b": jnp.zeros(8)}
    >>> ddp = lordo_jax.low_rank_ddp(1e-2, rank=2, refresh_every=4)
    >>> grads = {"w": jnp.arange(128.0).reshape(16, 8), "b": jnp.ones(8)}
    >>> _, source = ddp.update(grads, ddp.init(params), params)
    >>> lordo = lordo_jax.lordo(1e-2, rank=2, sync_every=4, init_projection="random")
    >>> state = lordo_jax.warm_start_state(source, lordo.init(params))
    >>> bool(jnp.all(lordo_jax.projections(state)["w"] == lordo_jax.projections(source)["w"]))
    True
  """
  checks.one_of(_WHO, "moments", moments, MOMENTS)
  old, new = inner_states(source_state), inner_states(target_state)
  kinds = lambda states: [type(s).__name__ for s in states]  # noqa: E731
  if kinds(old) != kinds(new):
    raise ValueError(
      f"{_WHO}: the source state holds {kinds(old)}, the target state {kinds(new)}; "
      "warm-start from a method with the same inner optimizer (low_rank_ddp for lordo)."
    )
  leaves, treedef = jax.tree.flatten(target_state, is_leaf=is_inner_state)
  taken = iter(old)
  leaves = [_take(next(taken), x, moments) if is_inner_state(x) else x for x in leaves]
  return jax.tree.unflatten(treedef, leaves)
