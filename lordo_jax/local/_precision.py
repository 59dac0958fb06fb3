"""Optimizer state in float32 whatever the parameter dtype.

With bfloat16 parameters, ``optax.scale_by_adam`` keeps its second moment in
bfloat16, where ``1 - b2 = 0.001`` is below the format's resolution near 1 and the
moment stops tracking the gradient. LoRDO keeps every moment in float32 instead
(its low-rank moments are float32 by construction); :func:`in_float32` does the same
for any transformation.
"""

import jax
import jax.numpy as jnp
import optax


def _as_float32(tree):
  return jax.tree.map(
    lambda x: x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree
  )


def in_float32(inner: optax.GradientTransformation) -> optax.GradientTransformationExtraArgs:
  """``inner`` run on float32 copies of updates and params; outputs in the input dtype.

  Args:
    inner: any optax transformation.

  Returns:
    The same transformation, with its state in float32.

  Examples:
    >>> import jax.numpy as jnp, optax, lordo_jax
    >>> tx = lordo_jax.in_float32(optax.scale_by_adam())
    >>> params = {"b": jnp.zeros(3, jnp.bfloat16)}
    >>> state = tx.init(params)
    >>> state.nu["b"].dtype, tx.update(params, state)[0]["b"].dtype
    (dtype('float32'), dtype(bfloat16))
  """
  inner = optax.with_extra_args_support(inner)

  def init_fn(params):
    return inner.init(_as_float32(params))

  def update_fn(updates, state, params=None, **extra_args):
    params32 = None if params is None else _as_float32(params)
    new_updates, state = inner.update(_as_float32(updates), state, params32, **extra_args)
    restored = jax.tree.map(lambda new, old: new.astype(old.dtype), new_updates, updates)
    return restored, state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
