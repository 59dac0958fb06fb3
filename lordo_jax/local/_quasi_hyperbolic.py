r"""Quasi-hyperbolic terms: the full-rank mix that keeps the subspace from freezing, and QHAdam.

:func:`quasi_hyperbolic_mix` is LoRDO's full-rank term (MATH.md §1 says why it is
needed); :func:`qh_momentum` and :func:`scale_by_qhadam` are QHAdam's numerator (Ma and
Yarats), used on the full-rank path (``full_rank_nu``) and inside the projection
(``qh_nu``).
"""

import numbers

import jax
import jax.numpy as jnp
import optax

FULL_RANK_SCALES = ("scalar", "vector")


def full_rank_scale(denominator: jax.Array, kind: str, side: str = "left") -> jax.Array:
  """``s``: the mean of the denominator D, a scalar, or the mean over its rank axis.

  ``side="left"``: D is ``r x q`` and the vector ``s`` a ``1 x q`` row;
  ``side="right"``: D is ``p x r`` and the vector ``s`` a ``p x 1`` column. Leading
  axes of D are a batch of matrices, each with its own ``s`` (the scalar then a
  ``1 x 1`` matrix per matrix).
  """
  if kind == "scalar":
    if denominator.ndim == 2:
      return jnp.mean(denominator)
    return jnp.mean(denominator, axis=(-2, -1), keepdims=True)
  if kind == "vector":
    return jnp.mean(denominator, axis=-2 if side == "left" else -1, keepdims=True)
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
  r"""``(1 - omega) G / (mu s) + omega L`` for one matrix (MATH.md §3).

  .. math::
    F = \frac{G}{\mu\, s}, \qquad
    \text{direction} = (1 - \omega) F + \omega L,

  where :math:`L = Q (\hat u / D)` is the low-rank Adam direction,
  :math:`D = \sqrt{\hat v} + \epsilon` its denominator, and ``s`` brings ``F`` to the
  scale of ``L``: with ``"scalar"`` the mean of all of D's entries (the authors'
  code); with ``"vector"`` the mean of D over its r rows, a ``1 x q`` row broadcast
  over p (right case, D is ``p x r``: over its r columns, broadcast over q).
  :math:`\omega = 1` switches the full-rank term off (the "global projection only"
  ablation); :math:`\omega` plays the role of QHAdam's immediate-discount factor.

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

  Examples:
    With D all ones (so ``s = 1``), half of G plus half of L:

    >>> import jax.numpy as jnp, lordo_jax
    >>> g, low_rank = jnp.full((4, 3), 2.0), jnp.ones((4, 3))
    >>> mixed = lordo_jax.quasi_hyperbolic_mix(g, low_rank, jnp.ones((2, 3)), 0.5, 1.0, "scalar")
    >>> mixed[0].tolist()
    [1.5, 1.5, 1.5]
  """
  if isinstance(omega, (int, float)) and omega == 1:
    return low_rank_direction
  scale = full_rank_scale(denominator, kind, side)
  return scaled_mix(gradient, low_rank_direction, scale, omega, mu)


def scaled_mix(gradient: jax.Array, low_rank_direction: jax.Array, scale, omega, mu) -> jax.Array:
  """:func:`quasi_hyperbolic_mix` with its scale ``s`` given (:func:`full_rank_scale`):
  ``(1 - omega) G / (mu s) + omega L``, ``L`` itself at ``omega = 1``."""
  if isinstance(omega, (int, float)) and omega == 1:
    return low_rank_direction
  return (1 - omega) * (gradient / (mu * scale)) + omega * low_rank_direction


def qh_momentum(gradient: jax.Array, first_moment: jax.Array, qh_nu) -> jax.Array:
  r"""QHAdam's numerator :math:`(1 - \nu) g + \nu \hat m`; ``first_moment`` itself at
  :math:`\nu` = ``qh_nu`` = 1.

  Divided by :math:`\sqrt{\hat v} + \epsilon` it is QHAdam's direction;
  :math:`\nu = 1` is Adam. :func:`scale_by_qhadam` applies it to whole leaves, and
  :func:`lordo_jax.scale_by_low_rank_adam`'s ``qh_nu`` inside the projection, with
  the coordinates c in place of g.

  Args:
    gradient: g (or the low-rank coordinates c).
    first_moment: :math:`\hat m`, the bias-corrected first moment, shaped like g.
    qh_nu: :math:`\nu`, the weight of the first moment, in [0, 1] (a number or an
      array).

  Returns:
    The numerator, shaped like g.
  """
  if isinstance(qh_nu, numbers.Real) and qh_nu == 1:
    return first_moment
  return (1 - qh_nu) * gradient + qh_nu * first_moment


def scale_by_qhadam(
  b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, qh_nu: float = 0.7
) -> optax.GradientTransformation:
  r"""QHAdam: Adam whose numerator mixes the gradient with the first moment.

  .. math::
    m \leftarrow \beta_1 m + (1 - \beta_1) g, \quad
    v \leftarrow \beta_2 v + (1 - \beta_2) g^2, \quad
    \text{direction} = \frac{(1 - \nu) g + \nu\, m / (1 - \beta_1^t)}
      {\sqrt{v / (1 - \beta_2^t)} + \epsilon}

  :math:`\nu = 1` is ``optax.scale_by_adam``. The state is an
  ``optax.ScaleByAdamState``, so :func:`lordo_jax.synchronize` averages its moments
  as it does Adam's.

  Args:
    b1, b2, eps: Adam's decay rates and denominator offset.
    qh_nu: QHAdam's immediate discount :math:`\nu`, the weight of the first moment.

  Returns:
    An ``optax.GradientTransformation``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from lordo_jax.local import _quasi_hyperbolic as quasi_hyperbolic
    >>> tx = quasi_hyperbolic.scale_by_qhadam(qh_nu=0.5)
    >>> grads = {"b": jnp.array([1.0, -2.0])}
    >>> updates, state = tx.update(grads, tx.init(grads))
    >>> updates["b"].round(4)  # step 1: m_hat = g, sqrt(v_hat) = |g|
    Array([ 1., -1.], dtype=float32)

  References:
    Ma & Yarats, `Quasi-hyperbolic momentum and Adam for deep learning
    <https://arxiv.org/abs/1810.06801>`_, ICLR 2019.
  """

  def init_fn(params):
    zeros = optax.tree.zeros_like(params)
    return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32), mu=zeros, nu=zeros)

  def update_fn(updates, state, params=None):
    del params
    mu = optax.tree.update_moment(updates, state.mu, b1, 1)
    nu = optax.tree.update_moment_per_elem_norm(updates, state.nu, b2, 2)
    count = optax.safe_int32_increment(state.count)
    mu_hat = optax.tree.bias_correction(mu, b1, count)
    nu_hat = optax.tree.bias_correction(nu, b2, count)
    directions = jax.tree.map(
      lambda g, m, v: qh_momentum(g, m, qh_nu) / (jnp.sqrt(v) + eps), updates, mu_hat, nu_hat
    )
    return directions, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

  return optax.GradientTransformation(init_fn, update_fn)
