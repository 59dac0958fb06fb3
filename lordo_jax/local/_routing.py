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

from lordo_jax import _checks as checks

LOW_RANK = "low_rank"
FULL_RANK = "full_rank"


def _as_tuple(axes: int | tuple[int, ...], ndim: int) -> tuple[int, ...]:
  return tuple(a % ndim for a in ((axes,) if isinstance(axes, int) else axes))


@dataclasses.dataclass(frozen=True)
class MatrixAxes:
  """The axes of a leaf that form the rows (p) and the columns (q) of its matrix, and
  the axes (``batch``) that index a stack of such matrices.

  A scanned model's kernel ``(layers, p, q)`` is
  :class:`MatrixAxes(batch=0, rows=1, cols=2) <lordo_jax.MatrixAxes>`:
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

  With the default routing (``labels`` None) it checks what the tree holds, in
  ``who``'s name. It warns only the first time it is called (at ``init``, not again at
  each trace of ``update``, whose gradients may spell the key paths differently):

  * no 2-D leaf at all (a scalar, a vector, Rosenbrock's two coordinates): a
    ``UserWarning`` that every leaf takes the full-rank path, so the method is its
    full-rank counterpart (:data:`FULL_RANK_COUNTERPARTS`), and it trains as that;
  * a leaf of three or more axes that some split of its axes would make a matrix with
    ``min(p, q) > rank`` (Flax's attention kernels): a ``UserWarning`` naming it, its
    shape and the :class:`MatrixAxes` that would make it low-rank
    (:func:`suggested_axes`);
  * 2-D leaves with ``min(p, q) <= rank`` beside low-rank ones (a narrow output layer):
    one ``UserWarning`` naming them all, with their shapes, as left full-rank.

  2-D leaves that all have ``min(p, q) <= rank`` are an error, at every call: the user
  has matrices and would quietly get no low-rank step.
  """
  looked = False

  def label_fn(tree):
    nonlocal looked
    routed = jax.tree.map(
      lambda a: FULL_RANK if a == FULL_RANK else LOW_RANK, route(tree, labels, rank)
    )
    if labels is None and jax.tree.leaves(tree):
      first, looked = not looked, True
      if first:
        _warn_unlabelled_matrices(tree, rank, who)
      if LOW_RANK not in jax.tree.leaves(routed):
        _no_low_rank_leaf(tree, rank, who, warn=first)
      elif first:
        _warn_small_matrices(tree, rank, who)
    return routed

  return label_fn


# What each low-rank method is when no leaf is low-rank (every leaf on its full-rank path).
FULL_RANK_COUNTERPARTS = {
  "lordo": (
    "local AdamW, its parameters and moments averaged every sync_every steps "
    "(lordo_jax.local_adam, with the defaults of outer_optimizer, full_rank_nu and "
    "sync_moments_every)"
  ),
  "lordo_local_projection": (
    "local AdamW, its parameters averaged every sync_every steps and its moments kept "
    "local (lordo_jax.diloco with outer_learning_rate=1.0 and outer_momentum=0.0, with "
    "the defaults of outer_optimizer and full_rank_nu)"
  ),
  "low_rank_ddp": "AdamW on the averaged gradient (lordo_jax.ddp, with the default full_rank_nu)",
}
# lordo with omega = 1: the same without a low-rank leaf.
FULL_RANK_COUNTERPARTS["lordo_global_projection_only"] = FULL_RANK_COUNTERPARTS["lordo"]


def _no_low_rank_leaf(tree: Any, rank: int, who: str, warn: bool) -> None:
  """Warns (if ``warn``) for a tree without a 2-D leaf; refuses one whose matrices are
  all at or below the rank."""
  matrices = [x.shape for x in jax.tree.leaves(tree) if getattr(x, "ndim", 0) == 2]
  if not matrices:
    if warn:
      counterpart = FULL_RANK_COUNTERPARTS.get(who, "its full-rank counterpart")
      checks.warn(
        f"{who}: the parameters hold no 2-D leaf, so no leaf is low-rank: every leaf "
        f"takes the full-rank path and {who} is {counterpart}."
      )
    return
  largest = max(matrices, key=min)
  raise ValueError(
    f"{who}: rank={rank} leaves no matrix low-rank: every 2-D leaf has min(p, q) <= "
    f"rank (the largest, {largest[0]} x {largest[1]}, has min {min(largest)}), so "
    "every leaf would take full-rank Adam and the method would be its full-rank "
    "counterpart (LoRDO would be local AdamW). Lower the rank below the matrices' "
    "smaller side, label reshaped leaves with low_rank_labels, or use "
    "lordo_jax.local_adam / lordo_jax.ddp."
  )


def suggested_axes(shape: tuple[int, ...], rank: int) -> MatrixAxes | None:
  """The split of ``shape``'s axes into leading rows and trailing columns that makes
  the squarest matrix, if its smaller side exceeds ``rank``; else None.

  ``nnx.MultiHeadAttention``'s query kernel ``(d, heads, head_dim)`` gives
  ``MatrixAxes(rows=0, cols=(1, 2))`` (``d x d``), its output kernel
  ``(heads, head_dim, d)`` ``MatrixAxes(rows=(0, 1), cols=2)``, a convolution kernel
  ``(h, w, in, out)`` ``MatrixAxes(rows=(0, 1, 2), cols=3)``.
  """
  splits = [(math.prod(shape[:k]), math.prod(shape[k:]), k) for k in range(1, len(shape))]
  p, q, k = max(splits, key=lambda s: min(s[0], s[1]), default=(0, 0, 0))
  if min(p, q) <= rank:
    return None
  axes = lambda a: a[0] if len(a) == 1 else a  # noqa: E731
  return MatrixAxes(rows=axes(tuple(range(k))), cols=axes(tuple(range(k, len(shape)))))


def _warn_unlabelled_matrices(tree: Any, rank: int, who: str) -> None:
  """Warns for each leaf of 3+ axes that the default routing leaves full-rank but a
  :class:`MatrixAxes` would make low-rank."""
  for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
    shape = tuple(getattr(x, "shape", ()))
    where = jax.tree_util.keystr(path) or "the root"
    axes = suggested_axes(shape, rank) if len(shape) >= 3 else None
    if axes is None:
      continue
    p, q = matrix_shape(shape, axes)
    stacked = ""
    if len(shape) == 3 and min(shape[1:]) > rank:
      stacked = " (MatrixAxes(batch=0, rows=1, cols=2) instead if axis 0 stacks layers)"
    checks.warn(
      f"{who}: the leaf {where} of shape {shape} takes the full-rank path: by default "
      f"only 2-D leaves are low-rank. Labelled {_spelled(axes)} in low_rank_labels it "
      f"is one {p} x {q} low-rank matrix{stacked}; labelled False it stays full-rank "
      "without this warning."
    )


def _warn_small_matrices(tree: Any, rank: int, who: str) -> None:
  """Warns once, naming every 2-D leaf the default routing leaves full-rank because its
  smaller side is at most the rank."""
  small = [
    f"{jax.tree_util.keystr(path) or 'the root'} {x.shape[0]} x {x.shape[1]}"
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]
    if getattr(x, "ndim", 0) == 2 and min(x.shape) <= rank
  ]
  if small:
    checks.warn(
      f"{who}: rank={rank} leaves these 2-D leaves full-rank (AdamW moments, no "
      f"projection), since min(p, q) <= rank: {', '.join(small)}. Only matrices with "
      "min(p, q) > rank are low-rank: lower the rank to make them low-rank, or pass "
      "low_rank_labels (these leaves False) to keep them full-rank without this warning."
    )


def _spelled(axes: MatrixAxes) -> str:
  return f"MatrixAxes(rows={axes.rows}, cols={axes.cols})"
