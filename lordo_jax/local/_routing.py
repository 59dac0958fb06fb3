"""Which leaves are low-rank matrices, and how a leaf is seen as a matrix.

:func:`route` gives each leaf its :class:`MatrixAxes` (low-rank) or ``FULL_RANK``, by
MATH.md §2's default or by ``low_rank_labels`` (its docstring has the rules);
:func:`partition_labels` makes the label function of ``optax.partition``, and
:func:`to_matrix` and :func:`from_matrix` turn a leaf into its matrix and back.
"""

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import optax
from optax import contrib

LOW_RANK = "low_rank"
FULL_RANK = "full_rank"


def _as_tuple(axes: int | tuple[int, ...], ndim: int) -> tuple[int, ...]:
  return tuple(a % ndim for a in ((axes,) if isinstance(axes, int) else axes))


@dataclasses.dataclass(frozen=True)
class MatrixAxes:
  """The axes of a leaf that form the rows (p) and the columns (q) of its matrix, and
  the axes (``batch``) that index a stack of such matrices.

  A scanned model's kernel ``(layers, p, q)`` is ``MatrixAxes(batch=0, rows=1, cols=2)``:
  each layer's ``p x q`` matrix has its own basis and moments (stored stacked along the
  same axis), and the stack is projected, stepped and refreshed in batched computations,
  as ``optax.contrib.muon`` vmaps such axes.
  """

  rows: int | tuple[int, ...] = 0  #: The axis (or axes) of the rows, p.
  cols: int | tuple[int, ...] = 1  #: The axis (or axes) of the columns, q.
  batch: int | tuple[int, ...] = ()  #: The axes of a stack of matrices (none by default).

  def normalized(self, ndim: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(rows, cols) as tuples of non-negative axes."""
    return _as_tuple(self.rows, ndim), _as_tuple(self.cols, ndim)

  def batch_axes(self, ndim: int) -> tuple[int, ...]:
    """The batch axes as a tuple of non-negative axes."""
    return _as_tuple(self.batch, ndim)


def _as_axes(label: Any) -> MatrixAxes | None:
  if isinstance(label, MatrixAxes):
    return label
  if isinstance(label, contrib.GaLoreDimensionNumbers):
    return MatrixAxes(label.reduction_axis, label.output_axis)
  return None


def matrix_shape(shape: tuple[int, ...], axes: MatrixAxes) -> tuple[int, int]:
  """(p, q) of each matrix of a leaf of ``shape`` seen through ``axes``."""
  rows, cols = axes.normalized(len(shape))
  return math.prod(shape[a] for a in rows), math.prod(shape[a] for a in cols)


def batch_shape(shape: tuple[int, ...], axes: MatrixAxes) -> tuple[int, ...]:
  """The shape of the stack of matrices of a leaf of ``shape`` (``()``: one matrix)."""
  return tuple(shape[a] for a in axes.batch_axes(len(shape)))


def _order(ndim: int, axes: MatrixAxes) -> tuple[int, ...]:
  rows, cols = axes.normalized(ndim)
  return axes.batch_axes(ndim) + rows + cols


def to_matrix(x: jax.Array, axes: MatrixAxes) -> jax.Array:
  """The ``(*batch, p, q)`` matrix view of ``x`` (``p x q`` without batch axes)."""
  order = _order(x.ndim, axes)
  if order == tuple(range(x.ndim)) and x.ndim - len(axes.batch_axes(x.ndim)) == 2:
    return x  # Already a matrix, or a stack of them: no copy.
  new_shape = batch_shape(x.shape, axes) + matrix_shape(x.shape, axes)
  return x.transpose(order).reshape(new_shape)


def from_matrix(m: jax.Array, axes: MatrixAxes, shape: tuple[int, ...]) -> jax.Array:
  """Inverse of :func:`to_matrix` for a leaf of ``shape``."""
  order = _order(len(shape), axes)
  if order == tuple(range(len(shape))) and m.shape == shape:
    return m
  inverse = tuple(order.index(a) for a in range(len(shape)))
  return m.reshape(tuple(shape[a] for a in order)).transpose(inverse)


def _check_axes(where: str, shape: tuple[int, ...], axes: MatrixAxes, rank: int):
  rows, cols = axes.normalized(len(shape))
  batch = axes.batch_axes(len(shape))
  named = batch + rows + cols
  if (
    not rows or not cols or len(set(named)) < len(named) or sorted(named) != list(range(len(shape)))
  ):
    raise ValueError(
      f"low_rank_labels at {where}: {axes} must split the {len(shape)} axes of "
      f"shape {shape} into disjoint batch, rows and cols that cover every axis "
      "(rows and cols at least one axis each)."
    )
  p, q = matrix_shape(shape, axes)
  if min(p, q) <= rank:
    raise ValueError(
      f"low_rank_labels marks {where} (shape {shape}, matrix {p} x {q}) as "
      f"low-rank, but rank={rank} is not smaller than min(p, q)={min(p, q)}. "
      "Lower the rank, or label this leaf False to give it the full-rank path."
    )


def _default_axes(x: jax.Array, rank: int) -> MatrixAxes | str:
  if x.ndim == 2 and min(x.shape) > rank:
    return MatrixAxes()
  return FULL_RANK


def _labelled_axes(path, x, label, rank: int) -> MatrixAxes | str:
  where = jax.tree_util.keystr(path) or "the root"
  axes = _as_axes(label)
  if axes is None and label is True:
    if x.ndim != 2:
      raise ValueError(
        f"low_rank_labels marks {where} (shape {x.shape}) True, but only 2-D "
        "leaves can be low-rank as they are. Give a MatrixAxes(rows=..., "
        "cols=...) label to say which axes form the matrix."
      )
    axes = MatrixAxes()
  if axes is None:
    if label is False:
      return FULL_RANK
    raise ValueError(
      f"low_rank_labels at {where} is {label!r}; expected True, False or a MatrixAxes."
    )
  _check_axes(where, x.shape, axes, rank)
  return axes


def route(tree: Any, labels: Any, rank: int) -> Any:
  """For each leaf of ``tree``: its :class:`MatrixAxes` if low-rank, else FULL_RANK.

  By default (``labels`` None, MATH.md §2) every 2-D leaf with ``min(p, q) > rank``
  takes the low-rank path and every other leaf (biases, norms, scalars, small
  matrices) takes the full-rank AdamW path. ``labels`` (the optimizer's
  ``low_rank_labels``) overrides that: a pytree, or a function of the params returning
  one, whose leaves are

  * ``True``: low-rank, a 2-D leaf seen as it is;
  * ``False``: the full-rank path;
  * a :class:`MatrixAxes`: low-rank, the leaf reshaped into a matrix whose rows are
    the axes ``rows`` and whose columns are the axes ``cols`` (a Flax attention kernel
    ``(embed, heads, head_dim)`` is ``MatrixAxes(rows=0, cols=(1, 2))``), or a stack of
    such matrices along the axes ``batch`` (a scanned model's ``(layers, p, q)`` kernel is
    ``MatrixAxes(batch=0, rows=1, cols=2)``: each layer its own basis and moments).
    ``optax.contrib.GaLoreDimensionNumbers`` is accepted too.

  A label function is called with a tree shaped like the params; on the low-rank path
  it is the same tree with ``optax.MaskedNode()`` at the other leaves, as everywhere in
  ``optax.partition``. Functions of shapes and key paths work on both.

  ``optax.MaskedNode`` leaves stay as they are.
  """
  is_masked = lambda x: isinstance(x, optax.MaskedNode)  # noqa: E731
  if labels is None:
    return jax.tree.map(
      lambda x: x if is_masked(x) else _default_axes(x, rank), tree, is_leaf=is_masked
    )
  user = labels(tree) if callable(labels) else labels

  def one(path, x, label):
    return x if is_masked(x) else _labelled_axes(path, x, label, rank)

  return jax.tree_util.tree_map_with_path(one, tree, user, is_leaf=is_masked)


def partition_labels(labels: Any, rank: int, who: str) -> Callable[[Any], Any]:
  """A label function for ``optax.partition``: LOW_RANK or FULL_RANK per leaf.

  With the default routing (``labels`` None), a tree in which no leaf is low-rank is
  an error: the method would quietly be its full-rank counterpart.
  """

  def label_fn(tree):
    routed = jax.tree.map(
      lambda a: FULL_RANK if a == FULL_RANK else LOW_RANK, route(tree, labels, rank)
    )
    if labels is None and LOW_RANK not in jax.tree.leaves(routed):
      _refuse_all_full_rank(tree, rank, who)
    return routed

  return label_fn


def _refuse_all_full_rank(tree: Any, rank: int, who: str) -> None:
  matrices = [x.shape for x in jax.tree.leaves(tree) if getattr(x, "ndim", 0) == 2]
  if not jax.tree.leaves(tree):
    return
  if not matrices:
    found = "the parameters hold no 2-D leaf"
  else:
    largest = max(matrices, key=min)
    found = (
      f"every 2-D leaf has min(p, q) <= rank (the largest, {largest[0]} x {largest[1]}, "
      f"has min {min(largest)})"
    )
  raise ValueError(
    f"{who}: rank={rank} leaves no matrix low-rank: {found}, so every leaf would take "
    "full-rank Adam and the method would be its full-rank counterpart (LoRDO would be "
    "local AdamW). Lower the rank below the matrices' smaller side, label reshaped "
    "leaves with low_rank_labels, or use lordo_jax.local_adam / lordo_jax.ddp."
  )
