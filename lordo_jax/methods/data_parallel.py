"""Data parallelism: the gradient averaged every step, then the optimizer.

:func:`average_gradients` (the data-parallel piece: each worker's gradient replaced by
the counted mean over the workers), :func:`ddp` (it, then AdamW) and
:func:`low_rank_ddp` (it, then low-rank Adam: GaLore, routed as in
:func:`lordo_jax.lordo`).
"""

import numbers
from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from lordo_jax import _checks as checks
from lordo_jax import _keywords as keywords
from lordo_jax.comm import _collectives as collectives
from lordo_jax.comm import _compression as compression_lib
from lordo_jax.comm import _projected_mean as projected_mean
from lordo_jax.local import _routing as routing
from lordo_jax.methods import local_step
from lordo_jax.methods import options as options_lib

COMMUNICATE = ("full", "projected")
DEFAULT_REFRESH_EVERY = 200  # GaLore's update_proj_gap.


class AverageGradientsState(NamedTuple):
  """State of :func:`average_gradients`."""

  ledger: collectives.Ledger  # What this transformation has all-reduced since init.
  residual: Any = ()  # float32 like params: compression error feedback; () without.


def average_gradients(
  axis_name: str | None, *, compression: str | None = None
) -> optax.GradientTransformation:
  r"""Replaces each worker's gradient by the mean over the workers (data parallelism).

  .. math::
    \bar G = \frac{1}{M} \sum_{m=1}^{M} G_m

  One all-reduce of the whole update tree per step, through
  :func:`lordo_jax.counted_pmean`, counted in the state's ledger. Chain it before any
  optimizer to make it data-parallel (:func:`ddp`, :func:`low_rank_ddp`).

  With ``compression`` the gradient is sent as bfloat16 or int8 with per-row scales
  and error feedback (MATH.md §4.2): each worker sends
  :math:`G_m + e_m` and keeps what the rounding lost in :math:`e_m`, so over a run
  the sum of the means it returns plus the mean residual equals the sum of the true
  means (Seide et al. 2014; Karimireddy et al. 2019).

  Args:
    axis_name: the worker axis (``jax.shard_map`` mesh axis or ``jax.pmap`` axis
      name); ``None`` for one worker, where it is the identity and sends nothing.
    compression: ``None``, ``"bfloat16"`` or ``"int8"``.

  Returns:
    An ``optax.GradientTransformation``.

  Examples:
    >>> import jax.numpy as jnp, lordo_jax
    >>> tx = lordo_jax.average_gradients(None)
    >>> grads = {"w": jnp.ones((2, 3))}
    >>> updates, state = tx.update(grads, tx.init(grads))
    >>> lordo_jax.communicated_bytes(state)
    0

  References:
    Li et al., `PyTorch Distributed: Experiences on Accelerating Data Parallel
    Training <https://arxiv.org/abs/2006.15704>`_, VLDB 2020.
  """

  checks.one_of("average_gradients", "compression", compression, (None, *compression_lib.CODECS))

  def init_fn(params):
    residual = ()
    if compression is not None:
      residual = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), params)
    return AverageGradientsState(ledger=collectives.init_ledger(), residual=residual)

  def update_fn(updates, state, params=None):
    del params
    collectives.check_axis_bound(axis_name, "average_gradients")
    updates, ledger, residual = collectives.counted_mean(
      updates,
      state.ledger,
      axis_name,
      compression_codec=compression,
      residual=state.residual if compression is not None else None,
    )
    return updates, AverageGradientsState(
      ledger=ledger, residual=residual if compression is not None else ()
    )

  return optax.GradientTransformation(init_fn, update_fn)


@keywords.takes(options_lib.basics("axis_name"), options_lib.ADAM)
def ddp(
  learning_rate: optax.ScalarOrSchedule,
  *,
  axis_name: str | None = None,
  compression: str | None = None,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
  weight_decay: float = 0.0,
) -> optax.GradientTransformation:
  r"""Data-parallel AdamW (DDP): the full gradient is averaged every step.

  .. math::
    \bar G = \mathrm{pmean}_m(G_m), \qquad
    \text{update} = \mathrm{AdamW}(\bar G)

  The chain :func:`average_gradients` then AdamW (``optax.adamw``'s pieces, moments
  in float32 whatever the parameter dtype); every worker holds the
  same parameters and moments. Communication: ``pq`` elements per ``p x q`` leaf
  per step (MATH.md §7).

  Args:
    {options}
    compression: ``None``, ``"bfloat16"`` or ``"int8"``: the gradient sent
      compressed, with error feedback (:func:`average_gradients`).

  Returns:
    An ``optax.GradientTransformation``.

  Examples:
    >>> import jax.numpy as jnp, optax, lordo_jax
    >>> params = {"w": jnp.ones((4, 3))}
    >>> tx = lordo_jax.ddp(1e-2)
    >>> state = tx.init(params)
    >>> updates, state = tx.update({"w": jnp.ones((4, 3))}, state, params)
    >>> params = optax.apply_updates(params, updates)

  References:
    Li et al., `PyTorch Distributed: Experiences on Accelerating Data Parallel
    Training <https://arxiv.org/abs/2006.15704>`_, VLDB 2020; Loshchilov & Hutter,
    `Decoupled Weight Decay Regularization <https://arxiv.org/abs/1711.05101>`_,
    ICLR 2019.
  """
  adam = keywords.given(locals(), options_lib.ADAM)
  options_lib.check_adam("ddp", adam)
  return optax.chain(
    average_gradients(axis_name, compression=compression),
    local_step.adamw(learning_rate, **adam),
  )


def _check_projected(who: str, *, omega, compression, error_feedback) -> None:
  """The options ``communicate="projected"`` rules out, each needing the full gradient.

  It sends only the coordinates, so it needs ``omega = 1`` (no full-rank term), no
  compression and no error feedback.
  """
  if not (isinstance(omega, numbers.Real) and omega == 1):
    raise ValueError(
      f"{who}: omega={omega!r} is not accepted with communicate='projected'; expected "
      "1.0. The full-rank term needs the averaged full gradient at every step: use "
      "communicate='full'."
    )
  if compression is not None:
    raise ValueError(
      f"{who}: compression={compression!r} is not accepted with "
      "communicate='projected'; expected None. Compress the full gradient with "
      "communicate='full', or send the r x q coordinates uncompressed."
    )
  if error_feedback:
    raise ValueError(
      f"{who}: error_feedback={error_feedback!r} is not accepted with "
      "communicate='projected'; expected False. Error feedback needs the averaged "
      "full gradient at every step: use communicate='full'."
    )


@keywords.takes(options_lib.basics("axis_name"), options_lib.LOW_RANK)
def low_rank_ddp(
  learning_rate: optax.ScalarOrSchedule,
  *,
  rank: int,
  refresh_every: int | None = None,
  axis_name: str | None = None,
  communicate: str = "full",
  compression: str | None = None,
  omega: float = 1.0,
  mu: float = 1.0,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
  projection: str = "svd",
  side: str = "auto",
  transport: str = "keep",
  error_feedback: bool = False,
  error_feedback_dtype: str = "float32",
  full_rank_scale: str = "scalar",
  full_rank_numerator: str = "gradient",
  qh_nu: float = 1.0,
  low_rank_term: str = "adam",
  subspace_iterations: int | None = None,
  two_sided: bool = False,
  oversample: int | None = None,
  power_iterations: int | None = None,
  weight_decay: float = 0.0,
  full_rank_nu: float = 1.0,
  low_rank_labels: Callable | None = None,
) -> optax.GradientTransformation:
  r"""Low-rank DDP (GaLore-DDP): low-rank Adam on the averaged gradient.

  Every step, on each low-rank matrix (MATH.md §3 and §6):

  .. math::
    \bar G = \mathrm{pmean}_m(G_m), \quad c = Q^\top \bar G, \quad
    u \leftarrow \beta_1 u + (1 - \beta_1) c, \quad
    v \leftarrow \beta_2 v + (1 - \beta_2) c^2, \quad
    \text{update} = -\eta \left(Q \frac{\hat u}{\sqrt{\hat v} + \epsilon}
      + \lambda W\right)

  and Q is recomputed from :math:`\bar G` at steps 1, T + 1, 2T + 1, ... With the
  defaults (``omega = 1``, ``transport="keep"``, ``projection="svd"``) this is
  ``optax.contrib.galore`` on the mean gradient, up to the sign convention of the
  singular vectors (ours are canonical, MATH.md §5). Leaves are routed as in
  :func:`lordo_jax.lordo`: those that are not low-rank matrices take AdamW on the
  averaged gradient (parameters with no 2-D leaf train as :func:`ddp` would, with a
  warning).

  ``communicate`` chooses what travels (per step and ``p x q`` matrix, MATH.md §7);
  both give the same iterates, since Q is shared and projection is linear:

  * ``"full"`` (default; DDP + GaLore, the paper's baseline): the full gradient
    every step, ``pq`` elements per matrix;
  * ``"projected"``: the low-rank Adam averages only its coordinates ``c`` (``rq``)
    every step, plus the full gradient on refresh steps (``pq / T`` per step on
    average, ``rq + pq / T`` in all), or with ``projection="randomized_svd"`` only
    its sketches (``n x l`` products with it, :math:`l = r + \text{oversample}`,
    per pass). It needs ``omega = 1`` and ``error_feedback=False``, which use the
    full gradient.

  ``two_sided=True`` is TSR-Adam (MATH.md §5): the moments are the
  ``r x r`` cores :math:`U^\top \bar G V`; with ``communicate="projected"`` the
  per-step message is that core (``r^2`` per matrix), and a refresh with
  ``projection="randomized_svd"`` averages sketches (``(p + q)(r + oversample)``
  elements per pass) instead of the ``p x q`` gradient.

  Args:
    {options}
    refresh_every: T, steps between basis refreshes (GaLore's ``update_proj_gap``;
      ``None``: 200).
    communicate: ``"full"`` or ``"projected"``.
    compression: ``None``, ``"bfloat16"`` or ``"int8"``: with ``communicate="full"``
      the gradient is sent compressed, with error feedback
      (:func:`average_gradients`).

  Returns:
    An ``optax.GradientTransformation``.

  Examples:
    >>> import jax.numpy as jnp, optax, lordo_jax
    >>> params = {"w": jnp.ones((16, 8)), "b": jnp.zeros(8)}
    >>> tx = lordo_jax.low_rank_ddp(1e-2, rank=2, refresh_every=10)
    >>> state = tx.init(params)
    >>> grads = {"w": jnp.arange(128.0).reshape(16, 8), "b": jnp.ones(8)}
    >>> updates, state = tx.update(grads, state, params)
    >>> params = optax.apply_updates(params, updates)

  References:
    Zhao et al., `GaLore: Memory-Efficient LLM Training by Gradient Low-Rank
    Projection <https://arxiv.org/abs/2403.03507>`_, ICML 2024; Jovanović et al.,
    `LoRDO <https://arxiv.org/abs/2602.04396>`_, ICML 2026 (the baseline); Dang et
    al., `TSR-Adam <https://arxiv.org/abs/2602.08007>`_, 2026 (two-sided).
  """
  who = "low_rank_ddp"
  step_keywords = keywords.given(locals(), options_lib.LOW_RANK)
  refresh_every = DEFAULT_REFRESH_EVERY if refresh_every is None else refresh_every
  checks.positive_int(who, "refresh_every", refresh_every)
  checks.one_of(who, "communicate", communicate, COMMUNICATE)
  projected = communicate == "projected"
  if projected:
    _check_projected(who, omega=omega, compression=compression, error_feedback=error_feedback)
  step_options, local_options = options_lib.low_rank_step(who, step_keywords)

  def matrices_path(low_rank):
    """Projected: the coordinates averaged (``projected_mean``)."""
    return projected_mean.projected_mean(low_rank, axis_name) if projected else low_rank

  _, local_optimizer = local_step.low_rank_adamw(
    step_options,
    local_options,
    learning_rate,
    who=who,
    init_projection="gradient",
    refresh_every=refresh_every,
    matrices_path=matrices_path,
  )
  if not projected:
    return optax.chain(average_gradients(axis_name, compression=compression), local_optimizer)

  # Only the leaves off the low-rank path are averaged in full here; projected_mean
  # averages the coordinates (and, on refresh steps, the gradient or its sketches).
  # The local step's partition checks the routing (and warns) once; this mask only reads it.
  def full_rank_mask(tree):
    routed = routing.route(tree, local_options.low_rank_labels, rank)
    return jax.tree.map(lambda axes: axes == routing.FULL_RANK, routed)

  return optax.chain(optax.masked(average_gradients(axis_name), full_rank_mask), local_optimizer)
