r"""A local step compiled without the round: ``update(..., round_phase="local")``.

Without a phase every step is one program holding the round in a ``lax.cond``; on a GPU
that costs every local step copies of the state, a predicate read back by the host and
a step cut into several command buffers. :func:`round_phase` says on the host which
updates are local, so those compile to the local optimizer's step alone (a wrong phase
turns the updates NaN, never skips a round).
"""

import numbers
from typing import Any

import jax
import jax.numpy as jnp

from lordo_jax import _checks as checks
from lordo_jax.round import _periods as periods

PHASES = ("local", "boundary")


def round_phase(step: int, *, sync_every: periods.SyncPeriod, fragments: int = 1) -> str:
  """The phase of update number ``step`` of a method with rounds: pass it as
  ``update(..., round_phase=...)``, a static value.

  ``"local"`` when that update is a local step only: not the first update, and no
  fragment's round ends at it; else ``"boundary"``. Compiled with ``"local"``, a step
  holds no conditional of the round (on a GPU: no copies of the state, no predicate
  read back by the host, one command buffer), so a training step jitted with the phase
  static compiles two programs, each once, with the same numbers as one. A ``"local"``
  program run where a round ends raises at run time (it never skips a round).

  Args:
    step: the number of updates before this one (the optimizer's step count, 0 first),
      a Python int computed on the host.
    sync_every: K, the optimizer's ``sync_every`` (an int or a period function).
    fragments: the optimizer's ``fragments``, an int (1: no streaming).

  Returns:
    ``"local"`` or ``"boundary"``.

  Examples:
    >>> import lordo_jax
    >>> [lordo_jax.round_phase(s, sync_every=4) for s in range(9)]
    ['boundary', 'local', 'local', 'boundary', 'local', 'local', 'local', 'boundary', 'local']
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
    return "boundary"
  if callable(sync_every):
    return "boundary" if t in periods.sync_steps(sync_every, t) else "local"
  offsets = periods.fragment_offsets(sync_every, int(fragments))
  return "boundary" if t % sync_every in offsets else "local"


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
  """``updates``, NaN wherever a ``"local"`` program runs an update that is not local
  (``due``, a traced bool): a select fused into each leaf's update, with no conditional
  and no host callback (either costs a local step on the host what the phase saves)."""
  return jax.tree.map(lambda u: jnp.where(due, jnp.asarray(jnp.nan, u.dtype), u), updates)


def any_due(count, predicates, first_step: bool) -> jax.Array:
  """Whether update ``count`` needs the round's program: a fragment syncs at it, or it
  is the first update and ``first_step`` (the first bases come from its gradient)."""
  due = jnp.any(jnp.stack(predicates))
  return due | (count == 1) if first_step else due
