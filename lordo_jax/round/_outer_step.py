r"""The outer step of a sync: pseudo-gradient, outer optimizer, synchronised anchor.

Each worker forms its pseudo-gradient (:func:`pseudo_gradient`), the workers average it
(:mod:`lordo_jax.round._averaging`), and :func:`outer_step` moves the anchor by the outer
optimizer (:func:`outer_transform`; one state per fragment, :func:`init_outer_states`).
"""

from typing import Any

import jax
import jax.numpy as jnp
import optax

from lordo_jax.local import _precision as precision
from lordo_jax.round import _averaging as averaging_lib
from lordo_jax.round import _moment_trees as moment_trees


def outer_transform(outer_optimizer: optax.GradientTransformation | None):
  """The outer optimizer (``None``: ``optax.sgd(1.0)``), its state in float32."""
  return precision.in_float32(optax.sgd(1.0) if outer_optimizer is None else outer_optimizer)


def for_fragment(outer: optax.GradientTransformation, fragment: Any):
  """``outer`` restricted to the leaves in ``fragment`` (``None``: all of them)."""
  return outer if fragment is None else optax.masked(outer, fragment)


def init_outer_states(outer: optax.GradientTransformation, params: Any, masks: list) -> tuple:
  """One outer state per fragment, each masked to its fragment's leaves."""
  return tuple(for_fragment(outer, fragment).init(params) for fragment in masks)


def pseudo_gradient(anchor: Any, local_params: Any, fragment: Any) -> Any:
  r""":math:`\Delta_m = \text{anchor} - \theta_m` on the leaves in ``fragment``
  (the others ``optax.MaskedNode()``)."""
  return moment_trees.select(jax.tree.map(lambda a, x: a - x, anchor, local_params), fragment)


def outer_step(outer, fragment, anchor, delta, outer_state, fraction):
  r"""The anchor and outer state after the outer step on the averaged :math:`\Delta`.

  At a sync of the leaves in ``fragment`` (one fragment; all leaves without streaming)
  each worker forms its pseudo-gradient from its parameters after the local step
  (:func:`pseudo_gradient`),

  .. math::
    \Delta_m = \text{anchor} - \theta_m,

  the workers average it to :math:`\Delta` (:mod:`lordo_jax.round._averaging`), and the
  outer optimizer takes a step on it with the anchor as params,

  .. math::
    \theta = \text{anchor} + \text{outer}(\Delta), \qquad \text{anchor} \leftarrow \theta,

  for the leaves in ``fragment`` only: the outer optimizer is ``optax.masked`` to the
  fragment, so each fragment has its own outer state (DiLoCo's momentum), advanced at
  its own syncs. The default outer optimizer, ``optax.sgd(1.0)``, makes :math:`\theta`
  the mean of the workers' parameters. Where nobody was present the anchor and the
  outer state are kept.

  Args:
    outer: the outer optimizer (:func:`outer_transform`).
    fragment: the fragment's leaves (``None``: all).
    anchor: the parameters at the last sync, the same on every worker.
    delta: the averaged pseudo-gradient of the leaves in ``fragment``.
    outer_state: the fragment's outer state.
    fraction: the share of workers in the mean of ``delta``.

  Returns:
    ``(anchor, outer_state)``: the synchronised parameters on the leaves in
    ``fragment`` (the anchor elsewhere), and the fragment's new outer state; both
    unchanged when nobody was in the mean.
  """
  full_delta = moment_trees.merge(jax.tree.map(jnp.zeros_like, anchor), delta)
  outer_updates, new_outer_state = for_fragment(outer, fragment).update(
    full_delta, outer_state, anchor
  )
  synced = moment_trees.merge(
    anchor, moment_trees.select(optax.apply_updates(anchor, outer_updates), fragment)
  )
  return (
    averaging_lib.unless_empty(fraction, synced, anchor),
    averaging_lib.unless_empty(fraction, new_outer_state, outer_state),
  )
