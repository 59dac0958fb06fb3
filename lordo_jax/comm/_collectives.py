r"""The one counted all-reduce: every message LoRDO sends goes through here.

A mean over the workers is only ever taken here, by :func:`counted_pmean`,
:func:`counted_mean_of_present` or :func:`counted_mean` (which can send it compressed),
each adding its payload to the caller's :class:`Ledger`: communication cannot happen
uncounted. :func:`ledger_total` reads a ledger's totals on the host.
"""

import sys
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from lordo_jax import _sharded as sharded
from lordo_jax.comm import _compression as compression_lib

_LIMB_BITS = 20
_LIMB = 1 << _LIMB_BITS


class Ledger(NamedTuple):
  r"""Communication sent by one transformation since ``init``, per worker.

  Each communicating transformation keeps a :class:`Ledger` in its state. A mean over
  the workers is only ever taken by :func:`counted_pmean`, which adds the payload of the
  all-reduce (elements and bytes per worker, before any algorithm's factor such as the
  ring all-reduce's :math:`2(M-1)/M`) to that ledger. Communication therefore cannot
  happen uncounted, and the count is exactly what the compiled program all-reduces.

  A mean can also be sent compressed (bfloat16 or int8 blocks,
  with error feedback). Counters are two int32 limbs (``low + high * 2**20``): exact up
  to :math:`2^{51}` elements without 64-bit JAX.
  """

  elements: jax.Array  # int32[2]: (low, high) limbs of the all-reduced elements.
  bytes: jax.Array  # int32[2]: (low, high) limbs of the all-reduced bytes.
  all_reduces: jax.Array  # int32 scalar: the number of all-reduce calls.


def init_ledger() -> Ledger:
  """An empty ledger."""
  return Ledger(
    elements=jnp.zeros([2], jnp.int32),
    bytes=jnp.zeros([2], jnp.int32),
    all_reduces=jnp.zeros([], jnp.int32),
  )


def _add_static(limbs: jax.Array, amount: int) -> jax.Array:
  """Adds a Python int to a (low, high) limb pair, with carry."""
  low = limbs[0] + (amount % _LIMB)
  high = limbs[1] + (amount // _LIMB) + (low >> _LIMB_BITS)
  return jnp.stack([low & (_LIMB - 1), high]).astype(jnp.int32)


def payload_size(tree: Any) -> tuple[int, int]:
  """The (elements, bytes) of one all-reduce of ``tree``, known at trace time."""
  leaves = jax.tree.leaves(tree)
  elements = sum(int(x.size) for x in leaves)
  nbytes = sum(int(x.size) * jnp.dtype(x.dtype).itemsize for x in leaves)
  return elements, nbytes


def record(ledger: Ledger, tree: Any) -> Ledger:
  """The ledger after one all-reduce of ``tree``."""
  elements, nbytes = payload_size(tree)
  return Ledger(
    elements=_add_static(ledger.elements, elements),
    bytes=_add_static(ledger.bytes, nbytes),
    all_reduces=ledger.all_reduces + 1,
  )


def check_axis_bound(axis_name: str | None, who: str) -> None:
  """Raises a clear error when ``axis_name`` is not bound by the caller.

  Call it at trace time, in ``update``. ``axis_name=None`` (one worker) is refused
  inside a ``jax.shard_map`` or ``jax.pmap`` whose manual axes hold more than one
  device: there each device is a worker that would never hear from the others. So is
  an ``update`` that ``optax.apply_if_finite`` may skip on one worker and not on the
  others: that worker would miss a collective the others wait in.
  """
  if axis_name is None:
    _check_no_worker_axis(who)
    return
  _check_not_skipped_per_worker(who)
  try:
    jax.lax.axis_index(axis_name)
  except NameError as error:
    raise ValueError(
      f"{who}: axis_name={axis_name!r} is not bound here. Call update() inside "
      f"jax.shard_map over a mesh with an axis named {axis_name!r}, or inside "
      f"jax.pmap(..., axis_name={axis_name!r}); or pass axis_name=None for a "
      "single worker."
    ) from error


def _check_no_worker_axis(who: str) -> None:
  """``axis_name=None`` inside ``shard_map``/``pmap`` over an axis of several devices:
  an error that names the axes (``vmap`` binds no manual axis and is accepted)."""
  mesh = jax.sharding.get_abstract_mesh()
  manual = [name for name in mesh.manual_axes if _axis_size(name) > 1]
  if manual:
    sizes = ", ".join(f"{name!r} ({_axis_size(name)} devices)" for name in manual)
    raise ValueError(
      f"{who}: axis_name=None, but update() runs inside jax.shard_map or jax.pmap over "
      f"{sizes}: each device would train alone and never synchronise. Pass the worker "
      f"axis: {_naming_hint(manual[0])}. axis_name=None is for one worker: "
      "call update() outside shard_map/pmap, or leave the model axes out of "
      "shard_map's axis_names."
    )


def _check_not_skipped_per_worker(who: str) -> None:
  """An error when this ``update`` is traced inside ``optax.apply_if_finite``.

  apply_if_finite skips the update on a worker whose gradient is not finite: that
  worker stays out of the collective the others enter (XLA then aborts the process),
  and its step count falls behind theirs, so later rounds no longer line up.
  """
  frame = sys._getframe(1)
  while frame is not None:
    code = frame.f_code
    if code.co_qualname.startswith("apply_if_finite.") and "optax" in code.co_filename:
      raise ValueError(
        f"{who} runs inside optax.apply_if_finite with a worker axis: a worker whose "
        "gradient is not finite would skip the update alone, miss the collectives the "
        "others wait in, and fall out of step with their rounds. Drop apply_if_finite "
        "and build the method with fault_tolerant=True (lordo, its ablations, "
        "diloco, local_adam, desloc, synchronize), which skips non-finite local steps "
        "and keeps every worker's rounds aligned; for a data-parallel method, check "
        "after the average: optax.chain(lordo_jax.average_gradients(axis_name), "
        "optax.apply_if_finite(optimizer, max_consecutive_errors))."
      )
    frame = frame.f_back


def _naming_hint(name) -> str:
  if isinstance(name, str) and not name.startswith("_internal"):
    return f"axis_name={name!r}"
  return "name it, jax.pmap(..., axis_name='workers'), and pass axis_name='workers'"


def _axis_size(name) -> int:
  try:
    return jax.lax.axis_size(name)
  except NameError:  # pmap's axis before it is named in the trace context
    return 1


def counted_pmean(tree: Any, ledger: Ledger, axis_name: str | None):
  r"""Mean of ``tree`` over the workers of ``axis_name``, counted in ``ledger``.

  .. math::
    \bar x = \frac{1}{M} \sum_{m=1}^{M} x_m

  With ``axis_name=None`` there is one worker: the mean is the identity and nothing is
  counted, since nothing is sent. Under ``jax.shard_map`` with ``check_vma=True`` the
  result is cast back to varying over ``axis_name``, so it can leave a ``lax.cond``
  branch whose other branch returns per-worker values; under ``jax.pmap`` the cast is
  a no-op.

  Args:
    tree: a pytree of arrays, the same structure on every worker.
    ledger: the caller's ledger.
    axis_name: the worker axis, or ``None``.

  Returns:
    ``(mean, ledger)``.

  Examples:
    One worker: the mean is the tree itself, and nothing is counted.

    >>> import jax.numpy as jnp, lordo_jax
    >>> empty = lordo_jax.Ledger(jnp.zeros(2, jnp.int32), jnp.zeros(2, jnp.int32), jnp.int32(0))
    >>> mean, ledger = lordo_jax.counted_pmean({"g": jnp.ones(3)}, empty, None)
    >>> mean["g"].tolist(), int(ledger.all_reduces)
    ([1.0, 1.0, 1.0], 0)

    Inside ``jax.shard_map`` over a ``"workers"`` axis, ``axis_name="workers"`` averages
    over the workers and adds the tree's elements and bytes to the ledger.
  """
  if axis_name is None or not jax.tree.leaves(tree):
    return tree, ledger
  mean = jax.lax.pmean(tree, axis_name)
  mean = jax.tree.map(lambda x: jax.lax.pcast(x, axis_name, to="varying"), mean)
  return mean, record(ledger, tree)


def ledger_total(ledger: Ledger) -> tuple[int, int]:
  """(elements, bytes) of one ledger, as exact Python ints (host side)."""
  elements, nbytes = jax.device_get((ledger.elements, ledger.bytes))
  return _limbs_value(elements), _limbs_value(nbytes)


def _limbs_value(limbs) -> int:
  """The integer a limb pair holds; for a stack of per-worker pairs, worker 0's."""
  low, high = np.asarray(limbs).reshape(-1, 2)[0]
  return int(low) + int(high) * _LIMB


def counted_mean_of_present(tree: Any, present: jax.Array, ledger: Ledger, axis_name):
  r"""Mean of ``tree`` over the workers with ``present`` true, in one counted message.

  .. math::
    \bar x = \frac{\sum_m w_m x_m}{\sum_m w_m}, \qquad w_m \in \{0, 1\}

  The payload is ``tree`` plus one float32 scalar (the presence weight); an absent
  worker's values never enter the sum, even when they are not finite. Where no worker
  is present the mean is zero and ``fraction`` is 0.

  Returns:
    ``(mean, fraction, ledger)``: ``fraction`` is the share of workers present.
  """
  weight = jnp.asarray(present, jnp.float32)
  masked = jax.tree.map(lambda x: jnp.where(present, x, jnp.zeros_like(x)), tree)
  (total, fraction), ledger = counted_pmean((masked, weight), ledger, axis_name)
  safe = jnp.maximum(fraction, jnp.finfo(jnp.float32).tiny)
  mean = jax.tree.map(
    lambda x: jnp.where(fraction > 0, x / safe.astype(x.dtype), jnp.zeros_like(x)), total
  )
  return mean, fraction, ledger


def _compressed_mean_leaf(x, residual, axis_name, num_workers, codec):
  """One leaf's compressed mean: ``(mean, new_residual, sent)``; see :func:`counted_mean`.

  A leaf split over ``Explicit`` mesh axes inside the worker (FSDP) is made whole
  there first (:func:`lordo_jax._sharded.whole`, over the group's fast links; the
  message between workers is the same), and the mean and residual are split back like
  ``x``.
  """
  if sharded.is_sharded(x):
    mean, new_residual, sent = _compressed_mean_leaf(
      sharded.whole(x), None if residual is None else sharded.whole(residual), axis_name,
      num_workers, codec,
    )  # fmt: skip
    split_back = lambda a: None if a is None else sharded.like(a, x)  # noqa: E731
    return split_back(mean), split_back(new_residual), sent
  target = x.astype(jnp.float32) if residual is None else x.astype(jnp.float32) + residual
  rows, row_layout = compression_lib.as_rows(target, num_workers)
  shard_rows = rows.shape[0] // num_workers
  values, scales = compression_lib.encode(rows, codec)
  own_error = rows - compression_lib.decode(values, scales)

  def split(a):
    return None if a is None else a.reshape(num_workers, shard_rows, *a.shape[1:])

  def scatter(a):
    return None if a is None else jax.lax.all_to_all(split(a), axis_name, 0, 0)

  received_values = scatter(values)
  if scales is not None:  # After the values: one collective at a time (see counted_mean).
    scales, received_values = jax.lax.optimization_barrier((scales, received_values))
  received = compression_lib.decode(received_values, scatter(scales))
  shard = jnp.mean(received, axis=0)
  shard_values, shard_scales = compression_lib.encode(shard, codec)
  shard_error = shard - compression_lib.decode(shard_values, shard_scales)

  def gather(a):
    return None if a is None else jax.lax.all_gather(a, axis_name)

  gathered_values = gather(shard_values)
  if shard_scales is not None:
    shard_scales, gathered_values = jax.lax.optimization_barrier((shard_scales, gathered_values))
  mean_rows = compression_lib.decode(gathered_values, gather(shard_scales))
  mean = compression_lib.from_rows(mean_rows.reshape(rows.shape), row_layout).astype(x.dtype)
  sent = tuple(a for a in (values, scales) if a is not None)
  if residual is None:
    return mean, None, sent
  # The shard this worker reduced was rounded once more before the all-gather; its
  # owner feeds that error back, M times over, so that the next mean carries it.
  owner = jax.nn.one_hot(jax.lax.axis_index(axis_name), num_workers, dtype=jnp.float32)
  error = split(own_error) + num_workers * owner[:, None, None] * shard_error[None]
  return mean, compression_lib.from_rows(error.reshape(rows.shape), row_layout), sent


def counted_mean(
  tree: Any,
  ledger: Ledger,
  axis_name: str | None,
  *,
  compression_codec: str | None = None,
  residual: Any = None,
):
  r"""Mean of ``tree`` over the workers, sent as it is or compressed; counted.

  Without ``compression_codec`` this is :func:`counted_pmean`. With ``"bfloat16"`` or
  ``"int8"`` (:mod:`lordo_jax.comm._compression`) every leaf, seen as an ``R x C`` block of
  rows split into one shard per worker, is averaged in two collectives, as a
  bandwidth-optimal all-reduce is:

  1. reduce-scatter: each worker encodes its block and sends shard j to worker j
     (``all_to_all``); worker j decodes the M shards it received and averages them in
     float32;
  2. all-gather: worker j encodes its averaged shard and sends it to every worker
     (``all_gather``); all decode the same M shards, so they hold the same mean.

  The collectives run one at a time, leaf after leaf (a data dependency orders
  them): on simulated CPU devices (jax 0.12) many independent collectives in flight
  at once deadlocked XLA's rendezvous.

  Per worker that moves :math:`2 (M - 1) / M` times the encoded block, as a ring
  all-reduce of it would: the ledger counts the encoded block (values, and the
  int8 row scales) as one all-reduce payload, padding included.

  Error feedback (``residual``, a float32 tree like ``tree``, per worker): the
  worker sends :math:`x + e` instead of x and keeps what the encoding lost,
  :math:`e' = (x + e) - \mathrm{dec}(\mathrm{enc}(x + e))`; the owner of a shard also
  keeps M times what re-encoding the averaged shard lost. Then, over any number of
  calls, :math:`\sum_t \bar y_t + \mathrm{mean}_m e_{m,T} = \sum_t \mathrm{mean}_m
  x_{m,t}` (to float rounding; :math:`\bar y_t` the means returned): nothing sent is
  lost, only delayed. With ``residual=None`` the rounding is not fed back.

  Args:
    tree: a pytree of arrays, the same structure on every worker.
    ledger: the caller's ledger.
    axis_name: the worker axis, or ``None`` (one worker: nothing is sent, nothing
      rounded).
    compression_codec: ``None``, ``"bfloat16"`` or ``"int8"``.
    residual: the error-feedback tree, or ``None``.

  Returns:
    ``(mean, ledger, residual)``.
  """
  if compression_codec is None:
    mean, ledger = counted_pmean(tree, ledger, axis_name)
    return mean, ledger, residual
  if axis_name is None or not jax.tree.leaves(tree):
    return tree, ledger, residual
  num_workers = jax.lax.axis_size(axis_name)
  leaves, treedef = jax.tree.flatten(tree)
  residuals = [None] * len(leaves) if residual is None else treedef.flatten_up_to(residual)
  results = []
  for x, e in zip(leaves, residuals, strict=True):
    if results:  # Each leaf's collectives after the previous leaf's: see above.
      x, _ = jax.lax.optimization_barrier((x, results[-1][0]))
    results.append(_compressed_mean_leaf(x, e, axis_name, num_workers, compression_codec))
  mean = treedef.unflatten([r[0] for r in results])
  if residual is not None:
    residual = treedef.unflatten([r[1] for r in results])
  return mean, record(ledger, [r[2] for r in results]), residual
