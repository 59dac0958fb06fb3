r"""How a round of :func:`lordo_jax.synchronize` averages over the workers: a strategy.

An :class:`Averaging` is chosen once from the options (:func:`choose`), and the round
takes it as an argument. Its three kinds:

* :func:`plain`: every worker's message counts,
  :math:`\bar x = \frac1M \sum_m x_m` (:func:`lordo_jax.comm._collectives.counted_pmean`);
* :func:`of_present_workers` (``fault_tolerant=True``): the mean over the workers
  present, :math:`\bar x = \sum_m w_m x_m / \sum_m w_m` with :math:`w_m \in \{0, 1\}`
  (:func:`lordo_jax.comm._collectives.counted_mean_of_present`); a worker is present when
  it was not marked absent, took only finite steps this round (its non-finite steps
  are skipped, :func:`lordo_jax.round._faults.skip_non_finite_step`), and its message is
  finite;
* :func:`compressed` (``compression="bfloat16" | "int8"``): every message sent
  encoded (:func:`lordo_jax.comm._collectives.counted_mean`), the pseudo-gradient with
  per-worker error feedback :math:`e`: the worker sends :math:`\Delta_m + e_m` and
  keeps what the encoding lost, so :math:`\sum_t \bar\Delta_t + \mathrm{mean}_m e_m
  = \sum_t \mathrm{mean}_m \Delta_{m,t}`; the moments in the codec of
  :data:`lordo_jax.comm._compression.MOMENT_CODECS`, without feedback.

Every mean returns ``(mean, fraction, ledger)``: ``fraction`` is the share
:math:`\phi` of workers in it (1 but for :func:`of_present_workers`).
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from lordo_jax.comm import _collectives as collectives
from lordo_jax.comm import _compression as compression_lib
from lordo_jax.local.bases import layout
from lordo_jax.round import _faults as faults
from lordo_jax.round import _moment_trees as moment_trees


class Averaging(NamedTuple):
  """How a round averages: the means, its error-feedback state, who is present."""

  mean: Callable  # (tree, present, ledger) -> (mean, fraction, ledger): a gradient.
  moment_mean: Callable  # The same, for the optimizer moments.
  pseudo_gradient_mean: Callable  # (delta, present, ledger, residual, fragment) -> (.., residual).
  init_residual: Callable  # params -> the error-feedback state; () without feedback.
  admit: Callable  # (present, tree) -> present: whether this worker's tree enters the mean.
  guard_step: Callable  # (grads, updates, state, before, faults) -> the kept local step.


def _counted(axis_name: str | None, codec: str | None) -> Callable:
  """The mean of every worker, sent with ``codec`` (``None``: as it is); φ = 1."""

  def mean(tree, present, ledger):
    del present  # every worker counts
    tree, ledger, _ = collectives.counted_mean(tree, ledger, axis_name, compression_codec=codec)
    return tree, jnp.ones([], jnp.float32), ledger

  return mean


def _without_residual(mean: Callable) -> Callable:
  """A pseudo-gradient mean with no error feedback: ``mean``, the residual passed on."""

  def pseudo_gradient_mean(delta, present, ledger, residual, fragment):
    del fragment
    return (*mean(delta, present, ledger), residual)

  return pseudo_gradient_mean


def _no_residual(params):
  """No error-feedback state: ``()``."""
  del params
  return ()


def _everyone(present, tree):
  """Presence is not tracked: ``present`` as given (the means ignore it)."""
  del tree
  return present


def _uncompressed(mean: Callable, admit: Callable, guard_step: Callable) -> Averaging:
  """Every message sent as it is: ``mean`` for all of them, no error feedback."""
  return Averaging(
    mean=mean,
    moment_mean=mean,
    pseudo_gradient_mean=_without_residual(mean),
    init_residual=_no_residual,
    admit=admit,
    guard_step=guard_step,
  )


def plain(axis_name: str | None) -> Averaging:
  r"""The plain mean :math:`\frac1M \sum_m x_m`, every message sent as it is."""
  return _uncompressed(_counted(axis_name, None), _everyone, faults.keep_every_step)


def of_present_workers(axis_name: str | None) -> Averaging:
  r"""The mean over the workers present, :math:`\sum_m w_m x_m / \sum_m w_m`.

  A worker's message enters the mean when it is present and the message is finite
  (``admit``); a local step whose gradient is not finite is skipped and fails the
  worker for the round (``guard_step``). Each message carries one float32 scalar
  more, the presence weight.
  """

  def mean(tree, present, ledger):
    return collectives.counted_mean_of_present(tree, present, ledger, axis_name)

  def admit(present, tree):
    return present & faults.all_finite(tree)

  return _uncompressed(mean, admit, faults.skip_non_finite_step)


def compressed(axis_name: str | None, codec: str) -> Averaging:
  r"""Every message encoded with ``codec``; the pseudo-gradient with error feedback.

  The residual :math:`e_m` (float32, like the params, per worker) of the leaves in
  ``fragment`` goes with this sync's pseudo-gradient, :math:`\Delta_m + e_m`, and takes
  what its encoding lost; the other leaves' residuals wait for their own sync.
  """

  def pseudo_gradient_mean(delta, present, ledger, residual, fragment):
    del present
    own = moment_trees.select(residual, fragment)
    delta, ledger, own = collectives.counted_mean(
      delta, ledger, axis_name, compression_codec=codec, residual=own
    )
    return delta, jnp.ones([], jnp.float32), ledger, moment_trees.merge(residual, own)

  def init_residual(params):
    # Split like its parameter (Explicit mesh axes inside a worker), as the anchor is.
    return jax.tree.map(lambda x: layout.zeros(x.shape, jnp.float32, layout.spec_of(x), x), params)

  return Averaging(
    mean=_counted(axis_name, codec),
    moment_mean=_counted(axis_name, compression_lib.MOMENT_CODECS[codec]),
    pseudo_gradient_mean=pseudo_gradient_mean,
    init_residual=init_residual,
    admit=_everyone,
    guard_step=faults.keep_every_step,
  )


def choose(axis_name: str | None, *, fault_tolerant: bool, compression: str | None) -> Averaging:
  """The averaging of ``synchronize``'s options (the two are not combined)."""
  if fault_tolerant:
    return of_present_workers(axis_name)
  if compression is not None:
    return compressed(axis_name, compression)
  return plain(axis_name)


def unless_empty(fraction, averaged, own):
  r"""``averaged`` (a tree) where any worker was in the mean, :math:`\phi > 0`; ``own``
  (the same structure) where nobody was."""
  anyone = fraction > 0
  return jax.tree.map(lambda a, b: jnp.where(anyone, a, b), averaged, own)
