r"""Host offload of the state a round reads only at its sync.

With ``offload=True`` (:func:`lordo_jax.synchronize` and every method with an anchor)
the anchor, the outer optimizer's state, the compression residual and a message in
flight live in host memory between syncs: the sync branch moves them (:func:`placed`,
:func:`to_device`, :func:`to_host`), and :func:`on_host` tells where an array is placed.
"""

from typing import Any

import jax

HOST_KINDS = ("pinned_host", "unpinned_host")


def to_host(tree: Any) -> Any:
  r"""Every array of ``tree`` in host memory (``pinned_host``), its sharding kept.

  The anchor (the parameters at the last sync), the outer optimizer's state (DiLoCo's
  outer momentum) and the compression residual are read and written once every K steps,
  at the sync, and never at a local step. With ``offload=True``
  (:func:`lordo_jax.synchronize` and every method with an anchor) they live in the
  host's ``pinned_host`` memory, the accelerator holds only what a local step needs, and
  the sync branch moves them

  .. math::
    \text{host} \xrightarrow{\ \text{to\_device}\ } \text{device}
    \xrightarrow{\ \text{sync}\ } \text{device}
    \xrightarrow{\ \text{to\_host}\ } \text{host}

  inside its ``lax.cond`` branch, so a local step moves nothing. The copies are exact,
  so results are bit-identical to ``offload=False``. A sync step then transfers the
  anchor twice over the host link (PCIe on a GPU): ``2 pq`` elements per ``p x q``
  matrix every K steps, against AdamW's ``2 pq`` resident on the device at every step.

  Placement is a memory kind of the arrays' sharding (``jax.memory.Space.Host``), which
  ``jit`` and ``shard_map`` honour (their sharding is kept: an anchor split over an FSDP
  axis stays split in host memory). ``pmap`` places every output on the device, so under
  ``pmap`` the option changes nothing: use ``shard_map``.
  """
  return jax.tree.map(lambda x: jax.device_put(x, jax.memory.Space.Host), tree)


def placed(state: Any, move) -> Any:
  """A :class:`~lordo_jax.round._synchronize.SynchronizeState` with what offload keeps in
  host memory (the anchor, the outer state, the compression residual and a message in
  flight) moved by ``move`` (:func:`to_host` or :func:`to_device`)."""
  return state._replace(
    anchor=move(state.anchor),
    outer_state=move(state.outer_state),
    residual=move(state.residual),
    in_flight=move(state.in_flight),
  )


def to_device(tree: Any) -> Any:
  """Every array of ``tree`` in device memory, its sharding kept."""
  return jax.tree.map(lambda x: jax.device_put(x, jax.memory.Space.Device), tree)


def memory_kind(x: Any) -> str | None:
  """The memory kind of a concrete array (or a shape with a sharding); else ``None``."""
  sharding = getattr(x, "sharding", None)
  return getattr(sharding, "memory_kind", None)


def on_host(x: Any) -> bool:
  """Whether ``x`` is placed in host memory."""
  return memory_kind(x) in HOST_KINDS
