r"""Steps compiled for their place in the round: ``update(..., round_phase=...)``.

Without a phase every step is one program holding the round in a ``lax.cond``; on a GPU
that costs every local step copies of the state, a predicate read back by the host and
a step cut into several command buffers. :func:`round_phase` says on the host which
updates are local, so those compile to the local optimizer's step alone, and which end
a round, so those compile to the local step and the round with no conditional (a wrong
phase turns the updates NaN, never skips or adds a round).
"""

import numbers
from typing import Any

import jax
import jax.numpy as jnp

from lordo_jax import _checks as checks
from lordo_jax.round import _periods as periods

PHASES = ("first", "local", "boundary")


def round_phase(step: int, *, sync_every: periods.SyncPeriod, fragments: int = 1) -> str:
  """The phase of update number ``step`` of a method with rounds: pass it as
  ``update(..., round_phase=...)``, a static value.

  ``"first"`` for the first update (the first bases and the local step; where a round
  can end at it, K = 1, the one program, every part of the round in a conditional); ``"local"``
  when the update is a local step only: no fragment's round ends at it; ``"boundary"``
  when a fragment's round ends at it. Compiled with ``"local"``, a step holds no
  conditional of the round (on a GPU: no copies of the state, no predicate read back by
  the host, one command buffer); with ``"boundary"`` and one fragment, the round runs
  with no conditional either (with fragments, each fragment's round is in a conditional:
  the program does not know which one ends). A training step jitted with the phase
  static compiles three programs, each once, with the same numbers as one. A program run
  at an update of another phase turns its updates NaN (it never skips or adds a round).

  Args:
    step: the number of updates before this one (the optimizer's step count, 0 first),
      a Python int computed on the host.
    sync_every: K, the optimizer's ``sync_every`` (an int or a period function).
    fragments: the optimizer's ``fragments``, an int (1: no streaming).

  Returns:
    ``"first"``, ``"local"`` or ``"boundary"``.

  Examples:
    >>> import lordo_jax
    >>> [lordo_jax.round_phase(s, sync_every=4) for s in range(9)]
    ['first', 'local', 'local', 'boundary', 'local', 'local', 'local', 'boundary', 'local']
  """
  if isinstance(step, jax.core.Tracer) or not isinstance(step, numbers.Integral) or step < 0:
    raise TypeError(
      f"round_phase: step={step!r} must be a non-negative Python int, the count of "
      "updates so far kept on the host (a training loop's counter), not a traced value."
    )
  if not isinstance(fragments, numbers.Integral) or fragments < 1:
    raise ValueError(
      f"round_phase: fragments={fragments!r} must be the optimizer's int fragments (1 "
      "without streaming); with a function of the params give no phase."
    )
  t = int(step) + 1
  if t == 1:
    return "first"
  return "boundary" if ends_a_round(t, sync_every, int(fragments)) else "local"


def ends_a_round(t: int, sync_every: periods.SyncPeriod, fragments: int) -> bool:
  """Whether a fragment's round ends at update ``t`` (1-based), on the host."""
  if callable(sync_every):
    return t in periods.sync_steps(sync_every, t)
  return t % sync_every in periods.fragment_offsets(sync_every, fragments)


def check(name: str, overlap: Any, phase: Any) -> None:
  """``update(..., round_phase=phase)``, checked against the optimizer's options."""
  if phase is None:
    return
  maker = "lordo_jax.round_phase(step, sync_every=...)"
  checks.static_phase(name, "round_phase", phase, PHASES, maker)
  if overlap:
    raise ValueError(
      f"{name}: round_phase was given to an optimizer built with overlap={overlap!r}, "
      "whose steps are placed by overlap_phase; pass overlap_phase instead."
    )


def poisoned(updates, due):
  """``updates``, NaN wherever a program runs an update of another phase (``due``, a
  traced bool): a select fused into each leaf's update, with no conditional
  and no host callback (either costs a local step on the host what the phase saves)."""
  return jax.tree.map(lambda u: jnp.where(due, jnp.asarray(jnp.nan, u.dtype), u), updates)


def first_due(count) -> jax.Array:
  """Whether update ``count`` is the first: a first program with no round in it (none
  ends at the first update) runs no other."""
  return count == 1


def any_due(count, predicates) -> jax.Array:
  """Whether update ``count`` needs another program than the local one: it is the
  first update, or a fragment's round ends at it (``predicates``)."""
  return jnp.any(jnp.stack(predicates)) | (count == 1)


def boundary_due(count, predicates) -> jax.Array:
  """Whether update ``count`` is a boundary: a fragment's round ends at it, and it is
  not the first update."""
  return jnp.any(jnp.stack(predicates)) & (count != 1)
