r"""Matrices sharded over a mesh's ``Explicit`` axes, made whole where an op needs it.

Under ``jax.shard_map(..., axis_names={worker axis})`` on a mesh whose other axes
(FSDP, tensor parallelism) have ``Explicit`` type, an array's sharding is part of its
type, and LAPACK-backed ops (``svd``, ``qr``) refuse a sharded operand.
:func:`whole` gathers such an operand over those axes inside the worker group (the
fast links; no message between workers, nothing in the ledger). With ``Auto`` axes,
or none, it changes nothing: the compiler places the data.
"""

import jax
from jax.sharding import PartitionSpec


def is_sharded(x: jax.Array) -> bool:
  """Whether ``x``'s type says it is split over some mesh axis (``Explicit`` axes)."""
  sharding = jax.typeof(x).sharding
  return any(axes is not None for axes in getattr(sharding, "spec", ()))


def whole(x: jax.Array) -> jax.Array:
  """``x`` gathered over the ``Explicit`` axes it is sharded on; else ``x`` itself."""
  if not is_sharded(x):
    return x
  return jax.sharding.reshard(x, PartitionSpec())
