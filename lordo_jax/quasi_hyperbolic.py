r"""The full-rank quasi-hyperbolic mix that keeps the subspace from freezing.

With a global projection alone every local update lies in span(Q), so the
pseudo-gradient does too, and its top-r subspace is span(Q) again: the projection
never moves. LoRDO mixes a full-rank term into every update (SPEC section 3):

.. math::
  F = \frac{G}{\mu\, s}, \qquad
  \text{direction} = (1 - \omega) F + \omega L,

where :math:`L = Q (\hat u / D)` is the low-rank Adam direction,
:math:`D = \sqrt{\hat v} + \epsilon` its denominator (``r x q``), and ``s``
normalises ``F`` to the scale of ``L``:

* ``"scalar"``: the mean of D over all its entries (one number per matrix), as in
  the authors' experimental code;
* ``"vector"``: the mean of D over its r rows, a ``1 x q`` row broadcast over p
  (right case, D is ``p x r``: the mean over its r columns, a ``p x 1`` column
  broadcast over q).

:math:`\omega = 1` switches the full-rank term off (the "global projection only"
ablation); :math:`\omega` plays the role of QHAdam's immediate-discount factor.
G and L are the leaf's ``p x q`` matrices on either side; only D's shape and the
axis ``s`` averages depend on the side.
"""

import jax
import jax.numpy as jnp

FULL_RANK_SCALES = ("scalar", "vector")


def full_rank_scale(denominator: jax.Array, kind: str, side: str = "left") -> jax.Array:
  """``s``: the mean of the denominator D, a scalar, or the mean over its rank axis.

  ``side="left"``: D is ``r x q`` and the vector ``s`` a ``1 x q`` row;
  ``side="right"``: D is ``p x r`` and the vector ``s`` a ``p x 1`` column.
  """
  if kind == "scalar":
    return jnp.mean(denominator)
  if kind == "vector":
    return jnp.mean(denominator, axis=0 if side == "left" else 1, keepdims=True)
  raise ValueError(f"full_rank_scale={kind!r} is not one of {FULL_RANK_SCALES}.")


def quasi_hyperbolic_mix(
  gradient: jax.Array,
  low_rank_direction: jax.Array,
  denominator: jax.Array,
  omega,
  mu,
  kind: str,
  *,
  side: str = "left",
) -> jax.Array:
  r"""``(1 - omega) G / (mu s) + omega L`` for one matrix.

  Args:
    gradient: G, ``p x q``, float32.
    low_rank_direction: L, ``p x q``.
    denominator: D, ``r x q`` (left case) or ``p x r`` (right case).
    omega: weight of the low-rank term, in [0, 1].
    mu: rescaling of the full-rank term.
    kind: ``"scalar"`` or ``"vector"`` (how ``s`` is taken from D).
    side: ``"left"`` or ``"right"``: which axis of D is the rank axis.

  Returns:
    The ``p x q`` direction.
  """
  if isinstance(omega, (int, float)) and omega == 1:
    return low_rank_direction
  scale = full_rank_scale(denominator, kind, side)
  return (1 - omega) * (gradient / (mu * scale)) + omega * low_rank_direction
