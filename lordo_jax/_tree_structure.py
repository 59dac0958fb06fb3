"""A state re-wrapped by a framework, put back in the structure its ``init`` made.

Flax's ``nnx.Optimizer`` stores the optimizer state as ``nnx.State``: a NamedTuple
that sits in a parameter's slot comes back from its first ``update`` as a dict of the
same fields. :func:`conformed` makes an ``update`` accept such a state: its leaves are
matched, by the names on their paths (a NamedTuple field and a dict key of the same
name are one name), to the structure ``init`` gives for the update's gradients. A state
in that structure already is passed on untouched. :func:`unwrapped` gives a tree read
from the structure ``init`` recorded (Flax's ``nnx.Param`` wrappers included) as plain
values.
"""

from collections.abc import Callable
from typing import Any

import jax


def _name(key) -> Any:
  """The name of one path entry: a dict key, an attribute name or a sequence index."""
  for attribute in ("key", "name", "idx"):
    if hasattr(key, attribute):
      return getattr(key, attribute)
  return str(key)


def _names(path) -> tuple:
  return tuple(_name(key) for key in path)


def restructured(state: Any, template: Any, who: str) -> Any:
  """``state``'s leaves in ``template``'s structure, matched by the names on their paths.

  Raises:
    ValueError: ``state`` does not hold exactly the leaves ``template`` names.
  """
  targets, treedef = jax.tree_util.tree_flatten_with_path(template)
  if jax.tree.structure(state) == treedef:
    return state
  given = {_names(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]}
  wanted = [_names(path) for path, _ in targets]
  missing = [jax.tree_util.keystr(path) for path, _ in targets if _names(path) not in given]
  if missing or len(given) != len(wanted):
    raise ValueError(
      f"{who}: the optimizer state does not have the structure this optimizer's init "
      f"gives for these gradients ({len(given)} leaves, expected {len(wanted)}; "
      f"missing: {', '.join(missing[:3]) or 'none'}). Pass the state that tx.init "
      "returned (or its updates), for parameters shaped like the gradients."
    )
  return treedef.unflatten([given[names] for names in wanted])


def unwrapped(tree: Any) -> Any:
  """``tree`` with every array wrapper as its value: an object that wraps one value and
  says so by ``__jax_array__`` (Flax's ``nnx.Param``; ``nnx.Optimizer`` passes them to
  ``init``, so a structure the state records holds them, and their values to ``update``)."""
  wraps = lambda x: hasattr(x, "__jax_array__") and not isinstance(x, jax.Array)  # noqa: E731
  return jax.tree.map(lambda x: x.__jax_array__() if wraps(x) else x, tree, is_leaf=wraps)


def conformed(init: Callable, update: Callable, who: str) -> Callable:
  """``update`` that first puts its state in the structure of ``init(updates)``.

  The structure is taken with ``jax.eval_shape``: nothing is computed.
  """

  def update_fn(updates, state, params=None, **extra_args):
    template = jax.eval_shape(init, updates)
    return update(updates, restructured(state, template, who), params, **extra_args)

  return update_fn
