"""Local updates: local AdamW steps, synchronised every K steps (MATH.md §6).

:func:`local_adam` (params and both moments every K), :func:`desloc` (params every
K_x, moments every K_u and K_v) and :func:`diloco` (an outer Nesterov SGD on the
averaged pseudo-gradient; moments stay local), each :func:`lordo_jax.synchronize`
of AdamW.
"""

from collections.abc import Callable
from typing import Any

import optax

from lordo_jax import _checks as checks
from lordo_jax import _keywords as keywords
from lordo_jax.methods import local_step
from lordo_jax.methods import options as options_lib
from lordo_jax.round import _overlap as overlap_lib
from lordo_jax.round import _synchronize as sync_lib


@keywords.takes(options_lib.basics("sync_every", "axis_name"), options_lib.ADAM, options_lib.ROUND)
def local_adam(
  learning_rate: optax.ScalarOrSchedule,
  *,
  sync_every: int | Callable,
  axis_name: str | None = None,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
  weight_decay: float = 0.0,
  compression: str | None = None,
  fragments: int | Callable | None = None,
  fault_tolerant: bool = False,
  overlap: str | int | None = None,
  merge: str | None = None,
  delay_correction: str | None = None,
  merge_alpha: float = 0.0,
  offload: bool = False,
) -> optax.GradientTransformationExtraArgs:
  r"""Local Adam: local AdamW steps; params and both moments averaged every K steps.

  Each worker m takes AdamW steps on its own gradients; at every step with
  :math:`t \bmod K = 0`:

  .. math::
    \theta = \mathrm{pmean}_m(\theta_m), \qquad
    u = \mathrm{pmean}_m(u_m), \qquad v = \mathrm{pmean}_m(v_m)

  (the parameters through the pseudo-gradient :math:`\text{anchor} - \theta_m` and
  plain averaging, :func:`synchronize` of AdamW with the identity outer step,
  MATH.md §6). Communication: ``3pq`` elements per ``p x q`` leaf per K steps, i.e.
  ``3pq / K`` per step (MATH.md §7).

  Args:
    {options}

  Returns:
    An ``optax.GradientTransformationExtraArgs``; its ``update`` needs params.

  Examples:
    >>> import jax.numpy as jnp, optax, lordo_jax
    >>> params = {"w": jnp.ones((4, 3))}
    >>> tx = lordo_jax.local_adam(1e-2, sync_every=8)
    >>> state = tx.init(params)
    >>> updates, state = tx.update({"w": jnp.ones((4, 3))}, state, params)

  References:
    Douillard et al., `DiLoCo <https://arxiv.org/abs/2311.08105>`_, 2023 (local
    updates with an outer step); Iacob et al., `DES-LOC
    <https://arxiv.org/abs/2505.22549>`_, 2025 (Local Adam averages both moments).
  """
  who = "local_adam"
  adam = _adam(who, locals())
  return _synchronized(who, locals(), adam, first_moment_every=1, second_moment_every=1)


def _adam(who: str, options: dict[str, Any]) -> dict[str, Any]:
  """AdamW's options among a method's keywords ``options``, checked."""
  options_lib.check_adam(who, options)
  return {k.name: options[k.name] for k in options_lib.ADAM}


def _synchronized(
  who: str,
  options: dict[str, Any],
  adam: dict[str, Any],
  *,
  first_moment_every: int | None,
  second_moment_every: int | None,
  outer_optimizer: optax.GradientTransformation | None = None,
) -> optax.GradientTransformationExtraArgs:
  """:func:`lordo_jax.synchronize` of AdamW with ``adam``; the method's round options,
  among its keywords ``options``, checked once in ``who``'s name."""
  return sync_lib.synchronized(
    local_step.adamw(options["learning_rate"], **adam),
    sync_every=options["sync_every"],
    axis_name=options["axis_name"],
    outer_optimizer=outer_optimizer,
    first_moment_every=first_moment_every,
    second_moment_every=second_moment_every,
    low_rank=None,
    init_projection="gradient",
    projection_source="pseudo_gradient",
    moment_decays=(adam["b1"], adam["b2"]),
    name=who,
    options=options_lib.round_options(who, options),
  )


def _period_in_syncs(who: str, name: str, steps, sync_every: int) -> int:
  """A period in steps (a multiple of ``sync_every``) as a number of syncs."""
  checks.positive_int(who, name, steps)
  if steps % sync_every:
    raise ValueError(
      f"{who}: {name}={steps!r} is not accepted; expected a multiple of "
      f"sync_every={sync_every} (moments are averaged only at a sync)."
    )
  return steps // sync_every


@keywords.takes(
  options_lib.basics("sync_every", "axis_name"),
  options_lib.ADAM,
  options_lib.ROUND,
)
def desloc(
  learning_rate: optax.ScalarOrSchedule,
  *,
  sync_every: int,
  first_moment_every: int | None = None,
  second_moment_every: int | None = None,
  axis_name: str | None = None,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
  weight_decay: float = 0.0,
  compression: str | None = None,
  fragments: int | Callable | None = None,
  fault_tolerant: bool = False,
  overlap: str | int | None = None,
  merge: str | None = None,
  delay_correction: str | None = None,
  merge_alpha: float = 0.0,
  offload: bool = False,
) -> optax.GradientTransformationExtraArgs:
  r"""DES-LOC: local AdamW with independent periods for params and each moment.

  Each worker takes AdamW steps on its own gradients; at the end of step t

  .. math::
    \theta &= \mathrm{pmean}_m(\theta_m) \quad \text{if } t \bmod K_x = 0, \\
    u &= \mathrm{pmean}_m(u_m) \quad \text{if } t \bmod K_u = 0, \qquad
    v = \mathrm{pmean}_m(v_m) \quad \text{if } t \bmod K_v = 0.

  :func:`synchronize` with ``first_moment_every = K_u / K_x`` and
  ``second_moment_every = K_v / K_x`` syncs. Communication per ``p x q`` leaf:
  ``pq (1 + K_x/K_u + K_x/K_v)`` elements per K_x steps, i.e.
  ``pq (1/K_x + 1/K_u + 1/K_v)`` per step (MATH.md §7).

  Args:
    {options}
    sync_every: K_x, steps between parameter averages.
    first_moment_every: K_u, steps between first-moment averages; a multiple of
      K_x; ``None``: 3 K_x (the paper's setting).
    second_moment_every: K_v, the same for the second moment; ``None``: 6 K_x.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` (its ``update`` needs params) that
    averages the moments at every ``K_u / K_x``-th and ``K_v / K_x``-th sync.

  Examples:
    >>> import jax.numpy as jnp, optax, lordo_jax
    >>> params = {"w": jnp.ones((4, 3))}
    >>> tx = lordo_jax.desloc(1e-2, sync_every=4)  # K_u = 12, K_v = 24
    >>> state = tx.init(params)
    >>> updates, state = tx.update({"w": jnp.ones((4, 3))}, state, params)

  References:
    Iacob et al., `DES-LOC: Desynced Low Communication Adaptive Optimizers for
    Training Foundation Models <https://arxiv.org/abs/2505.22549>`_, 2025.
  """
  who = "desloc"
  options = dict(locals())
  adam = _adam(who, options)
  round_options = options_lib.round_options(who, options)  # sync_every among them.
  if callable(sync_every):
    raise ValueError(
      f"{who}: sync_every={sync_every!r} is not accepted; expected an int >= 1 (the "
      "moment periods are multiples of it)."
    )
  if first_moment_every is None:
    first_moment_every = 3 * sync_every
  if second_moment_every is None:
    second_moment_every = 6 * sync_every
  return sync_lib.synchronized(
    local_step.adamw(learning_rate, **adam),
    sync_every=sync_every,
    axis_name=axis_name,
    outer_optimizer=None,
    first_moment_every=_period_in_syncs(who, "first_moment_every", first_moment_every, sync_every),
    second_moment_every=_period_in_syncs(
      who, "second_moment_every", second_moment_every, sync_every
    ),
    low_rank=None,
    init_projection="gradient",
    projection_source="pseudo_gradient",
    moment_decays=(adam["b1"], adam["b2"]),
    name=who,
    options=round_options,
  )


@keywords.takes(options_lib.basics("sync_every", "axis_name"), options_lib.ADAM, options_lib.ROUND)
def diloco(
  learning_rate: optax.ScalarOrSchedule,
  *,
  sync_every: int | Callable,
  axis_name: str | None = None,
  outer_learning_rate: float = 0.7,
  outer_momentum: float = 0.9,
  nesterov: bool = True,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
  weight_decay: float = 0.0,
  compression: str | None = None,
  fragments: int | Callable | None = None,
  fault_tolerant: bool = False,
  overlap: str | int | None = None,
  merge: str | None = None,
  delay_correction: str | None = None,
  merge_alpha: float = 0.0,
  offload: bool = False,
) -> optax.GradientTransformationExtraArgs:
  r"""DiLoCo: local AdamW, an outer Nesterov SGD on the averaged pseudo-gradient.

  Each worker takes AdamW steps on its own gradients and keeps its moments to itself;
  at every step with :math:`t \bmod K = 0`:

  .. math::
    \Delta &= \mathrm{pmean}_m(\text{anchor} - \theta_m), \qquad
    b \leftarrow \mu_o b + \Delta, \\
    \theta &= \text{anchor} - \eta_o (\Delta + \mu_o b) \ \text{(Nesterov; without
      it } \eta_o b\text{)}, \qquad \text{anchor} = \theta.

  :func:`synchronize` with ``optax.sgd(outer_learning_rate, outer_momentum,
  nesterov)`` as the outer optimizer and no moment averaging. Communication: ``pq``
  elements per ``p x q`` leaf per K steps, i.e. ``pq / K`` per step (MATH.md §7).

  Args:
    {options}
    outer_learning_rate: :math:`\eta_o`.
    outer_momentum: :math:`\mu_o`.
    nesterov: Nesterov momentum in the outer step.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` (its ``update`` needs params); the
    outer optimizer's state is in its ``outer_state``.

  Examples:
    >>> import jax.numpy as jnp, optax, lordo_jax
    >>> params = {"w": jnp.zeros((4, 3))}
    >>> tx = lordo_jax.diloco(1e-2, sync_every=8, outer_learning_rate=0.7)
    >>> state = tx.init(params)
    >>> updates, state = tx.update({"w": jnp.ones((4, 3))}, state, params)

  References:
    Douillard et al., `DiLoCo: Distributed Low-Communication Training of Language
    Models <https://arxiv.org/abs/2311.08105>`_, 2023.
  """
  who = "diloco"
  checks.positive(who, "outer_learning_rate", outer_learning_rate)
  checks.in_interval(who, "outer_momentum", outer_momentum, 0.0, 1.0, closed_high=False)
  checks.one_of(who, "nesterov", nesterov, (True, False))
  adam = _adam(who, locals())
  outer = optax.sgd(outer_learning_rate, momentum=outer_momentum, nesterov=nesterov)
  tx = _synchronized(
    who,
    locals(),
    adam,
    outer_optimizer=outer,
    first_moment_every=None,
    second_moment_every=None,
  )
  if overlap == "round" and delay_correction is not None:
    overlap_lib.warn_if_unstable(
      who, merge or "eager", delay_correction, outer_learning_rate, outer_momentum, nesterov
    )
  return tx
