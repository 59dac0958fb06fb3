r"""Whether the workers hold the same parameters: :func:`worker_disagreement`.

A sync lands every worker on the synchronised parameters; a transformation chained
after the method (``optax.scale``, a clip) changes that landing, and the workers part
without any error. This is the cheap check to run after a sync step.
"""

from typing import Any

import jax
import jax.numpy as jnp


def worker_disagreement(tree: Any, axis_name: str) -> jax.Array:
  r"""The largest relative spread of the workers' checksums of ``tree``.

  With two checksums per leaf, :math:`s_m = (\sum_i x_{m,i}, \sum_i x_{m,i}^2)`:

  .. math::
    d = \max_\text{leaf} \max_k \frac{\max_m s_{m,k} - \min_m s_{m,k}}
      {\max_m |s_{m,k}| + \text{tiny}}

  It sends two float32 numbers per leaf (one ``pmax``, one ``pmin``), outside any
  optimizer's ledger: a debugging aid, for the steps you choose.

  Call it inside ``jax.shard_map`` or ``jax.pmap`` over ``axis_name``, on the
  parameters after a sync step. Every worker gets the same float32 scalar: about
  ``1e-7`` or less when the workers agree, and the relative size of their
  difference when they do not (``1e-3`` and more when a transformation after the
  method rescales its updates).

  Args:
    tree: one worker's parameters (any pytree of arrays).
    axis_name: the worker axis.

  Returns:
    A float32 scalar :math:`d \ge 0`.

  Examples:
    >>> import jax, jax.numpy as jnp, lordo_jax
    >>> spread = jax.pmap(lambda p: lordo_jax.worker_disagreement(p, "w"), axis_name="w")
    >>> float(spread({"x": jnp.ones((jax.local_device_count(), 3))})[0])
    0.0
  """
  leaves = [jnp.asarray(x, jnp.float32) for x in jax.tree.leaves(tree)]
  if not leaves:
    return jnp.zeros([], jnp.float32)
  sums = jnp.stack([jnp.stack([jnp.sum(x), jnp.sum(x * x)]) for x in leaves])
  high = jax.lax.pmax(sums, axis_name)
  low = jax.lax.pmin(sums, axis_name)
  scale = jnp.maximum(jnp.abs(high), jnp.abs(low)) + jnp.finfo(jnp.float32).tiny
  return jnp.max((high - low) / scale)
