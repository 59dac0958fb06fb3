r"""Matrices sharded over a mesh's ``Explicit`` axes: whole where an op needs it, and
state laid out like them.

Under ``jax.shard_map(..., axis_names={worker axis})`` on a mesh whose other axes
(FSDP, tensor parallelism) have ``Explicit`` type, an array's sharding is part of its
type, and LAPACK-backed ops (``svd``, ``qr``) refuse a sharded operand.
:func:`whole` gathers such an operand over those axes inside the worker group (the
fast links; no message between workers, nothing in the ledger). With ``Auto`` axes,
or none, it changes nothing: the compiler places the data.

:func:`spec_of` reads the axes each dimension is split over from the type, and
:func:`zeros` makes a state buffer split the same way, so that ``tx.init`` of a
sharded parameter gives state sharded like it.
"""

import jax
import jax.numpy as jnp
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


def spec_of(x: jax.Array) -> tuple:
  """The mesh axes each dimension of ``x`` is split over (``None``: whole), from its type."""
  spec = tuple(getattr(jax.typeof(x).sharding, "spec", ()))
  return spec + (None,) * (x.ndim - len(spec))


def zeros(shape: tuple[int, ...], dtype, spec: tuple) -> jax.Array:
  """Zeros of ``shape``, each dimension split over the mesh axes ``spec`` names."""
  if all(axes is None for axes in spec):
    return jnp.zeros(shape, dtype)
  return jnp.zeros(shape, dtype, out_sharding=PartitionSpec(*spec))
