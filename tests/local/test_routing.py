"""Routing's checks of a tree under the default routing (lordo_jax/local/_routing.py).

A leaf of three or more axes that some split of its axes would make a matrix above the
rank is named in a warning with the :class:`~lordo_jax.MatrixAxes` that makes it
low-rank, and the 2-D leaves left full-rank because ``min(p, q) <= rank`` are named in
one notice; the warnings come at the first look at the tree (``init``), not at every
trace; labelled trees are the user's choice and get none.
"""

import warnings

import jax
import jax.numpy as jnp
import pytest

import lordo_jax
from lordo_jax.local import _routing as routing

MatrixAxes = lordo_jax.MatrixAxes


@pytest.mark.parametrize(
  "shape, rank, axes",
  [
    ((64, 4, 16), 8, MatrixAxes(rows=0, cols=(1, 2))),  # attention query: 64 x 64
    ((4, 16, 64), 8, MatrixAxes(rows=(0, 1), cols=2)),  # attention output: 64 x 64
    ((3, 3, 16, 32), 8, MatrixAxes(rows=(0, 1, 2), cols=3)),  # convolution: 144 x 32
    ((12, 32, 32), 8, MatrixAxes(rows=(0, 1), cols=2)),  # squarest: 384 x 32
    ((8, 2, 4), 8, None),  # 8 x 8 at best: not above the rank
    ((2, 2, 2), 1, MatrixAxes(rows=0, cols=(1, 2))),  # a tie: the first split, 2 x 4
  ],
)
def test_the_suggestion_is_the_squarest_split_above_the_rank(shape, rank, axes):
  assert routing.suggested_axes(shape, rank) == axes


def caught(fn, *args):
  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter("always")
    fn(*args)
  return [str(w.message) for w in record if issubclass(w.category, UserWarning)]


PARAMS = {
  "kernel": jnp.ones((64, 4, 16)),  # (d, heads, head_dim)
  "stack": jnp.ones((4, 8, 2)),  # 32 x 2 or 4 x 16 at best: not above rank 8
  "w": jnp.ones((32, 16)),
  "b": jnp.zeros(16),
}


def test_an_unlabelled_3d_leaf_is_named_once_with_its_shape_and_matrix_axes():
  tx = lordo_jax.lordo(1e-2, rank=8, sync_every=2)
  (message,) = caught(tx.init, PARAMS)
  assert message.startswith("lordo: the leaf ['kernel'] of shape (64, 4, 16)"), message
  assert "MatrixAxes(rows=0, cols=(1, 2))" in message and "one 64 x 64 low-rank" in message
  state = tx.init(PARAMS)
  update = jax.jit(tx.update)
  grads = jax.tree.map(jnp.ones_like, PARAMS)
  assert caught(lambda: [update(grads, state, PARAMS) for _ in range(2)]) == []
  assert caught(tx.update, grads, state, PARAMS) == []  # Eager: traced again, silent.


def test_a_labelled_3d_leaf_warns_nothing():
  labels = {"kernel": MatrixAxes(rows=0, cols=(1, 2)), "stack": False, "w": True, "b": False}
  tx = lordo_jax.lordo(1e-2, rank=8, sync_every=2, low_rank_labels=labels)
  assert caught(tx.init, PARAMS) == []
  assert lordo_jax.projections(tx.init(PARAMS))["kernel"].shape == (64, 8)


def test_no_warning_without_a_leaf_that_could_be_a_matrix_above_the_rank():
  tx = lordo_jax.low_rank_ddp(1e-2, rank=8)
  assert caught(tx.init, {k: PARAMS[k] for k in ("stack", "w", "b")}) == []


def test_2d_leaves_at_or_below_the_rank_are_named_once_as_left_full_rank():
  params = {"w": jnp.ones((64, 32)), "narrow": jnp.ones((64, 8)), "b": jnp.zeros(32)}
  tx = lordo_jax.lordo(1e-2, rank=12, sync_every=2)
  (message,) = caught(tx.init, params)
  assert message.startswith("lordo: rank=12 leaves these 2-D leaves full-rank"), message
  assert "['narrow'] 64 x 8" in message and "['w']" not in message
  state = tx.init(params)
  bases = lordo_jax.projections(state)
  assert bases["narrow"] is None and bases["w"].shape == (64, 12)  # What it says, it does.
  grads = jax.tree.map(jnp.ones_like, params)
  assert caught(jax.jit(tx.update), grads, state, params) == []  # Not at each trace.


def test_no_notice_when_every_matrix_is_low_rank_or_labelled():
  params = {"w": jnp.ones((64, 32)), "v": jnp.ones((16, 48)), "b": jnp.zeros(32)}
  assert caught(lordo_jax.lordo(1e-2, rank=12, sync_every=2).init, params) == []
  narrow = params | {"narrow": jnp.ones((64, 8))}
  labels = {"w": True, "v": True, "b": False, "narrow": False}
  tx = lordo_jax.low_rank_ddp(1e-2, rank=12, low_rank_labels=labels)
  assert caught(tx.init, narrow) == []
