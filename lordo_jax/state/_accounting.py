"""What an optimizer state says about a run: bytes sent, current bases.

These read a state on the host (outside ``jit``) and return Python values (or plain
arrays) a user can log. Each takes a state as the training loop holds it: a chain's, an
``optax.inject_hyperparams``'s, or Flax's ``nnx.Optimizer.opt_state`` as it is (its
``OptArray`` and ``OptVariable`` wrappers are read through). A state stacked over
workers (a leading worker axis, as ``pmap`` and ``shard_map`` outputs are) is read from
worker 0; the ledgers of all workers agree.
"""

import math
from typing import Any

import jax
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec

from lordo_jax import _sharded as sharded
from lordo_jax import _tree_structure as tree_structure
from lordo_jax.comm import _collectives as collectives
from lordo_jax.local import _low_rank_adam as low_rank_lib
from lordo_jax.local import _projection as projection_lib
from lordo_jax.round import _offload as offload_lib
from lordo_jax.round import _synchronize as sync_lib


def _ledgers(state: Any) -> list[collectives.Ledger]:
  is_ledger = lambda x: isinstance(x, collectives.Ledger)  # noqa: E731
  leaves = jax.tree.leaves(tree_structure.values(state), is_leaf=is_ledger)
  return [x for x in leaves if is_ledger(x)]


def communicated_elements(state: Any) -> int:
  """Elements all-reduced per worker since ``init``, summed over every ledger.

  This is the payload of each all-reduce, before any algorithm's factor: a ring
  all-reduce moves ``2 (M - 1) / M`` times it over each worker's link.

  Args:
    state: an optimizer state, or any tree holding one (a chain's, an
      ``nnx.Optimizer``'s ``opt_state``; stacked over workers: worker 0's ledger is
      read).

  Returns:
    The elements, an exact Python int.

  Examples:
    >>> import jax.numpy as jnp, lordo_jax
    >>> tx = lordo_jax.lordo(1e-2, rank=2, sync_every=4)
    >>> lordo_jax.communicated_elements(tx.init({"w": jnp.ones((8, 8))}))
    0
  """
  return sum(collectives.ledger_total(ledger)[0] for ledger in _ledgers(state))


def communicated_bytes(state: Any) -> int:
  """Bytes all-reduced per worker since ``init`` (see :func:`communicated_elements`).

  Args:
    state: an optimizer state, or any tree holding one (see
      :func:`communicated_elements`).

  Returns:
    The bytes, an exact Python int, in each message's own dtype (a compressed message
    counts its encoded bytes).

  Examples:
    >>> import jax.numpy as jnp, lordo_jax
    >>> tx = lordo_jax.lordo(1e-2, rank=2, sync_every=4)
    >>> lordo_jax.communicated_bytes(tx.init({"w": jnp.ones((8, 8))}))
    0
  """
  return sum(collectives.ledger_total(ledger)[1] for ledger in _ledgers(state))


def all_reduce_count(state: Any) -> int:
  """Number of all-reduce calls since ``init``, summed over every ledger.

  Args:
    state: an optimizer state, or any tree holding one (see
      :func:`communicated_elements`).

  Returns:
    The all-reduces every worker has entered, a Python int (one per message: a sync
    sends the pseudo-gradient and, when due, the moments).

  Examples:
    >>> import jax.numpy as jnp, lordo_jax
    >>> tx = lordo_jax.diloco(1e-2, sync_every=4)
    >>> lordo_jax.all_reduce_count(tx.init({"w": jnp.ones((8, 8))}))
    0
  """
  return sum(int(np.asarray(ledger.all_reduces).reshape(-1)[0]) for ledger in _ledgers(state))


def step_count(state: Any) -> jax.Array:
  """The number of updates a state has taken: the outermost ``count`` in it.

  A method's state holds several counts (the round's, the low-rank Adam's, the other
  leaves' Adam's), all equal, so ``optax.tree_utils.tree_get(state, "count")`` finds
  more than one and raises; this reads the outermost, through any wrapper
  (``optax.inject_hyperparams``, ``optax.chain``, a Flax state).

  Args:
    state: an optimizer state, or any tree holding one.

  Returns:
    The count, a plain int32 array (stacked over workers: one per worker).

  Raises:
    ValueError: the state holds no ``count``.

  Examples:
    >>> import jax.numpy as jnp, lordo_jax
    >>> params = {"w": jnp.ones((8, 4))}
    >>> tx = lordo_jax.lordo(1e-2, rank=2, sync_every=2)
    >>> state = tx.init(params)
    >>> _, state = tx.update(params, state, params)
    >>> int(lordo_jax.step_count(state))
    1
  """
  found = optax.tree_utils.tree_get_all_with_path(tree_structure.values(state), "count")
  if not found:
    raise ValueError("step_count: this state holds no 'count'.")
  return min(found, key=lambda item: len(item[0]))[1]


def projections(state: Any) -> Any:
  """The current float32 basis Q of every low-rank matrix, in a tree like params.

  Left case: ``p x r``; right case: ``q x r``; leaves that are not low-rank are
  ``None``. A state stacked over workers gives stacked bases.

  Args:
    state: the state of a low-rank method (:func:`~lordo_jax.lordo`,
      :func:`~lordo_jax.low_rank_ddp`, ...), or any
      tree holding one (a chain's, an ``nnx.Optimizer``'s ``opt_state``).

  Returns:
    A tree like the parameters: each low-rank leaf's basis, ``None`` elsewhere.

  Raises:
    ValueError: the state holds no low-rank matrices.

  Examples:
    >>> import jax.numpy as jnp, lordo_jax
    >>> params = {"w": jnp.ones((8, 6)), "b": jnp.zeros(6)}
    >>> tx = lordo_jax.lordo(1e-2, rank=2, sync_every=4, init_projection="random")
    >>> bases = lordo_jax.projections(tx.init(params))
    >>> bases["w"].shape, bases["b"]
    ((8, 2), None)
  """
  is_node = lambda x: isinstance(x, low_rank_lib.LowRankAdamState)  # noqa: E731
  leaves = jax.tree.leaves(tree_structure.values(state), is_leaf=is_node)
  nodes = [x for x in leaves if is_node(x)]
  if not nodes:
    raise ValueError("projections: this state holds no low-rank matrices.")

  def matrix(m):
    if isinstance(m, optax.MaskedNode):
      return None
    if isinstance(m.basis, projection_lib.DCTBasis):
      columns = lambda i: projection_lib.dct_columns(i, m.basis.size)  # noqa: E731
      for _ in range(m.basis.indices.ndim - 1):
        columns = jax.vmap(columns)
      indices = m.basis.indices
      if sharded.is_sharded(indices):  # Stacked over an Explicit worker axis: read whole.
        whole = NamedSharding(jax.typeof(indices).sharding.mesh, PartitionSpec())
        indices = jax.sharding.reshard(indices, whole)
      return columns(indices)
    return m.basis

  is_entry = lambda x: isinstance(x, (low_rank_lib.LowRankMoments, optax.MaskedNode))  # noqa: E731
  bases = jax.tree.map(matrix, nodes[0].moments.matrices(), is_leaf=is_entry)
  return tree_structure.unwrapped(bases)  # Plain values, not the params' wrappers.


def _tree_bytes(tree: Any) -> int:
  """Bytes of every array leaf of ``tree`` (arrays or ``jax.ShapeDtypeStruct``)."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    shape = getattr(leaf, "shape", np.shape(leaf))
    dtype = leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype
    total += math.prod(shape) * np.dtype(dtype).itemsize
  return total


def state_bytes(state: Any) -> dict[str, int]:
  r"""Bytes of optimizer state: where they are, and what host offload would move.

  ``"device"`` and ``"host"`` split the state by where its arrays are placed: an array
  whose sharding's memory kind is ``pinned_host`` (or ``unpinned_host``) counts as
  host, every other as device, so that on the state of ``offload=True``
  ``"host"`` is what really lives in host memory. Shapes
  without a placement (``jax.eval_shape(tx.init, params)``, which allocates nothing)
  count as device.

  ``"offloadable"`` is the part of the state that ``offload=True`` keeps in host
  memory, wherever it is now: for every :func:`lordo_jax.synchronize` in the state,
  its anchor (the parameters at the last sync), its outer optimizer's state (DiLoCo's
  outer momentum) and, with compression, its error-feedback residual, all read and
  written only at a sync, once every K steps (MATH.md §8); with ``overlap``, the
  message in flight and its means, read and written one chunk a step. Everything else
  (moments, bases, error buffers, counters, flags, ledgers) is used at every step.

  Per ``p x q`` float32 matrix, left case (``p >= q``), MATH.md §8: AdamW ``2pq``;
  LoRDO ``pr + 2rq`` used every step (``+ pq`` with error feedback, in its dtype) and
  an offloadable ``pq``; with ``projection="dct"`` the basis is ``r`` int32 indices
  instead of ``pr`` floats. Counters and ledgers add a few bytes per transformation.

  It counts the state it is given, whole arrays: pass one worker's state (a state
  stacked over M workers counts M times). Per-device bytes of a sharded state are the
  sizes of its ``addressable_shards``.

  Args:
    state: an optimizer state (an ``nnx.Optimizer``'s ``opt_state`` as it is), or its
      shapes.

  Returns:
    ``{"device": int, "host": int, "offloadable": int}``, in bytes; ``device + host``
    is the whole state.

  Examples:
    >>> import jax, jax.numpy as jnp, lordo_jax
    >>> params = {"w": jnp.ones((64, 32))}
    >>> tx = lordo_jax.lordo(1e-3, rank=4, sync_every=8, offload=True)
    >>> sizes = lordo_jax.state_bytes(tx.init(params))
    >>> sizes["host"], sizes["offloadable"]  # the anchor, in host memory
    (8192, 8192)
    >>> lordo_jax.state_bytes(jax.eval_shape(tx.init, params))["host"]  # no placement
    0
  """
  state = tree_structure.values(state)
  is_sync = lambda x: isinstance(x, sync_lib.SynchronizeState)  # noqa: E731
  offloadable = 0
  for node in jax.tree.leaves(state, is_leaf=is_sync):
    if is_sync(node):
      offloadable += state_bytes(node.inner_state)["offloadable"]
      kept = (node.anchor, node.outer_state, node.residual, node.in_flight)
      offloadable += _tree_bytes(kept)
  host = _tree_bytes([x for x in jax.tree.leaves(state) if offload_lib.on_host(x)])
  return {"device": _tree_bytes(state) - host, "host": host, "offloadable": offloadable}
