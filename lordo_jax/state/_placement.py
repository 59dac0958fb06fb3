r"""Where a fresh optimizer state goes: the shardings ``tx.init`` gives, for any mesh.

Inside ``jax.shard_map`` on a mesh with ``Explicit`` axes, ``tx.init`` of a sharded
parameter already gives state sharded like it (:mod:`lordo_jax._sharded`): the
anchor, error buffers, residual and full-rank moments split as the parameter is, the
low-rank moments along the matrix's dimension they keep, the bases and scalars whole.
With ``Auto`` axes, or a state made outside the step, :func:`state_sharding` computes
that layout once (lowering ``tx.init`` with ``Explicit`` axes, nothing allocated) as
shardings of the caller's mesh, for ``jax.device_put`` or ``out_shardings``.
"""

from typing import Any

import jax
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec


def _mesh_of(params: Any) -> jax.sharding.Mesh:
  shardings = [getattr(leaf, "sharding", None) for leaf in jax.tree.leaves(params)]
  meshes = {s.mesh for s in shardings if isinstance(s, NamedSharding)}
  if len(meshes) != 1 or not all(isinstance(s, NamedSharding) for s in shardings):
    raise ValueError(
      "state_sharding: every leaf of params must carry a NamedSharding of one mesh "
      "(a placed array, or jax.ShapeDtypeStruct(shape, dtype, sharding=...)); got "
      f"{len(meshes)} meshes."
    )
  return meshes.pop()


def _one_worker(leaf, mesh, worker_axis) -> jax.ShapeDtypeStruct:
  """One worker's slice of ``leaf`` (without the leading worker dimension), on ``mesh``."""
  spec = tuple(leaf.sharding.spec) + (None,) * (leaf.ndim - len(leaf.sharding.spec))
  if worker_axis is not None:
    if leaf.ndim == 0 or spec[0] != worker_axis:
      raise ValueError(
        f"state_sharding: with worker_axis={worker_axis!r} every leaf of params must be "
        f"stacked over the workers, split P({worker_axis!r}, ...) on its first "
        f"dimension; got shape {leaf.shape} split {leaf.sharding.spec}."
      )
    shape, spec = leaf.shape[1:], spec[1:]
  else:
    shape = leaf.shape
  return jax.ShapeDtypeStruct(shape, leaf.dtype, sharding=NamedSharding(mesh, PartitionSpec(*spec)))


def state_sharding(
  tx: Any,
  params: Any,
  *,
  worker_axis: str | None = None,
) -> Any:
  r"""The sharding of every leaf of ``tx.init(params)``, laid out like its parameter.

  Args:
    tx: an optax transformation of this library (or any whose ``init`` is traceable).
    params: placed arrays, or ``jax.ShapeDtypeStruct`` with a ``NamedSharding``, all on
      one mesh (of ``Explicit`` or ``Auto`` axes).
    worker_axis: if given, ``params`` are stacked over the workers (leading dimension
      split over this mesh axis, as in the Flax guide's worker step) and so is the state:
      each worker's state is laid out from its own slice, and the worker axis put
      first.

  Returns:
    A tree shaped like ``tx.init``'s state (stacked with ``worker_axis``) of
    ``NamedSharding`` on the mesh of ``params``, with memory kind ``pinned_host`` where
    ``offload=True`` keeps the leaf in host memory.

  Examples:
    >>> import jax, jax.numpy as jnp, lordo_jax
    >>> from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    >>> mesh = jax.make_mesh((4, 2), ("workers", "fsdp"), axis_types=(AxisType.Auto,) * 2)
    >>> w = jax.ShapeDtypeStruct((4, 16, 8), jnp.float32,
    ...                          sharding=NamedSharding(mesh, P("workers", "fsdp")))
    >>> tx = lordo_jax.lordo(1e-2, rank=2, sync_every=4, axis_name="workers", offload=True)
    >>> shardings = lordo_jax.state_sharding(tx, {"w": w}, worker_axis="workers")
    >>> tuple(shardings.anchor["w"].spec), shardings.anchor["w"].memory_kind
    (('workers', 'fsdp', None), 'pinned_host')
  """
  mesh = _mesh_of(params)
  explicit = jax.sharding.Mesh(
    mesh.devices, mesh.axis_names, axis_types=(AxisType.Explicit,) * len(mesh.axis_names)
  )
  one_worker = jax.tree.map(lambda leaf: _one_worker(leaf, explicit, worker_axis), params)
  set_mesh = getattr(jax, "set_mesh", None) or jax.sharding.use_mesh
  with set_mesh(explicit):
    out_info = jax.jit(tx.init).lower(one_worker).out_info
  lead = () if worker_axis is None else (worker_axis,)

  def on_callers_mesh(info):
    if info.sharding is None:  # A scalar the lowering did not place: whole, on the device.
      return NamedSharding(mesh, PartitionSpec(*lead))
    spec = tuple(getattr(info.sharding, "spec", ()))
    spec += (None,) * (len(info.shape) - len(spec))
    kind = info.sharding.memory_kind
    return NamedSharding(mesh, PartitionSpec(*lead, *spec), memory_kind=kind)

  return jax.tree.map(on_callers_mesh, out_info)
