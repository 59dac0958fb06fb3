"""Trees as a framework hands them over: Flax's Variables read, a re-wrapped state conformed.

Flax's ``nnx.Optimizer`` calls ``init`` on parameters held in ``nnx.Variable``s and
stores the state it returns with every Variable kept (as ``OptVariable``) and every
other array wrapped (as ``OptArray``); ``update`` gets plain arrays, and its state is
written back into those wrappers. A Variable's value is replaced whole, so a NamedTuple
inside one (a :class:`~lordo_jax.LowRankMoments` in a parameter's slot) would come
back a dict and the step's program would compile again: a state whose parts are not
shaped like their parameter is built from :func:`values`, so that no Variable holds
it, and the updates go back in the caller's structure with :func:`like`.

:func:`conformed` makes an ``update`` accept a state re-wrapped in dicts all the same
(``nnx.state`` of a state, a checkpoint restored without a target): its leaves are
matched, by the names on their paths (a NamedTuple field and a dict key of the same name
are one name), to the structure ``init`` gives for the update's gradients. A state in
that structure already is passed on untouched. :func:`unwrapped` gives a tree
read from a structure that holds Flax's ``nnx.Param`` wrappers as plain values.
"""

import sys
from collections.abc import Callable
from typing import Any

import jax


def values(tree: Any) -> Any:
  """``tree`` with every Flax ``nnx.Variable`` replaced by its value (``nnx.as_pure``).

  Where Flax is not loaded no tree holds a Variable, and ``tree`` is returned as it is.
  """
  nnx = sys.modules.get("flax.nnx")
  return tree if nnx is None else nnx.as_pure(tree)


def like(template: Any, tree: Any) -> Any:
  """``tree``'s leaves in ``template``'s structure (the same leaves in the same order,
  ``template`` holding them in Variables where ``tree`` holds them bare)."""
  return jax.tree.structure(template).unflatten(jax.tree.leaves(tree))


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
