"""Checkpoints of the parameters and the whole optimizer state, with orbax.

:func:`save` and :func:`restore` write and read ``(params, opt_state)`` at a step, and
a resumed run is bit-identical to one that never stopped; :class:`Checkpointer` keeps
a directory of steps and saves in the background. A checkpoint that does not fit the
trees it is restored into raises :class:`CheckpointMismatchError`. Usage::

  checkpoint.save(directory, step, params, opt_state)
  params, opt_state = checkpoint.restore(directory, step, params, tx.init(params))
"""

import os
from collections.abc import Iterator
from typing import Any
from typing import Protocol
from typing import runtime_checkable

import jax
import numpy as np
import orbax.checkpoint as ocp

FORMAT = "lordo_jax.checkpoint/1"
ITEMS = ("params", "opt_state")
_LAYOUT = "layout"
_SHOWN = 8  # Mismatching leaves named per kind in an error message.


class CheckpointMismatchError(ValueError):
  """A checkpoint does not fit the trees it is restored into."""


def _entry_name(entry) -> str:
  """One key-path entry as a string: an attribute, dict key or sequence index."""
  for field in ("name", "key", "idx"):
    if hasattr(entry, field):
      return str(getattr(entry, field))
  return str(entry)


def _describe(tree: Any) -> list[dict]:
  """Key path, shape and dtype of every leaf of ``tree``, in flattening order."""
  layout = []
  for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):  # Python or NumPy scalars
      leaf = np.asarray(leaf)
    layout.append(
      {
        "path": jax.tree_util.keystr(path),
        "keys": [_entry_name(entry) for entry in path],
        "shape": [int(n) for n in leaf.shape],
        "dtype": np.dtype(leaf.dtype).name,
      }
    )
  return layout


def _nest(layout: list[dict], values: list) -> dict:
  """The non-empty leaves as a nested dict keyed by their key-path entries."""
  nested: dict = {}
  for leaf, value in zip(layout, values, strict=True):
    if 0 in leaf["shape"]:
      continue
    node = nested
    *parents, last = leaf["keys"] or ["<root>"]
    for key in parents:
      node = node.setdefault(key, {})
      if not isinstance(node, dict):
        raise ValueError(f"checkpoint: leaf {leaf['path']} is inside another leaf.")
    if last in node:
      raise ValueError(f"checkpoint: two leaves are both named {leaf['path']} once stringified.")
    node[last] = value
  return nested


def _lookup(nested: dict, leaf: dict):
  node = nested
  for key in leaf["keys"] or ["<root>"]:
    node = node[key]
  return node


def _for_saving(value):
  return value if isinstance(value, jax.Array) else np.asarray(value)


def _normalised(leaf: dict) -> str:
  """A leaf's key path with attributes, dict keys and indices spelled alike.

  ``nnx.Optimizer`` holds a moment as a NamedTuple before its first update and as a
  dict after it (``...value.basis`` against ``...value['basis']``): the same leaf.
  Two leaves that differ only in that spelling are the same leaf; :func:`_nest`
  already refuses, at save time, two leaves whose entries stringify alike.
  """
  return "/".join(leaf["keys"])


def _sharding(like):
  """A concrete sharding for restoring into ``like``.

  A target from ``jax.eval_shape`` may carry a ``NamedSharding`` over an
  ``AbstractMesh`` (axis names and sizes, no devices); it is resolved against this
  process's devices with ``jax.make_mesh`` (same axis names, sizes and types). A leaf
  with no sharding is restored onto the first local device.
  """
  sharding = getattr(like, "sharding", None)
  if sharding is None:
    return jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  mesh = getattr(sharding, "mesh", None)
  if isinstance(mesh, jax.sharding.AbstractMesh):
    concrete = jax.make_mesh(mesh.axis_sizes, mesh.axis_names, axis_types=mesh.axis_types)
    return jax.sharding.NamedSharding(concrete, sharding.spec)
  return sharding


def _zeros(like, leaf: dict):
  """A zero-size leaf like ``like``: there is nothing to read back."""
  shape, dtype = tuple(leaf["shape"]), np.dtype(leaf["dtype"])
  if isinstance(like, (jax.Array, jax.ShapeDtypeStruct)):
    sharding = _sharding(like)
    return jax.make_array_from_callback(
      shape, sharding, lambda index: np.zeros(shape, dtype)[index]
    )
  return np.zeros(shape, dtype)


def _by_saved_key(leaves: list[dict], like: Any) -> dict:
  """The target's leaves keyed by normalised path (see :func:`_normalised`)."""
  return {
    _normalised(leaf): x for leaf, x in zip(_describe(like), jax.tree.leaves(like), strict=True)
  }


def _listing(header: str, lines: list[str]) -> Iterator[str]:
  if lines:
    yield f"  {len(lines)} {header}:"
    yield from (f"    {line}" for line in lines[:_SHOWN])
    if len(lines) > _SHOWN:
      yield f"    ... and {len(lines) - _SHOWN} more"


def _without_empty_extras(saved: list[dict], like: Any) -> list[dict]:
  """The saved leaves less those with no elements that ``like`` does not have: nothing
  of them was written, and nothing is lost without them (a state saved when the error
  buffer of a matrix without error feedback was a ``(0,)`` array restores into today's,
  where it is ``()``)."""
  target = {_normalised(leaf) for leaf in _describe(like)}
  return [leaf for leaf in saved if _normalised(leaf) in target or 0 not in leaf["shape"]]


@runtime_checkable
class _StoredPerGroup(Protocol):
  """A state node stored in groups that checkpoints before it held per matrix (the
  low-rank state, ``LowRankAdamState.moments``): a checkpoint of that older layout
  restores into it through its per-matrix view."""

  def matrices(self) -> Any:
    """The node's state per matrix: a tree, as older checkpoints hold it."""
    ...

  def with_matrices(self, tree: Any) -> Any:
    """The node holding the per-matrix state ``tree``."""
    ...


def _is_grouped(x) -> bool:
  return isinstance(x, _StoredPerGroup)


def _per_matrix(like: Any) -> Any:
  """``like`` with every ``_StoredPerGroup`` node in its per-matrix view."""
  return jax.tree.map(lambda x: x.matrices() if _is_grouped(x) else x, like, is_leaf=_is_grouped)


def _regrouped(like: Any, restored: Any) -> Any:
  """Inverse of :func:`_per_matrix`: ``restored`` (in ``like``'s per-matrix view) in
  ``like``'s structure."""
  return jax.tree.map(
    lambda x, r: x.with_matrices(r) if _is_grouped(x) else r, like, restored, is_leaf=_is_grouped
  )


def _fits(saved: list[dict], like: Any) -> bool:
  try:
    check_layout(saved, like, item="", where="")
  except CheckpointMismatchError:
    return False
  return True


def _older_layout(saved: list[dict], like: Any) -> bool:
  """Whether ``saved`` is the layout of ``like`` before its low-rank state was stored
  per group (``_StoredPerGroup``): per matrix."""
  grouped = jax.tree.leaves(like, is_leaf=_is_grouped)
  if not any(map(_is_grouped, grouped)) or _fits(saved, like):
    return False
  return _fits(saved, _per_matrix(like))


def check_layout(
  saved: list[dict], like: Any, *, item: str, where: str, saved_type: str | None = None
) -> None:
  """Raises :class:`CheckpointMismatchError` unless ``like`` has the saved layout.

  Args:
    saved: the layout recorded at save time (key path, shape, dtype per leaf).
    like: the tree to restore into.
    item: ``"params"`` or ``"opt_state"``, for the message.
    where: the checkpoint's directory and step, for the message.
    saved_type: the type name of the saved tree's root, for the message.

  Raises:
    CheckpointMismatchError: a leaf missing, extra, or of another shape or dtype; the
      message names the first ones and the likely cause, in one screen.

  Examples:
    A layout as :func:`save` records it, checked against a tree of another shape:

    >>> import jax.numpy as jnp
    >>> from lordo_jax import checkpoint
    >>> saved = [{"path": "['w']", "keys": ["w"], "shape": [4, 2], "dtype": "float32"}]
    >>> checkpoint.check_layout(saved, {"w": jnp.ones((4, 2))}, item="params", where="here")
    >>> try:
    ...   checkpoint.check_layout(saved, {"w": jnp.ones((4, 3))}, item="params", where="here")
    ... except checkpoint.CheckpointMismatchError:
    ...   print("refused")
    refused
  """
  target = {_normalised(leaf): leaf for leaf in _describe(like)}
  stored = {_normalised(leaf): leaf for leaf in _without_empty_extras(saved, like)}
  missing = [leaf["path"] for key, leaf in stored.items() if key not in target]
  extra = [leaf["path"] for key, leaf in target.items() if key not in stored]
  differing = []
  for key, leaf in stored.items():
    if key not in target:
      continue
    want = target[key]
    if leaf["shape"] != want["shape"] or leaf["dtype"] != want["dtype"]:
      differing.append(
        f"{leaf['path']}: {leaf['dtype']}{tuple(leaf['shape'])} in the checkpoint, "
        f"{want['dtype']}{tuple(want['shape'])} in the target"
      )
  if not (missing or extra or differing):
    return
  lines = [
    f"checkpoint {where}: its {item} do not match the {item} to restore into, which were "
    "built differently (another method, rank, side, projection, number of workers, "
    "error feedback, model, ...)."
  ]
  if saved_type is not None and saved_type != type(like).__name__:
    lines.append(f"  the checkpoint holds a {saved_type}, the target is a {type(like).__name__}")
  lines += _listing("leaves in the checkpoint but not in the target (another method?)", missing)
  lines += _listing("leaves in the target but not in the checkpoint (another method?)", extra)
  lines += _listing("leaves with another shape or dtype (another rank?)", differing)
  raise CheckpointMismatchError("\n".join(lines))


class Checkpointer:
  """Saves and restores ``(params, opt_state)`` at numbered steps under a directory.

  A thin layer over ``orbax.checkpoint.CheckpointManager``: one orbax item per tree
  (``params``, ``opt_state``) plus a JSON ``layout`` item, and a check of that layout
  before every restore. With ``async_save=True`` (the default) :meth:`save` returns
  once the arrays are copied off the accelerator and writes in the background;
  :meth:`wait` (or :meth:`close`, or leaving a ``with`` block) waits for it. Every
  process of a multi-process run must call :meth:`save` and :meth:`restore` with the
  same arguments; each writes and reads its own shards.

  Args:
    directory: where the step directories go (created if missing).
    max_to_keep: keep only this many latest checkpoints; ``None`` keeps all.
    async_save: write in the background.

  Examples:
    >>> import tempfile, jax.numpy as jnp, optax
    >>> from lordo_jax import checkpoint
    >>> params = {"w": jnp.ones((4, 4))}
    >>> tx = optax.adamw(1e-3)
    >>> with checkpoint.Checkpointer(tempfile.mkdtemp()) as ckpt:
    ...   ckpt.save(10, params, tx.init(params))
    ...   ckpt.wait()
    ...   params, state = ckpt.restore(ckpt.latest_step(), params, tx.init(params))
  """

  def __init__(self, directory, *, max_to_keep: int | None = None, async_save: bool = True):
    self.directory = os.fspath(directory)
    options = ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep, enable_async_checkpointing=async_save, create=True
    )
    self._manager = ocp.CheckpointManager(
      self.directory, options=options, item_names=(*ITEMS, _LAYOUT)
    )

  def save(self, step: int, params: Any, opt_state: Any, *, metadata: dict | None = None):
    """Saves ``params`` and ``opt_state`` (any pytrees of arrays) as step ``step``.

    ``metadata`` (JSON-serialisable) is stored with the layout; read it back with
    :meth:`metadata`.
    """
    trees = {"params": params, "opt_state": opt_state}
    layout = {
      "format": FORMAT,
      "step": int(step),
      "jax_version": jax.__version__,
      "process_count": jax.process_count(),
      "metadata": metadata or {},
    }
    args = {}
    for item, tree in trees.items():
      leaves = _describe(tree)
      layout[item] = {
        "leaves": leaves,
        "type": type(tree).__name__,
        "treedef": str(jax.tree.structure(tree)),
      }
      nested = _nest(leaves, [_for_saving(x) for x in jax.tree.leaves(tree)])
      layout[item]["written"] = bool(nested)
      if nested:
        args[item] = ocp.args.StandardSave(nested)
    args[_LAYOUT] = ocp.args.JsonSave(layout)
    self._manager.save(int(step), args=ocp.args.Composite(**args))

  def layout(self, step: int) -> dict:
    """What :meth:`save` recorded about step ``step``: leaves, versions, metadata."""
    if step not in self._manager.all_steps():
      raise FileNotFoundError(
        f"No checkpoint for step {step} in {self.directory}; steps there: "
        f"{sorted(self._manager.all_steps())}."
      )
    restored = self._manager.restore(step, args=ocp.args.Composite(layout=ocp.args.JsonRestore()))
    layout = restored[_LAYOUT]
    if not isinstance(layout, dict) or layout.get("format") != FORMAT:
      raise CheckpointMismatchError(
        f"Step {step} in {self.directory} was not written by lordo_jax.checkpoint "
        f"(format {FORMAT!r})."
      )
    return layout

  def metadata(self, step: int) -> dict:
    """The ``metadata`` passed to :meth:`save` for step ``step``."""
    return self.layout(step)["metadata"]

  def restore(self, step: int, params_like: Any, opt_state_like: Any) -> tuple[Any, Any]:
    """The ``(params, opt_state)`` of step ``step``, shaped and sharded like the targets.

    Args:
      step: which checkpoint.
      params_like: a tree like the saved params (arrays or ``jax.ShapeDtypeStruct``
        with a sharding); only its structure, shapes, dtypes and shardings are used.
      opt_state_like: the same for the optimizer state, typically ``tx.init(params)``
        of a freshly built optimizer (stacked and sharded like the training loop's).

    Returns:
      The restored trees, with the tree structure of the targets (so static fields
      such as :class:`lordo_jax.DCTBasis`'s size come from the target).

    Raises:
      CheckpointMismatchError: the checkpoint's leaves (key paths, shapes, dtypes)
        are not the targets'; the message names the leaves that differ.
      FileNotFoundError: no checkpoint for ``step``.
    """
    self.wait()
    layout = self.layout(step)
    where = f"{self.directory} (step {step})"
    older = _older_layout(layout["opt_state"]["leaves"], opt_state_like)
    if older:  # Saved per matrix: read into the per-matrix view, then regroup.
      opt_state_like, grouped_like = _per_matrix(opt_state_like), opt_state_like
    likes = {"params": params_like, "opt_state": opt_state_like}
    for item, like in likes.items():
      saved = layout[item]
      check_layout(saved["leaves"], like, item=item, where=where, saved_type=saved.get("type"))

    args = {}
    for item, like in likes.items():
      leaves = _without_empty_extras(layout[item]["leaves"], like)
      by_key = _by_saved_key(leaves, like)
      targets = [
        jax.ShapeDtypeStruct(
          tuple(leaf["shape"]),
          np.dtype(leaf["dtype"]),
          sharding=_sharding(by_key[_normalised(leaf)]),
        )
        for leaf in leaves
      ]
      nested = _nest(leaves, targets)
      if nested:
        args[item] = ocp.args.StandardRestore(nested)
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(**args)) if args else {}
    # orbax's refusals of a target (not I/O errors), under many frames: in one line.
    except (ValueError, TypeError, NotImplementedError) as error:
      raise CheckpointMismatchError(
        f"checkpoint {where}: orbax could not read it into the targets' shardings "
        f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}). "
        "Give targets whose shardings name this process's devices (or no sharding)."
      ) from None

    out = []
    for item, like in likes.items():
      leaves = {_normalised(leaf): leaf for leaf in layout[item]["leaves"]}
      values = []
      for target, x in zip(_describe(like), jax.tree.leaves(like), strict=True):
        leaf = leaves[_normalised(target)]
        if 0 in leaf["shape"]:
          values.append(_zeros(x, leaf))
          continue
        value = _lookup(restored[item], leaf)
        values.append(
          value if isinstance(x, (jax.Array, jax.ShapeDtypeStruct)) else np.asarray(value)
        )
      out.append(jax.tree.unflatten(jax.tree.structure(like), values))
    if older:
      out[1] = _regrouped(grouped_like, out[1])
    return out[0], out[1]

  def latest_step(self) -> int | None:
    """The newest saved step, or ``None``."""
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    """Every saved step, ascending."""
    return sorted(self._manager.all_steps())

  def wait(self) -> None:
    """Blocks until every background save has been written and committed."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    """Waits for background saves and releases orbax's resources."""
    self._manager.close()

  def __enter__(self) -> "Checkpointer":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def save(directory, step: int, params: Any, opt_state: Any, *, metadata: dict | None = None):
  """Saves ``params`` and ``opt_state`` as step ``step`` under ``directory``; blocks.

  A LoRDO state is more than its moments: the anchor, every basis (or the DCT
  frequencies), the error buffers, the outer optimizer's state, the communication
  ledger and the step counters. A restart must bring all of it back, at any step,
  including in the middle of a round, or the run after the restart is not the run
  before it; so ``params`` and ``opt_state`` are saved as they are, whole.

  Storage is orbax's (atomic, optionally asynchronous with :class:`Checkpointer`,
  every process writing its own shards of a sharded array). Each tree is saved as a
  nested dict whose keys are the entries of its leaves' key paths, next to a JSON
  ``layout`` item: every leaf's key path, shape and dtype, which :func:`restore`
  checks before reading anything. Leaves with no elements are recorded in the layout
  but not written (orbax refuses zero-size arrays); one that the target lacks is
  skipped on restore (before this version, the error buffer of a matrix without error
  feedback was such a ``(0,)`` leaf; it is ``()`` now). :class:`Checkpointer` does the
  same without blocking.

  Args:
    directory: where the step directories go (created if missing).
    step: the step number to save as.
    params: the parameters, any pytree of arrays.
    opt_state: the optimizer state, any pytree of arrays.
    metadata: JSON-serialisable, stored with the layout; read it back with
      :meth:`Checkpointer.metadata`.

  Examples:
    >>> import tempfile, jax.numpy as jnp, lordo_jax
    >>> from lordo_jax import checkpoint
    >>> params = {"w": jnp.ones((16, 8)), "b": jnp.zeros(8)}
    >>> tx = lordo_jax.lordo(1e-2, rank=2, sync_every=4)
    >>> directory = tempfile.mkdtemp()
    >>> checkpoint.save(directory, 0, params, tx.init(params))
    >>> params, state = checkpoint.restore(directory, 0, params, tx.init(params))
  """
  with Checkpointer(directory, async_save=False) as checkpointer:
    checkpointer.save(step, params, opt_state, metadata=metadata)


def restore(directory, step: int | None, params_like: Any, opt_state_like: Any):
  """``(params, opt_state)`` of step ``step`` (``None``: the latest) under ``directory``.

  The saved trees are restored into the trees a freshly built optimizer gives
  (``tx.init(params)``, stacked over workers if the loop stacks them): the resumed
  run is bit-identical to one that never stopped. The checkpoint's ``layout`` (every
  leaf's key path, shape and dtype, written by :func:`save`) is compared with the
  targets first, so a checkpoint from an optimizer built differently (another rank,
  another method, another number of workers) fails with
  :class:`CheckpointMismatchError` naming the leaves that differ, before anything is
  read. Leaves are matched by key path with attributes, dict keys and indices spelled
  alike, so a NamedTuple saved as a dict (``nnx.Optimizer`` after its first update)
  restores into the NamedTuple a fresh one holds, and the reverse. The targets may be
  arrays, or ``jax.ShapeDtypeStruct`` (``jax.eval_shape``) with or without a sharding;
  a ``NamedSharding`` over an ``AbstractMesh`` is resolved against this process's
  devices with ``jax.make_mesh``. Restored arrays take the sharding of the targets'
  leaves; leaves with no elements, which are not written, come back as zeros of the
  target's sharding. Orbax's refusal of a target while reading (a ``ValueError``,
  ``TypeError`` or ``NotImplementedError``) is raised again as a one-line
  :class:`CheckpointMismatchError`; an I/O error is raised as it is. A checkpoint saved
  when the low-rank state was stored per matrix (before it was stored per shape group,
  ``_StoredPerGroup``) restores into today's state: it is read into the state's
  per-matrix view and stacked again.

  Args:
    directory: the folder :func:`save` wrote to (a path or a string).
    step: the step to restore; ``None``: the latest saved (:func:`latest_step`).
    params_like: a tree like the saved parameters: arrays, or ``jax.ShapeDtypeStruct``
      with or without a sharding; the restored arrays take its shardings.
    opt_state_like: the same for the optimizer state (``tx.init(params)``, or an
      ``nnx.Optimizer``'s ``nnx.state``, fresh or updated).

  Returns:
    ``(params, opt_state)`` shaped, typed and placed like the targets.

  Raises:
    CheckpointMismatchError: the saved leaves do not fit the targets (named, with the
      likely cause).
    FileNotFoundError: ``step=None`` and no checkpoint under ``directory``.

  Examples:
    As in :func:`save`; with ``step=None`` the latest step comes back:

    >>> import tempfile, jax.numpy as jnp, lordo_jax
    >>> from lordo_jax import checkpoint
    >>> params = {"w": jnp.ones((4, 2))}
    >>> directory = tempfile.mkdtemp()
    >>> for step in (3, 7):
    ...   checkpoint.save(directory, step, params, {"step": jnp.int32(step)})
    >>> int(checkpoint.restore(directory, None, params, {"step": jnp.int32(0)})[1]["step"])
    7
  """
  with Checkpointer(directory, async_save=False) as checkpointer:
    if step is None:
      step = checkpointer.latest_step()
      if step is None:
        raise FileNotFoundError(f"No checkpoint in {checkpointer.directory}.")
    return checkpointer.restore(step, params_like, opt_state_like)


def latest_step(directory) -> int | None:
  """The newest step saved under ``directory``, or ``None`` (creates nothing).

  Args:
    directory: the folder :func:`save` writes to; it need not exist.

  Returns:
    The largest step saved there, or ``None`` where none is (or the folder is missing).

  Examples:
    >>> import tempfile, jax.numpy as jnp
    >>> from lordo_jax import checkpoint
    >>> directory = tempfile.mkdtemp()
    >>> print(checkpoint.latest_step(directory))
    None
    >>> checkpoint.save(directory, 5, {"w": jnp.ones(2)}, {"count": jnp.int32(5)})
    >>> checkpoint.latest_step(directory)
    5
  """
  if not os.path.isdir(os.fspath(directory)):
    return None
  with Checkpointer(directory, async_save=False) as checkpointer:
    return checkpointer.latest_step()
