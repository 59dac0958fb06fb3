r"""When to synchronise: a fixed period, a schedule of the step, or the learning rate.

``sync_every`` (a :data:`SyncPeriod`: an int or a function of the step) gives each
round's length (:func:`round_length`). :func:`quadratic_sync_rule` (Gu et al., ICLR
2024) lengthens rounds as the rate decays; :func:`sync_steps` lists a period's sync
steps on the host; :func:`fragment_offsets` and :func:`fragment_labels` stagger and split
the parameters' fragments for streaming.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lordo_jax import _checks as checks

SyncPeriod = int | Callable
LONGEST_FIRST_ROUND = 2**20  # Steps: a first round this long is taken for "never syncs".
LONG_FIRST_ROUND = 100  # quadratic_sync_rule warns at a first round this many base periods long.


def round_length(sync_every: SyncPeriod, step) -> jnp.ndarray:
  r"""The length (int32, at least 1) of the round whose first update is ``step``.

  ``sync_every`` of :func:`lordo_jax.synchronize` (and of every alias built on it) is

  * an int K: a sync at the end of steps K, 2K, 3K, ...;
  * a function ``period(step) -> int``, called with the optax step count of a
    round's first update (0 for the first round, as learning-rate schedules are):
    the round lasts ``period(step)`` steps. Rounds are laid end to end: a round that
    starts after ``s`` updates ends with a sync at step :math:`s + H(s)` (1-based), and
    the next starts there. ``period`` is traced (it must be written with ``jnp``), so a
    changing period never recompiles the step.

  :func:`quadratic_sync_rule` (Gu et al., ICLR 2024) lengthens rounds as the rate
  decays; :func:`sync_steps` lists a period's sync steps on the host.
  """
  if isinstance(sync_every, int):
    return jnp.asarray(sync_every, jnp.int32)
  length = jnp.asarray(sync_every(jnp.asarray(step, jnp.int32)))
  return jnp.maximum(jnp.floor(length).astype(jnp.int32), 1)


def quadratic_sync_rule(
  base_period: int,
  alpha: float,
  learning_rate: optax.ScalarOrSchedule,
  *,
  warmup_steps: int = 0,
) -> Callable:
  r"""The Quadratic Synchronization Rule: :math:`\max(H_b, \lfloor(\alpha/\eta_s)^2\rfloor)`.

  As the learning rate :math:`\eta` decays the rounds grow,

  .. math::
    H = \max\left(H_\text{base}, \left\lfloor (\alpha / \eta)^2 \right\rfloor\right).

  Args:
    base_period: :math:`H_b`, the shortest round (the period at the peak rate).
    alpha: :math:`\alpha`; rounds are longer than :math:`H_b` once
      :math:`\eta < \alpha / \sqrt{H_b}`.
    learning_rate: the optimizer's learning rate, a float or an optax schedule;
      :math:`\eta_s` is its value at the round's first step ``s``.
    warmup_steps: rounds that start before this step last ``base_period``. The rule
      is meant for the decaying rate (Gu et al. apply it after warmup); a warmup
      from a rate of 0 would otherwise start with a round that never ends.

  Returns:
    ``period(step)``, to pass as ``sync_every``.

  Examples:
    >>> import optax, lordo_jax
    >>> lr = optax.cosine_decay_schedule(1e-2, 1000)
    >>> rule = lordo_jax.quadratic_sync_rule(8, 0.02, lr)
    >>> lordo_jax.sync_steps(rule, 100)[:3]
    [8, 16, 24]

  References:
    Gu, Lyu, Arora, Zhang, Huang, `A Quadratic Synchronization Rule for Distributed
    Deep Learning <https://arxiv.org/abs/2310.14423>`_, ICLR 2024.
  """
  checks.positive_int("quadratic_sync_rule", "base_period", base_period)
  checks.positive("quadratic_sync_rule", "alpha", alpha)
  checks.positive_int("quadratic_sync_rule", "warmup_steps", warmup_steps, minimum=0)
  schedule = learning_rate if callable(learning_rate) else (lambda _: learning_rate)
  if warmup_steps == 0 and callable(learning_rate):
    first_rate = _on_the_host(lambda: float(np.asarray(schedule(0))))
    if first_rate is not None and first_rate <= alpha / np.sqrt(LONG_FIRST_ROUND * base_period):
      checks.warn(
        f"quadratic_sync_rule: the learning rate at step 0 is {first_rate:g}, so the "
        f"first round lasts (alpha / rate)^2 = {_first_round(alpha, first_rate)} steps "
        f"against base_period={base_period}: no sync until then. If the schedule "
        "warms up, pass warmup_steps=<its warmup length> (rounds that start during "
        "the warmup last base_period)."
      )

  def period(step):
    rate = jnp.asarray(schedule(step), jnp.float32)
    quadratic = jnp.floor((alpha / jnp.maximum(rate, 1e-30)) ** 2)
    # Cap well inside int32: a rate of zero means "never sync again" in practice.
    quadratic = jnp.where(step < warmup_steps, base_period, quadratic)
    return jnp.maximum(base_period, jnp.minimum(quadratic, 2.0**30)).astype(jnp.int32)

  return period


def _on_the_host(compute: Callable):
  """``compute()`` evaluated now, even inside a trace (a method built inside
  ``optax.inject_hyperparams``' update); ``None`` if it depends on traced values."""
  try:
    with jax.ensure_compile_time_eval():
      return compute()
  except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
    return None


def _first_round(alpha: float, rate: float) -> str:
  if rate <= 0:
    return "2**30 (the cap: a rate of 0 never syncs)"
  return f"{min((alpha / rate) ** 2, 2.0**30):,.0f}"


def warn_if_first_round_never_ends(sync_every: SyncPeriod, name: str) -> None:
  """A warning when a period function's first round is :data:`LONGEST_FIRST_ROUND`
  steps or more: a rule that (by a rate of 0 at step 0, say) never syncs."""
  if not callable(sync_every):
    return
  first_round = _on_the_host(lambda: int(np.asarray(round_length(sync_every, 0))))
  if first_round is not None and first_round >= LONGEST_FIRST_ROUND:
    checks.warn(
      f"{name}: sync_every gives a first round of {first_round:,} steps: the workers will "
      "not synchronise before that step. Check the rule at step 0 (a learning rate "
      "of 0 at the start of a warmup makes quadratic_sync_rule's rounds endless: "
      "pass its warmup_steps)."
    )


def sync_steps(sync_every: SyncPeriod, steps: int) -> list[int]:
  """The 1-based steps up to ``steps`` whose end is a sync, computed on the host.

  Args:
    sync_every: the optimizer's ``sync_every``: K, or a function of the step giving
      each round's length (:func:`lordo_jax.quadratic_sync_rule`).
    steps: the last step to consider (1-based, inclusive).

  Returns:
    The steps t in ``1 .. steps`` after whose update a round ends, ascending: every
    multiple of K for an int.

  Examples:
    >>> import lordo_jax
    >>> lordo_jax.sync_steps(4, 13)
    [4, 8, 12]
  """
  found, start = [], 0
  while True:
    start += int(np.asarray(round_length(sync_every, start)))
    if start > steps:
      return found
    found.append(start)


def fragment_offsets(sync_every: int, fragments: int) -> list[int]:
  r"""When each of F fragments syncs within a K-step round (streaming).

  Fragment f syncs at the end of the steps t with :math:`t \equiv o_f \pmod K`,
  :math:`o_f = \lfloor (f + 1) K / F \rfloor`: evenly staggered, the last on the
  round's end (so F = 1 is the plain schedule). Needs :math:`F \le K`.
  """
  return [((f + 1) * sync_every // fragments) % sync_every for f in range(fragments)]


def fragment_labels(params, fragments) -> list[int]:
  """The fragment of every leaf of ``params``, in flattening order.

  ``fragments`` is an int F: the leaves, in flattening order (for a model, roughly
  layer by layer), cut into F contiguous non-empty groups whose largest is as small
  as it can be (the smallest capacity a greedy fill fits in, found by bisection).
  Or a function of ``params`` returning a tree of fragment indices (ints in
  ``[0, F)``, F their maximum plus one), to choose the split yourself.
  """
  if callable(fragments):
    labels = [int(x) for x in jax.tree.leaves(fragments(params))]
    if len(labels) != len(jax.tree.leaves(params)) or min(labels, default=0) < 0:
      raise ValueError(
        "fragments: the function must return one non-negative int per leaf of params."
      )
    return labels
  sizes = [int(np.prod(np.shape(x))) for x in jax.tree.leaves(params)]
  if fragments > len(sizes):
    raise ValueError(
      f"fragments={fragments} is more than the {len(sizes)} leaves of the params; a "
      "leaf is never split. Use at most that many fragments."
    )

  def fill(capacity):
    """Greedy contiguous fill, leaving a leaf for every fragment still to come."""
    labels, fragment, load = [], 0, 0
    for i, size in enumerate(sizes):
      left = len(sizes) - i
      if (
        load
        and fragment < fragments - 1
        and (load + size > capacity or left < fragments - fragment)
      ):
        fragment, load = fragment + 1, 0
      labels.append(fragment)
      load += size
    return labels

  def largest(labels):
    return max(
      sum(s for s, lab in zip(sizes, labels, strict=True) if lab == f) for f in range(fragments)
    )

  low, high = max(sizes), sum(sizes)
  while low < high:
    middle = (low + high) // 2
    low, high = (low, middle) if largest(fill(middle)) <= middle else (middle + 1, high)
  return fill(low)
