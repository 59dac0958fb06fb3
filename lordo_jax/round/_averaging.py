r"""How a round of :func:`lordo_jax.synchronize` averages over the workers: a strategy.

An :class:`Averaging` is chosen once from the options (:func:`choose`), and the round
takes it as an argument: the plain mean (:class:`Averaging`), the mean over the workers
present (:class:`OfPresentWorkers`) or every message encoded (:class:`Compressed`).
Every mean returns ``(mean, fraction, ledger)``; :func:`unless_empty` keeps a worker's
own values where nobody was in the mean.
"""

from typing import Any

import jax
import jax.numpy as jnp

from lordo_jax import _sharded as sharded
from lordo_jax.comm import _collectives as collectives
from lordo_jax.comm import _compression as compression_lib
from lordo_jax.round import _faults as faults_lib
from lordo_jax.round import _moment_trees as moment_trees


class Averaging:
  r"""How a round averages; this base class is the plain mean :math:`\frac1M \sum_m x_m`.

  Every message is sent as it is and every worker counts. The subclasses change what
  they must: :class:`OfPresentWorkers` who counts, :class:`Compressed` how messages
  travel. Every mean returns ``(mean, fraction, ledger)``: ``fraction`` is the share
  :math:`\phi` of workers in it (1 but for :class:`OfPresentWorkers`).
  """

  def __init__(self, axis_name: str | None):
    self.axis_name = axis_name

  def gradient_mean(self, tree: Any, present, ledger) -> tuple[Any, jax.Array, Any]:
    """The mean of a gradient-like ``tree``, the share φ of workers in it, the ledger."""
    del present  # every worker counts
    tree, ledger, _ = collectives.counted_mean(tree, ledger, self.axis_name)
    return tree, jnp.ones([], jnp.float32), ledger

  def moment_mean(self, tree: Any, present, ledger) -> tuple[Any, jax.Array, Any]:
    """The mean of optimizer moments (as :meth:`gradient_mean`, unless the codec differs)."""
    return self.gradient_mean(tree, present, ledger)

  def pseudo_gradient_mean(self, delta, present, ledger, residual, fragment):
    """``(mean, fraction, ledger, residual)`` of the fragment's pseudo-gradient; the
    error-feedback ``residual`` passed on (none here)."""
    del fragment
    return (*self.gradient_mean(delta, present, ledger), residual)

  def init_residual(self, params: Any) -> Any:
    """The error-feedback state before step 1: ``()`` without feedback."""
    del params
    return ()

  def admit(self, present, tree: Any):
    """Whether this worker's ``tree`` enters the mean: ``present`` as given here."""
    del tree
    return present

  def guard_step(self, grads, updates, inner_state, before, counts):
    """The local step as kept: ``(updates, inner_state, counts)``, unchanged here."""
    return faults_lib.keep_every_step(grads, updates, inner_state, before, counts)


class OfPresentWorkers(Averaging):
  r"""The mean over the workers present, :math:`\sum_m w_m x_m / \sum_m w_m`.

  A worker's message enters the mean when it is present and the message is finite
  (:meth:`admit`); a local step whose gradient is not finite is skipped and fails the
  worker for the round (:meth:`guard_step`). Each message carries one float32 scalar
  more, the presence weight.
  """

  def gradient_mean(self, tree, present, ledger):
    return collectives.counted_mean_of_present(tree, present, ledger, self.axis_name)

  def admit(self, present, tree):
    return present & faults_lib.all_finite(tree)

  def guard_step(self, grads, updates, inner_state, before, counts):
    return faults_lib.skip_non_finite_step(grads, updates, inner_state, before, counts)


class Compressed(Averaging):
  r"""Every message encoded with ``codec``; the pseudo-gradient with error feedback.

  The residual :math:`e_m` (float32, like the params, per worker) of the leaves in
  ``fragment`` goes with this sync's pseudo-gradient, :math:`\Delta_m + e_m`, and takes
  what its encoding lost; the other leaves' residuals wait for their own sync. The
  moments travel in :data:`lordo_jax.comm._compression.MOMENT_CODECS`, without feedback.
  """

  def __init__(self, axis_name: str | None, codec: str):
    super().__init__(axis_name)
    self.codec = codec

  def _encoded_mean(self, tree, ledger, codec):
    tree, ledger, _ = collectives.counted_mean(
      tree, ledger, self.axis_name, compression_codec=codec
    )
    return tree, jnp.ones([], jnp.float32), ledger

  def gradient_mean(self, tree, present, ledger):
    del present
    return self._encoded_mean(tree, ledger, self.codec)

  def moment_mean(self, tree, present, ledger):
    del present
    return self._encoded_mean(tree, ledger, compression_lib.MOMENT_CODECS[self.codec])

  def pseudo_gradient_mean(self, delta, present, ledger, residual, fragment):
    del present
    own = moment_trees.select(residual, fragment)
    delta, ledger, own = collectives.counted_mean(
      delta, ledger, self.axis_name, compression_codec=self.codec, residual=own
    )
    return delta, jnp.ones([], jnp.float32), ledger, moment_trees.merge(residual, own)

  def init_residual(self, params):
    # Split like its parameter (Explicit mesh axes inside a worker), as the anchor is.
    zeros_like = lambda x: sharded.zeros(x.shape, jnp.float32, sharded.spec_of(x), x)  # noqa: E731
    return jax.tree.map(zeros_like, params)


def choose(axis_name: str | None, *, fault_tolerant: bool, compression: str | None) -> Averaging:
  r"""The averaging of ``synchronize``'s options (the two are not combined).

  Its three kinds:

  * :class:`Averaging`: every worker's message counts,
    :math:`\bar x = \frac1M \sum_m x_m` (:func:`lordo_jax.comm._collectives.counted_pmean`);
  * :class:`OfPresentWorkers` (``fault_tolerant=True``): the mean over the workers
    present, :math:`\bar x = \sum_m w_m x_m / \sum_m w_m` with :math:`w_m \in \{0, 1\}`
    (:func:`lordo_jax.comm._collectives.counted_mean_of_present`); a worker is present when
    it was not marked absent, took only finite steps this round (its non-finite steps
    are skipped, :func:`lordo_jax.round._faults.skip_non_finite_step`), and its message is
    finite;
  * :class:`Compressed` (``compression="bfloat16" | "int8"``): every message sent
    encoded (:func:`lordo_jax.comm._collectives.counted_mean`), the pseudo-gradient with
    per-worker error feedback :math:`e`: the worker sends :math:`\Delta_m + e_m` and
    keeps what the encoding lost, so :math:`\sum_t \bar\Delta_t + \mathrm{mean}_m e_m
    = \sum_t \mathrm{mean}_m \Delta_{m,t}`; the moments in the codec of
    :data:`lordo_jax.comm._compression.MOMENT_CODECS`, without feedback.

  Every mean returns ``(mean, fraction, ledger)``; ``fraction`` is the share
  :math:`\phi` of workers in it (:class:`Averaging`).
  """
  if fault_tolerant:
    return OfPresentWorkers(axis_name)
  if compression is not None:
    return Compressed(axis_name, compression)
  return Averaging(axis_name)


def unless_empty(fraction, averaged, own):
  r"""``averaged`` (a tree) where any worker was in the mean, :math:`\phi > 0`; ``own``
  (the same structure) where nobody was."""
  anyone = fraction > 0
  return jax.tree.map(lambda a, b: jnp.where(anyone, a, b), averaged, own)
