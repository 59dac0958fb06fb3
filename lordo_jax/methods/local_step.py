"""The local step every method takes: AdamW, or low-rank Adam on the matrices.

:func:`adamw` (``optax.adamw`` from its pieces, moments in float32) is the local step
of the full-rank methods; :func:`low_rank_adamw` (low-rank Adam on the matrices,
MATH.md §3) that of :func:`lordo_jax.lordo`, its ablations and
:func:`lordo_jax.low_rank_ddp`.
"""

import numbers
from collections.abc import Callable

import optax

from lordo_jax.local import _low_rank_adam as low_rank_lib
from lordo_jax.local import _low_rank_options as low_rank_options
from lordo_jax.local import _precision as precision
from lordo_jax.local import _quasi_hyperbolic as quasi_hyperbolic
from lordo_jax.local import _routing as routing
from lordo_jax.methods import options as options_lib


def _decoupled(direction, learning_rate, weight_decay) -> optax.GradientTransformation:
  r"""``direction``, then AdamW's tail: :math:`-\eta (\text{direction} + \lambda W)`."""
  return optax.chain(
    direction,
    optax.add_decayed_weights(weight_decay),
    optax.scale_by_learning_rate(learning_rate),
  )


def adamw(learning_rate, b1, b2, eps, weight_decay) -> optax.GradientTransformation:
  r"""``optax.adamw`` from its pieces, moments in float32 as on LoRDO's full-rank path.

  .. math::
    \text{update} = -\eta\, (\text{direction} + \lambda W)

  with the direction Adam's :math:`\hat u / (\sqrt{\hat v} + \epsilon)`. For float32
  params this is exactly ``optax.adamw``; for bfloat16 params the moments stay
  float32 (:func:`lordo_jax.in_float32`), so every method keeps its moments at the
  same precision. The methods other than :func:`lordo_jax.lordo`, its ablations and
  :func:`lordo_jax.low_rank_ddp` take it.
  """
  return _decoupled(full_rank_adam(b1, b2, eps), learning_rate, weight_decay)


def full_rank_adam(b1, b2, eps, qh_nu=1.0) -> optax.GradientTransformation:
  r"""``optax.scale_by_adam`` (``qh_nu`` = 1), else QHAdam; moments in float32.

  QHAdam is :func:`lordo_jax.local._quasi_hyperbolic.scale_by_qhadam`; its state is Adam's.
  Its direction, on the full-rank path with ``full_rank_nu`` :math:`= \nu < 1`:

  .. math::
    \frac{(1 - \nu)\, g + \nu \hat u}{\sqrt{\hat v} + \epsilon}
  """
  if isinstance(qh_nu, numbers.Real) and qh_nu == 1:
    adam = optax.scale_by_adam(b1=b1, b2=b2, eps=eps)
  else:
    adam = quasi_hyperbolic.scale_by_qhadam(b1=b1, b2=b2, eps=eps, qh_nu=qh_nu)
  return precision.in_float32(adam)


def low_rank_adamw(
  step_options: low_rank_options.LowRankOptions,
  local_options: options_lib.LocalOptions,
  learning_rate: optax.ScalarOrSchedule,
  *,
  init_projection: str,
  seed: int | None = None,
  refresh_every: int | None = None,
  matrices_path: Callable = lambda low_rank: low_rank,
  who: str,
) -> tuple[low_rank_lib.LowRankAdam, optax.GradientTransformation]:
  r"""``(low_rank, the local step)``: the low-rank local step of :func:`lordo_jax.lordo`.

  .. math::
    \text{update} = -\eta\, (\text{direction} + \lambda W)

  with the direction, on a low-rank matrix, the quasi-hyperbolic mix of
  :func:`lordo_jax.scale_by_low_rank_adam` (MATH.md §3), and on the other leaves
  :func:`full_rank_adam`'s. :func:`lordo_jax.lordo`, its ablations and
  :func:`lordo_jax.low_rank_ddp` take it.

  ``low_rank`` is the :class:`~lordo_jax.LowRankAdam` built from ``step_options`` (checked
  in ``who``'s name) with ``local_options.low_rank_labels`` as its ``matrix_axes``; the local step
  is ``matrices_path(low_rank)`` on the matrices, Adam (QHAdam with ``full_rank_nu``)
  on the other leaves, then AdamW's tail (decoupled weight decay, learning rate).
  Params with no 2-D leaf take the full-rank path alone (a warning says so); 2-D leaves
  that all have ``min(p, q) <= rank`` are refused at ``init``
  (:func:`lordo_jax.local._routing.partition_labels`). ``matrices_path`` may make the
  low-rank step data-parallel, as
  :func:`lordo_jax.comm._projected_mean.projected_mean` does for low-rank DDP.
  """
  low_rank = low_rank_lib.low_rank_adam(
    who,
    step_options,
    refresh_every=refresh_every,
    init_projection=init_projection,
    seed=seed,
    matrix_axes=local_options.low_rank_labels,
  )
  direction = optax.partition(
    {
      routing.LOW_RANK: matrices_path(low_rank),
      routing.FULL_RANK: full_rank_adam(
        step_options.b1, step_options.b2, step_options.eps, local_options.full_rank_nu
      ),
    },
    routing.partition_labels(local_options.low_rank_labels, step_options.rank, who),
  )
  return low_rank, _decoupled(direction, learning_rate, local_options.weight_decay)
