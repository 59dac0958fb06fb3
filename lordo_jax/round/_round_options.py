"""The keyword options of a round, each written once with its default and Args text:
:class:`RoundBasics` (its length, workers and outer step) and :class:`RoundOptions`
(how it communicates), which :func:`lordo_jax.synchronize` and every method built on it
take (:mod:`lordo_jax._keywords`).
"""

import dataclasses
from collections.abc import Callable

import optax

from lordo_jax import _keywords as keywords


@dataclasses.dataclass(frozen=True)
class RoundBasics:
  """What every round is given: its length, its workers and its outer step
  (:mod:`lordo_jax._keywords`; the methods declare these themselves)."""

  sync_every: int | Callable = keywords.option(
    "K, local steps per round; or a function of the step giving each round's length "
    "(e.g. :func:`lordo_jax.quadratic_sync_rule`).",
    static=True,
  )
  axis_name: str | None = keywords.option(
    "the worker axis (``jax.shard_map`` mesh axis or ``jax.pmap`` axis name); ``None`` "
    "for a single worker, where every collective is the identity.",
    None,
  )
  outer_optimizer: optax.GradientTransformation | None = keywords.option(
    "the optax transformation applied to the averaged pseudo-gradient, with the anchor "
    "as params. ``None`` is plain averaging (``optax.sgd(1.0)``); DiLoCo uses "
    "``optax.sgd(0.7, momentum=0.9, nesterov=True)``.",
    None,
  )


@dataclasses.dataclass(frozen=True)
class RoundOptions:
  """How a round communicates: the options every method built on :func:`synchronize`
  shares (:mod:`lordo_jax._keywords`)."""

  compression: str | None = keywords.option(
    '``None`` (messages in the dtype of what is sent), ``"bfloat16"`` or ``"int8"`` '
    "(per-row scales): every message of the round sent compressed, the "
    'pseudo-gradient with error feedback; with ``"int8"`` the moments go in bfloat16.',
    None,
  )
  fragments: int | Callable | None = keywords.option(
    "F, the number of fragments synced at staggered steps (streaming, as in Streaming "
    "DiLoCo), at most K, so that the largest message is about 1/F of the model; or a "
    "function of the params returning a tree of fragment indices (0 to F - 1, each "
    "index used). ``None`` or 1: no streaming.",
    None,
    static=True,
  )
  fault_tolerant: bool = keywords.option(
    "skip non-finite local steps and average only over the workers present at a sync "
    "(``update(..., worker_present=False)`` marks one absent; "
    ":func:`lordo_jax.synchronize`).",
    False,
  )
  overlap: str | int | None = keywords.option(
    '``None`` (each sync blocks the step that ends the round); ``"round"``: the '
    "round's message is averaged during the next round, one chunk per step, in one "
    "collective outside any conditional that XLA may overlap with the step's compute, "
    "and lands at the next boundary; or tau, an int in [1, K): it is averaged during "
    "the next tau steps and lands at the tau-th (MATH.md §9; the chunk is outside any "
    "conditional in the steps given ``update(..., overlap_phase='send')``, "
    ":func:`lordo_jax.overlap_phase`). Needs an int ``sync_every`` and no fault "
    "tolerance. An int ``overlap`` streams with ``fragments``: each fragment's message "
    "is frozen at its own sync and lands tau steps later, tau below the fewest steps "
    'between two fragments\' syncs (one fragment in flight at a time); ``"round"`` '
    "takes ``fragments=1`` (it already streams the round, a chunk a step). A window of "
    "a step or two lands a mean only a step or two old, and trains about as a blocking "
    "sync does; a whole round in flight lands it a round late, and costs much more "
    "loss, even with the outer optimizer tuned for it (``merge``; measured in `the "
    "overlap guide <../guides/overlap.html#what-it-costs-in-quality>`__).",
    None,
  )
  merge: str | None = keywords.option(
    'how a message in flight lands, with ``overlap="round"``: ``"eager"`` (default; '
    "each worker applies its own fresh pseudo-gradient at once and the others' one "
    'round late, Kale et al. 2025, Algorithm 3) or ``"delayed"`` (the mean one round '
    'late; their Algorithm 2), or, as with an int ``overlap``, ``"rebase"`` (the '
    "synchronised parameters plus the worker's steps since its message was frozen; the "
    'default with an int ``overlap``) or ``"streaming"`` (Streaming DiLoCo: mixed with '
    "``merge_alpha``). With a whole round in flight the outer optimizer matters: a mean "
    "that lands a round late corrects less of each round than a blocking sync, so LoRDO "
    "trains best eager with a shorter outer step (its default there, "
    "``delay_correction=\"damped\"``) and DiLoCo with ``merge='rebase'`` at its own outer "
    "optimizer, which extrapolates the late mean (measured in `the overlap guide "
    "<../guides/overlap.html#the-outer-optimizer-for-a-round-in-flight>`__).",
    None,
  )
  delay_correction: str | None = keywords.option(
    'with ``overlap="round"`` and ``merge="eager"`` or ``"delayed"``, how the outer step '
    "corrects for the mean that lands a round late (MATH.md §9, the delay-corrected outer "
    'step): ``"staleness"`` scales the stale part of the direction the outer optimizer '
    "takes, the others' pseudo-gradients a round old, by :math:`(1 - w) / 4` "
    '(:math:`w = 1/M` eager, 0 delayed); ``"step"`` scales the whole direction by '
    ":math:`1 / (1 + \\sqrt{1 - w})^2`; each critically damps the round's mean "
    'recursion at a full outer step; ``"damped"`` scales the whole direction by 0.7 '
    "from two workers on, which damps the averaging outer's fast directions and keeps its "
    "slow ones near their pace. With one worker eager each is the blocking round. "
    '``"none"`` takes the outer optimizer as it is (DiLoCo\'s Nesterov outer diverges '
    'with it at four or more workers). ``None`` (default): ``"staleness"`` with an outer '
    'optimizer given (DiLoCo\'s); with the averaging outer ``"damped"`` eager and '
    '``"none"`` delayed.',
    None,
  )
  merge_alpha: float = keywords.option(
    'with ``merge="streaming"``, the weight of the worker\'s own parameters, in [0, 1): '
    "``alpha theta_m + (1 - alpha) theta_synced``; 0 discards the window's steps.",
    0.0,
  )
  offload: bool = keywords.option(
    "keep the anchor, the outer optimizer's state and the compression residual in host "
    "memory (``pinned_host``) between syncs, on the device only inside the sync "
    "(the sharded-models guide); bit-identical results. Needs ``jit`` or "
    "``shard_map`` (``pmap`` keeps every output on the device).",
    False,
  )


BASIC_KEYWORDS = keywords.of(RoundBasics)
ROUND_KEYWORDS = keywords.of(RoundOptions)
