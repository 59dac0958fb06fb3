"""``get_optimizer``: any method of ``lordo_jax``, by name, configured for the LM.

Methods are looked up on the installed ``lordo_jax`` at run time
(``getattr(lordo_jax, name)``), so the examples follow the library: a method it
offers can be trained here without changing this file. Each factory gets the
learning-rate schedule as its first argument and, among the keyword arguments below,
those its signature accepts:

* ``axis_name``: the mesh axis of the simulated workers;
* ``rank``, ``low_rank_labels``: the low-rank methods' subspace (the byte embedding,
  position embedding and output head stay full rank);
* ``sync_every``: the local-update methods' round length K;
* ``refresh_every``: the low-rank DDP basis refresh period T (under whichever of the
  usual names the factory uses);
* ``weight_decay``.

A factory with ``**options`` (a LoRDO variant) gets the options ``lordo`` accepts.
"""

import inspect
from collections.abc import Callable
from typing import Any

import optax

import lordo_jax

from . import model as model_lib

# The methods the main command compares, in the order of its table.
DEFAULT_METHODS = ("lordo", "low_rank_ddp", "ddp", "diloco", "lordo_int8_overlap")
# Named configurations of a method: LoRDO for slow links, its pseudo-gradient in int8
# and a whole round in flight (the least bandwidth, at a cost in loss: the overlap guide),
# merged eagerly with an outer step of 0.7 (SGD), which the outer optimizer study found
# best for LoRDO's eager merge (BENCHMARKS.md, "The outer optimizer for a round in flight"),
# taken as it is (delay_correction="none", as that study ran it): LoRDO's default with a
# round in flight (delay_correction="damped") to float rounding, written as the run was.
VARIANTS = {
  "lordo_int8_overlap": (
    "lordo",
    {
      "compression": "int8",
      "overlap": "round",
      "merge": "eager",
      "outer_learning_rate": 0.7,
      "delay_correction": "none",
    },
  )
}
# Every optimizer factory the examples know how to configure.
KNOWN_METHODS = (
  "lordo",
  "low_rank_ddp",
  "ddp",
  "diloco",
  "local_adam",
  "desloc",
  "lordo_local_projection",
  "lordo_global_projection_only",
  *VARIANTS,
)
# Names a factory may give the basis refresh period of low-rank DDP.
_REFRESH_NAMES = ("refresh_every", "projection_every", "update_proj_gap", "projection_period")


def available_methods() -> tuple[str, ...]:
  """The known methods the installed ``lordo_jax`` provides."""
  return tuple(name for name in KNOWN_METHODS if callable(factory_of(name)[0]))


def factory_of(name: str) -> tuple[Callable | None, dict[str, Any]]:
  """``lordo_jax``'s factory of method ``name`` and the options a variant
  (:data:`VARIANTS`) gives it; ``(None, {})`` for a name it does not have."""
  base, preset = VARIANTS.get(name, (name, {}))
  return getattr(lordo_jax, base, None), dict(preset)


def default_methods() -> tuple[str, ...]:
  """The methods of :data:`DEFAULT_METHODS` the installed ``lordo_jax`` provides."""
  return tuple(name for name in DEFAULT_METHODS if name in available_methods())


# The learning-rate schedules of schedule(): after a linear warmup from 0 to the peak,
# "cosine" decays to a tenth of the peak at the last step, "constant" stays at the peak
# (the LoRDO authors' runs, docs/FIDELITY.md point 11).
SCHEDULES = ("cosine", "constant")


def schedule(learning_rate: float, steps: int, warmup: int, kind: str = "cosine") -> optax.Schedule:
  """Linear warmup to ``learning_rate``, then ``kind`` (:data:`SCHEDULES`).

  ``"cosine"``: ``lr_t = lr/10 + (lr - lr/10) (1 + cos(pi (t - w) / (steps - w))) / 2``
  after the warmup of ``w`` steps; ``"constant"``: ``lr_t = lr`` after it.

  Raises:
    ValueError: ``kind`` not in :data:`SCHEDULES`.
  """
  warmup = max(1, min(warmup, steps - 1))
  if kind == "constant":
    return optax.warmup_constant_schedule(0.0, learning_rate, warmup)
  if kind != "cosine":
    raise ValueError(f"--schedule {kind}: unknown; use one of {', '.join(SCHEDULES)}.")
  return optax.warmup_cosine_decay_schedule(
    0.0, learning_rate, warmup, max(steps, warmup + 1), learning_rate / 10
  )


def get_optimizer(
  name: str,
  *,
  learning_rate: optax.ScalarOrSchedule,
  axis_name: str | None,
  rank: int,
  sync_every: int,
  refresh_every: int,
  weight_decay: float = 0.0,
  low_rank_labels: Callable[[Any], Any] | None = model_lib.low_rank_labels,
  extra_options: dict[str, Any] | None = None,
  warmup_steps: int = 0,
) -> optax.GradientTransformation:
  """The optimizer ``lordo_jax.<name>`` with the options its signature accepts.

  ``extra_options`` go to the factory as they are (``{"omega": 1.0}``, say), after
  the common options above, which they override; the factory checks them. Some are
  read here instead: ``outer_learning_rate`` and ``outer_momentum``, for a factory
  that takes an ``outer_optimizer`` but not these two (``lordo``, ``local_adam``),
  build it: ``optax.sgd(outer_learning_rate, outer_momentum, nesterov=True)`` (SGD
  without momentum where it is 0; DiLoCo's outer optimizer, a JSON-friendly form);
  ``quadratic_sync_alpha`` (a float) makes ``sync_every`` the
  Quadratic Synchronization Rule, ``lordo_jax.quadratic_sync_rule(sync_every,
  alpha, learning_rate, warmup_steps=warmup_steps)``; ``lr_scale`` (a float ``c``)
  multiplies the learning rate: ``lr_t -> c lr_t`` (the LoRDO authors halve LoRDO's
  rate from their warm start on, ``docs/FIDELITY.md`` point 11).

  Raises:
    ValueError: if ``lordo_jax`` has no method ``name``.
  """
  factory, preset = factory_of(name)
  if name not in KNOWN_METHODS or not callable(factory):
    raise ValueError(
      f"--methods: unknown method {name!r}; this lordo_jax offers {','.join(available_methods())}."
    )
  options = {
    "axis_name": axis_name,
    "rank": rank,
    "low_rank_labels": low_rank_labels,
    "sync_every": sync_every,
    "weight_decay": weight_decay,
  }
  options.update(dict.fromkeys(_REFRESH_NAMES, refresh_every))
  extra_options = preset | dict(extra_options or {})
  learning_rate = _scaled(learning_rate, extra_options.pop("lr_scale", 1.0))
  alpha = extra_options.pop("quadratic_sync_alpha", None)
  if alpha is not None:
    options["sync_every"] = lordo_jax.quadratic_sync_rule(
      sync_every, alpha, learning_rate, warmup_steps=warmup_steps
    )
  accepted = inspect.signature(factory).parameters
  if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
    # A variant forwarding **options to another factory (say, to lordo): give it the
    # options lordo takes.
    accepted = {**inspect.signature(lordo_jax.lordo).parameters, **accepted}
  options = {k: v for k, v in options.items() if k in accepted}
  if "outer_learning_rate" not in accepted and "outer_optimizer" in accepted:
    outer = [extra_options.pop(k, None) for k in ("outer_learning_rate", "outer_momentum")]
    if outer != [None, None]:
      extra_options["outer_optimizer"] = nesterov_outer(*outer)
  return factory(learning_rate, **(options | extra_options))


def nesterov_outer(
  learning_rate: float | None, momentum: float | None
) -> optax.GradientTransformation:
  """``optax.sgd(learning_rate, momentum, nesterov=True)``, DiLoCo's outer optimizer, with
  the averaging outer's rate 1 and no momentum for what is not given (``momentum=0``:
  plain SGD)."""
  learning_rate = 1.0 if learning_rate is None else learning_rate
  if not momentum:
    return optax.sgd(learning_rate)
  return optax.sgd(learning_rate, momentum=momentum, nesterov=True)


def _scaled(learning_rate: optax.ScalarOrSchedule, scale: float) -> optax.ScalarOrSchedule:
  """``scale`` times ``learning_rate`` (a number or a schedule of the step count)."""
  if scale == 1.0:
    return learning_rate
  if callable(learning_rate):
    return lambda count: scale * learning_rate(count)
  return scale * learning_rate
