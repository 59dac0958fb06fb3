r"""Compute utilisation and time to target of every method on accelerators, by bandwidth.

    python benchmarks/communication/accelerator_model.py   # GPT-2 124M, 355M, 774M; r = d/4, 32
    python benchmarks/communication/accelerator_model.py --small-only  # 124M at r = d/4 only
    python benchmarks/communication/accelerator_model.py --quick  # 124M: DDP and DiLoCo only

Nothing is trained. ``time_to_target.py`` times the workers simulated on 2 CPU cores,
~1000x slower than an accelerator, so there communication never matters; here the
compute of a step is what an accelerator would take, and the bytes are the library's
ledger on the real shapes.

**Compute per step** (:func:`flops_per_token`, :func:`step_seconds`), the PaLM
(Chowdhery et al. 2022, appendix B) / Chinchilla accounting of the matmul FLOPs of one
training step, forward and backward:

.. math::
  F = \text{tokens} \cdot (6 N + 12\, L\, T\, d), \qquad C = F / (\text{peak} \cdot \text{MFU})

with N the parameters that enter a matmul (all but the position embeddings; the tied
token embedding counts once, as the output layer), L layers, T the context, d the
width; ``12 L T d`` is the attention scores ``Q K^T`` and ``A V`` (2 T d FLOPs each
per token and layer forward, x 3 forward + backward), counted without the causal
mask's halving, as PaLM does. Peak: H100 SXM bf16 dense, 989 TFLOP/s; MFU 40%. A worker
is one accelerator with 64 sequences x 1024 tokens per step; M = 8 workers make GPT-3's
0.5M-token batch for all three sizes (Brown et al. 2020, table 2.1). Optimizer compute
(AdamW, the SVDs of a refresh) is not counted.

**Bytes** (:func:`ledger_profile`): each method's ``tx.update`` on the real parameter
shapes (the embeddings and one, then two, of the identical blocks: :func:`profiles`
adds the others), for two periods of its schedule, as one worker of a ``shard_map`` over a
one-device mesh (with ``axis_name=None`` the ledger counts nothing, since nothing is
sent); ``lordo_jax.communicated_bytes`` and ``lordo_jax.all_reduce_count`` of the
state after each step give ``b_s`` and ``a_s``, the payload and the all-reduce calls of
step s, over the second period (the first holds LoRDO's one-off averaged first
gradient). XLA drops every floating-point operation (only the counters are outputs),
so nothing of GPT-2's size is allocated (see ``communication_table.py``). float32
parameters, as the library sends them (a bf16 payload would halve every byte count).

**Utilisation** (:func:`utilisation`), over one period of P steps, at bandwidth ``W``
bit/s per worker, with a ring all-reduce among M workers; step s sends ``b_s`` bytes in
``a_s`` all-reduce calls, taking ``t_s``, of which what runs under ``h_s C`` of the
step's compute is hidden:

.. math::
  t_s = \frac{2 (M-1)}{M} \frac{8\, b_s}{W} + \alpha\, a_s, \qquad
  U(W) = \frac{P\, C}{\sum_{s=1}^{P} \left(C + \max(0,\ t_s - h_s\, C)\right)}

A step's own communication (every ledger profile; a profile without ``"hide"``) hides
under ``h_s = f`` of its computation: ``f = 2/3``, the backward pass (4N of the 6N), the
overlap of a bucketed gradient all-reduce and the assumption of the Streaming DiLoCo
simulation, which gives every method this overlap ("the reduction of gradients or outer
gradients is overlapped over the backward pass computation"); a local-update method's
pseudo-gradient exists only after its last local step, so ``f = 0`` is its strict case,
also tabulated. ``alpha`` = 50 us per all-reduce call. :func:`bandwidth_for` solves
``U(W) = u`` (U rises with W).

**Overlapped synchronisation** (:func:`overlapped_profile`; MATH.md §9, which the library
is building): the message of a round, B bytes frozen at the round's boundary (DiLoCo's
pseudo-gradient), travels in ``tau`` chunks of B / tau during the next ``tau`` local steps
(1 <= tau <= H, the period), one chunk per step. A chunk's collective depends only on
the state carried into its step, so it hides under the whole step, not only its
backward pass: the profile's ``"hide"`` gives that step ``h_s = 1`` whatever ``f``, and
only ``max(0, t_s - C)`` is exposed. With ``tau = H`` (a whole round in flight) every
step sends B / H, hidden entirely above

.. math::
  W^* = \frac{2 (M-1)}{M} \frac{8\, B}{H\, (C - \alpha)},

where sending the same B in one step would need ``W = 2 (M-1)/M 8 B / (f C - alpha)``,
``H / f`` times more (alpha = 0). ``fragments`` staggers the message in equal parts
(Streaming DiLoCo: one fragment of the layers every H / fragments steps, each sent
over the tau steps after its own boundary); ``tau = 0`` is the synchronous schedule.
``lead`` lets the message start under ``lead C`` of the boundary step itself (the
Streaming DiLoCo simulation's reduction, which begins in that step's backward pass:
``lead = f``), the message split in proportion to the windows (``lead / (lead + tau)`` at
the boundary, ``1 / (lead + tau)`` per chunk), so that it is exposed by
``max(0, t - (lead + tau) C)`` like one collective spanning them all. The library's
message exists only after the boundary: ``lead = 0``. A step carrying several
collectives hides them under the largest of their windows.

**Validation** (:func:`streaming_diloco_check`): with the Streaming DiLoCo
simulation's assumptions (Douillard et al. 2025, arXiv 2501.18512, table 4: a 1B model,
bf16 payload of 2 bytes per parameter, 0.1 s per step, M = 2 workers, DiLoCo H = 100,
reduction overlapped with the backward pass), the model must give the bandwidth
of 95% utilisation the paper publishes: data-parallel 222 Gbit/s, DiLoCo 23 Gbit/s.

**Validation of overlap** (:func:`streaming_diloco_overlap_check`, numbers in
:data:`PAPER_OVERLAP`): the same simulation's Streaming DiLoCo rows of table 4 (8
fragments of 3 of the 24 layers, H = 100; without overlap, and overlapped over tau = 1
inner step in bf16 and in FP4, half a byte per parameter, with ``lead = f``), at every
utilisation it tabulates (50, 80, 90, 95, 99%), and table 1 of both papers (hours for
25B tokens at 1 Gbit/s over hours at infinite bandwidth: data-parallel, tau = 1 FP4, and
the eager paper's tau = H = 100 FP4, which 1 Gbit/s hides entirely), each within 25%.
The eager paper's table 5 rows at H = 30, and its tau = H rows, are recorded and
compared but not reproduced (see the function).

**Time to target** (:func:`time_to_target`): the steps DDP takes times the method's
steps-to-target ratio, times the period's mean step time ``C / U(W)``. The ratios are
the LM quality study's (``time_to_target.json``: the first eval step at which a
method's seed-mean validation loss is at or below the target, over DDP's), at the
target every method reaches (the worst final loss) and at the one DDP and LoRDO
reach; DDP's steps are a Chinchilla budget, 20 tokens per parameter, in 0.5M-token
steps. The ratios were measured on a 0.47M-parameter model: carrying them to GPT-2
scale is an assumption, not a measurement. :func:`faster_than` finds the bandwidth
below (or above) which a method reaches the target before DDP.

``--examples-table PATH`` also writes :func:`examples_table`, the 90% / 95% bandwidths
of GPT-2 small that ``examples/main.py`` prints (shipped as
``examples/lm/bandwidth_gpt2_small.json``).
"""

import functools
import json
import math
import pathlib
import sys
from typing import NamedTuple

import jax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks.*

import lordo_jax  # noqa: E402
from benchmarks.communication import communication_table  # noqa: E402
from benchmarks.harness import studies  # noqa: E402

PEAK_FLOPS = 989e12  # H100 SXM, bf16 dense.
MFU = 0.4
WORKERS = 8
TOKENS_PER_STEP = 64 * 1024  # Per worker; x 8 workers = 2^19, GPT-3's 0.5M batch.
OVERLAP = 2 / 3  # The backward pass: 4N of the 6N FLOPs per token.
ALPHA_S = 50e-6
K = 16  # The quality study's sync_every.
T = 16  # The quality study's refresh_every (low-rank DDP).
CHINCHILLA_TOKENS_PER_PARAM = 20
BANDWIDTHS_GBIT = (0.1, 0.3, 1, 3, 10, 30, 100, 400)
TIME_BANDWIDTHS_GBIT = (1, 10, 100)
UTILISATIONS = (0.9, 0.95)
AXIS = communication_table.AXIS
RATIOS_FILE = studies.RESULTS / "time_to_target.json"
# The Streaming DiLoCo paper's table 4 (Gbit/s for 95% compute utilisation, 1B model).
PAPER = {"data_parallel_gbit": 222.0, "diloco_gbit": 23.0, "utilisation": 0.95}
# The overlapped rows, as published (arXiv v1 HTML tables, read from their copies in
# github.com/deep-diver/ai-paper-reviewer: content/paper-reviews/2501.18512/index.md and
# content/2025-02-19/2502.12996/index.md). Every row: the 1B model (24 layers, 0.1 s per
# step, pure compute at 60% MFU), M = 2 workers (the Streaming DiLoCo experiments'),
# reductions overlapped with the backward pass, H = 100 unless named, fragments of 3
# layers (8), bf16 (2 bytes per parameter) or FP4 (half a byte); "1-inner-step" overlap
# is tau = 1, "1-outer-step" tau = H.
PAPER_OVERLAP = {
  "utilisations": (0.5, 0.8, 0.9, 0.95, 0.99),
  # Gbit/s to reach each utilisation: Streaming DiLoCo (Douillard et al. 2025, arXiv
  # 2501.18512), appendix table 4, model size 1B.
  "table_4": {
    "streaming_diloco": ("Streaming DiLoCo", (1.4, 5.2, 9.1, 16.0, 28.1)),
    "overlapped": ("Streaming DiLoCo w/ overlapped com.", (1.4, 4.3, 6.2, 9.1, 11.0)),
    "overlapped_fp4": ("Streaming DiLoCo w/ overlapped FP4 com.", (0.4, 0.9, 1.7, 2.0, 3.0)),
  },
  # The same, eager updates (Kale, Douillard, Donchev 2025, arXiv 2502.12996), appendix
  # table 5, model size 1B (its Data-Parallel, Streaming DiLoCo and H = 100 inner-step
  # rows repeat table 4's).
  "eager_table_5": {
    "inner_fp4_h30": (
      "Streaming DiLoCo with 1-inner-step overlapped FP4 com. H=30",
      (2.4, 3.6, 4.3, 4.3, 4.3),
    ),
    "inner_fp4_h100": (
      "Streaming DiLoCo with 1-inner-step overlapped FP4 com. H=100",
      (0.4, 0.9, 1.7, 2.0, 3.0),
    ),
    "outer_fp4_h30": (
      "Streaming DiLoCo with 1-outer-step overlapped FP4 com. H=30",
      (1.1, 2.0, 2.0, 2.0, 2.4),
    ),
    "outer_fp4_h100": (
      "Streaming DiLoCo with 1-outer-step overlapped FP4 com. H=100",
      (0.1, 0.2, 0.2, 0.2, 0.2),
    ),
  },
  # Hours to train the 1B model on 25B tokens (Dolma), at +inf Gbit/s and at 1 Gbit/s:
  # table 1 of both papers (FP4: 1.10 TB exchanged against data-parallel's 441, 400x
  # fewer bits, H = 100 x 4).
  "table_1_hours": {
    "data_parallel": ("Data-Parallel, 25B (both papers)", (0.67, 109.0)),
    "overlapped_fp4": (
      "Streaming DiLoCo with overlapped FP4 communication, 25B (2501.18512; = "
      "'with 1-inner-step overlap' in 2502.12996)",
      (0.67, 0.88),
    ),
    "outer_step_fp4": (
      "Streaming DiLoCo with 1-outer-step overlap, 25B (2502.12996)",
      (0.67, 0.67),
    ),
  },
}


class Config(NamedTuple):
  """A GPT-2 family transformer (Hugging Face layout, tied output layer)."""

  name: str  # Its name in the tables.
  n_layer: int  # L, transformer blocks.
  d_model: int  # d, the width.
  n_head: int  # Attention heads (FLOPs and bytes do not depend on them).
  vocab: int = 50257  # Token embedding rows, also the output layer.
  context: int = 1024  # T, positions.


GPT2_SMALL = Config("GPT-2 124M", 12, 768, 12)
GPT2_MEDIUM = Config("GPT-2 355M", 24, 1024, 16)
# "720M": GPT-2 large, the family's published 36 x 1280 (708M parameters without
# embeddings, 774M with), as the issue suggests, rather than an invented shape.
GPT2_LARGE = Config("GPT-2 774M", 36, 1280, 20)
CONFIGS = (GPT2_SMALL, GPT2_MEDIUM, GPT2_LARGE)


def param_shapes(config: Config, embeddings: bool = True) -> dict:
  """The parameters of ``config`` as float32 ShapeDtypeStructs, Hugging Face layout
  (:func:`communication_table.gpt2_shapes`)."""
  return communication_table.gpt2_shapes(
    config.n_layer, config.d_model, config.vocab, config.context, embeddings
  )


def n_params(config: Config) -> int:
  """All parameters of ``config``."""
  return sum(math.prod(x.shape) for x in jax.tree.leaves(param_shapes(config)))


def matmul_params(config: Config) -> int:
  """N of the FLOP count: every parameter but the position embeddings (which enter no
  matmul); the tied token embedding counts once, as the output layer."""
  return n_params(config) - config.context * config.d_model


def flops_per_token(n_matmul: int, n_layer: int, context: int, d_model: int) -> float:
  r"""Training FLOPs per token, forward and backward: ``6 N + 12 L T d``.

  ``6 N``: 2 FLOPs per weight forward, 4 backward (gradients of activations and of
  weights). ``12 L T d``: per layer, ``Q K^T`` and ``A V`` each take ``2 T d`` FLOPs per
  token forward (all heads together), times 3 with the backward pass.
  """
  return 6 * n_matmul + 12 * n_layer * context * d_model


def step_seconds(
  config: Config, tokens: int = TOKENS_PER_STEP, peak: float = PEAK_FLOPS, mfu: float = MFU
) -> float:
  """C: one worker's compute per step, ``tokens (6 N + 12 L T d) / (peak MFU)``."""
  per_token = flops_per_token(matmul_params(config), config.n_layer, config.context, config.d_model)
  return tokens * per_token / (peak * mfu)


def methods(rank: int, labels) -> dict:
  """Every method of the quality study, by its variant name, as in the study:
  K = 16, low-rank DDP's T = 16, rank ``rank`` on the leaves ``labels`` marks; LoRDO
  with int8 compression; and each method built on a round again with a whole round in
  flight (:data:`OVERLAPPED`)."""
  low_rank = dict(rank=rank, low_rank_labels=labels, axis_name=AXIS)
  lordo = dict(low_rank, sync_every=K)
  local = dict(sync_every=K, axis_name=AXIS)
  rounds = {  # name: (factory, its options), each also with overlap="round"
    "lordo": (lordo_jax.lordo, lordo),
    "lordo_int8": (lordo_jax.lordo, dict(lordo, compression="int8")),
    "lordo_local_projection": (lordo_jax.lordo_local_projection, lordo),
    "lordo_global_projection_only": (lordo_jax.lordo_global_projection_only, lordo),
    "diloco": (lordo_jax.diloco, local),
    "local_adam": (lordo_jax.local_adam, local),
  }
  found = {
    "ddp": (1, lordo_jax.ddp(1e-3, axis_name=AXIS)),
    "low_rank_ddp": (T, lordo_jax.low_rank_ddp(1e-3, refresh_every=T, **low_rank)),
    "low_rank_ddp_projected": (
      T,
      lordo_jax.low_rank_ddp(1e-3, refresh_every=T, communicate="projected", **low_rank),
    ),
    **{name: (K, factory(1e-3, **options)) for name, (factory, options) in rounds.items()},
    "desloc": (6 * K, lordo_jax.desloc(1e-3, sync_every=K, axis_name=AXIS)),
  }
  for name, (factory, options) in rounds.items():
    found[f"{name}_overlap"] = (K, factory(1e-3, overlap="round", **options))
  return found


# The methods with a whole round in flight (overlap="round"): every step sends one chunk
# of the last round's message, a collective of carried state that hides under the whole
# step (the profile's "hide" is 1). DES-LOC's moment periods take no overlap.
OVERLAPPED = (
  "lordo_overlap",
  "lordo_int8_overlap",
  "lordo_local_projection_overlap",
  "lordo_global_projection_only_overlap",
  "diloco_overlap",
  "local_adam_overlap",
)


# The quick run's methods: their counters-only programs run in seconds. The low-rank
# ones still execute part of their floating-point work on the real shapes (a few seconds
# per step of GPT-2 small on 2 cores), too slow for run_all.py --quick.
QUICK_METHODS = ("ddp", "diloco")
RANKED = ("low_rank_ddp", "low_rank_ddp_projected", "lordo", "lordo_local_projection")
RANKED += ("lordo_global_projection_only", "lordo_int8")
RANKED += tuple(name for name in OVERLAPPED if name.startswith("lordo"))


def ledger_steps(tx, shapes, steps: int) -> list[tuple[int, int]]:
  """(bytes, all-reduce calls) of the ledger after each of ``steps`` counters-only steps
  (``communication_table.counter_steps``)."""

  def read(state) -> tuple[int, int]:
    return lordo_jax.communicated_bytes(state), lordo_jax.all_reduce_count(state)

  return communication_table.counter_steps(tx, shapes, steps, read)


def ledger_profile(tx, shapes, period: int) -> dict:
  """Per step of the second period of the schedule: payload bytes and all-reduce calls."""
  sent = ledger_steps(tx, shapes, 2 * period)
  steps = list(zip([(0, 0), *sent[:-1]], sent, strict=True))[period:]
  return {
    "period": period,
    "bytes": [b - b0 for (b0, _), (b, _) in steps],
    "all_reduces": [a - a0 for (_, a0), (_, a) in steps],
  }


def ring_factor(workers: int) -> float:
  """2 (M - 1) / M: what a ring all-reduce of B bytes sends (and receives) per worker, / B."""
  return 2 * (workers - 1) / workers


def comm_seconds(nbytes: float, calls: int, gbit: float, workers: int, alpha: float) -> float:
  """t = 2 (M - 1) / M x 8 bytes / bandwidth + alpha x all-reduce calls."""
  return ring_factor(workers) * 8 * nbytes / (gbit * 1e9) + alpha * calls


def hideable(profile: dict, overlap: float) -> list[float]:
  """h_s per step: the fraction of a step's compute its communication hides under.

  The profile's ``"hide"`` (:func:`overlapped_profile`) where it gives one, else the
  network's ``overlap`` f (a step's own collective, under its backward pass): a profile
  without ``"hide"``, as every ledger profile, hides every step under f.
  """
  hide = profile.get("hide") or [None] * len(profile["bytes"])
  return [overlap if h is None else h for h in hide]


def period_seconds(profile: dict, compute_s: float, gbit: float, **network) -> float:
  """sum_s (C + max(0, t_s - h_s C)): one period's wall time. ``network``: ``workers``,
  ``overlap`` f (h_s of the steps the profile's ``"hide"`` leaves to it), ``alpha``."""
  workers = network.get("workers", WORKERS)
  overlap, alpha = network.get("overlap", OVERLAP), network.get("alpha", ALPHA_S)
  steps = zip(profile["bytes"], profile["all_reduces"], hideable(profile, overlap), strict=True)
  waits = (max(0.0, comm_seconds(b, a, gbit, workers, alpha) - h * compute_s) for b, a, h in steps)
  return profile["period"] * compute_s + sum(waits)


def utilisation(profile: dict, compute_s: float, gbit: float, **network) -> float:
  """U(W) = P C / sum_s (C + max(0, t_s - h_s C)), at ``gbit`` Gbit/s per worker."""
  return profile["period"] * compute_s / period_seconds(profile, compute_s, gbit, **network)


def bandwidth_for(target: float, profile: dict, compute_s: float, **network) -> float | None:
  """The least bandwidth (Gbit/s) with ``U(W) >= target``; None if no bandwidth reaches it
  (the latency alone is too long). Bisection in log W: U is non-decreasing in W."""
  lo, hi = 1e-6, 1e7
  if utilisation(profile, compute_s, hi, **network) < target:
    return None
  if utilisation(profile, compute_s, lo, **network) >= target:
    return lo
  for _ in range(200):
    mid = math.sqrt(lo * hi)
    lo, hi = (mid, hi) if utilisation(profile, compute_s, mid, **network) < target else (lo, mid)
    if hi / lo < 1 + 1e-12:
      break
  return hi


def sync_every_profile(nbytes: float, period: int) -> dict:
  """The profile of a method that all-reduces ``nbytes`` in one call every ``period`` steps."""
  return {
    "period": period,
    "bytes": [0] * (period - 1) + [nbytes],
    "all_reduces": [0] * (period - 1) + [1],
  }


def overlapped_profile(
  nbytes: float, period: int, tau: int, lead: float = 0.0, fragments: int = 1
) -> dict:
  """The steady-state profile of a round's message of ``nbytes`` per ``period`` steps,
  overlapped with the next ``tau`` steps (MATH.md §9), with each step's hideable
  fraction ``"hide"``.

  The message is cut into ``fragments`` equal parts (1: the whole message; Streaming
  DiLoCo's fragments of layers), part k frozen at the end of step
  ``(k + 1) period // fragments - 1`` of the period (the last step for one fragment).
  ``tau = 0``: each part is all-reduced in that step, hidden under the network's overlap
  f (``"hide"`` None; one fragment gives :func:`sync_every_profile`'s bytes and calls).
  ``1 <= tau <= period``: each part travels in ``tau`` chunks, one collective in each of
  the next ``tau`` steps (wrapping into the next period: the previous round's chunks),
  each hidden under its whole step (``"hide"`` 1). ``lead`` > 0 also lets the part start
  under ``lead C`` of its boundary step: the part is split in proportion to the windows,
  ``lead / (lead + tau)`` in the boundary step (hide ``lead``), ``1 / (lead + tau)`` per
  chunk, so the part waits ``max(0, t - (lead + tau) C)`` in all, as one collective
  spanning the windows would. Collectives landing in one step add their bytes and calls
  and hide under the largest of their windows (the step's link is busy for their sum).

  Args:
    nbytes: The bytes of one round's message (all fragments).
    period: H, the steps between a part's boundaries.
    tau: The steps a part is in flight; 0: synchronous.
    lead: The fraction of the boundary step's compute the part may also hide under
      (0: the library's message, frozen at the boundary; f: the Streaming DiLoCo
      simulation, which reduces during the boundary step's backward pass).
    fragments: The equal parts, with staggered boundaries.

  Returns:
    ``{"period", "bytes", "all_reduces", "hide"}`` over one period.
  """
  if not 1 <= fragments <= period:
    raise ValueError(f"fragments must be in [1, period = {period}], got {fragments}")
  if not 0 <= tau <= period:
    raise ValueError(f"tau must be in [0, period = {period}], got {tau}")
  if lead < 0 or (lead and not tau):
    raise ValueError(f"lead must be >= 0, and 0 without overlap (tau = 0), got {lead}")
  sent, calls = [0.0] * period, [0] * period
  hide: list[float | None] = [None] * period
  part = nbytes / fragments

  def add(step: int, nbytes: float, window: float | None) -> None:
    step %= period
    sent[step] += nbytes
    calls[step] += 1
    hide[step] = window if hide[step] is None else max(hide[step], window)

  for k in range(fragments):
    boundary = (k + 1) * period // fragments - 1
    if tau == 0:
      add(boundary, part, None)
      continue
    if lead:
      add(boundary, part * lead / (lead + tau), lead)
    for j in range(1, tau + 1):
      add(boundary + j, part / (lead + tau), 1.0)
  return {"period": period, "bytes": sent, "all_reduces": calls, "hide": hide}


def streaming_diloco_check() -> dict:
  """The bandwidth of 95% utilisation under the Streaming DiLoCo simulation's assumptions.

  1B parameters, bf16 payload (2 bytes each), a step of 0.1 s, M = 2 workers (ring
  factor 1), the reduction overlapped with the backward pass (f = 2/3), no latency;
  data-parallel all-reduces every step, DiLoCo every H = 100 steps. The paper (table
  4): 222 and 23 Gbit/s.
  """
  network = dict(workers=2, overlap=OVERLAP, alpha=0.0)
  nbytes, step = 2 * 1e9, 0.1
  u = PAPER["utilisation"]
  dp = bandwidth_for(u, sync_every_profile(nbytes, 1), step, **network)
  diloco = bandwidth_for(u, sync_every_profile(nbytes, 100), step, **network)
  return {
    "assumptions": "1B parameters, 2 bytes each, 0.1 s per step, M = 2, overlap 2/3 of "
    "each step (the backward pass), no latency; DiLoCo H = 100",
    "data_parallel_gbit": dp,
    "diloco_gbit": diloco,
    "paper_data_parallel_gbit": PAPER["data_parallel_gbit"],
    "paper_diloco_gbit": PAPER["diloco_gbit"],
    "data_parallel_error": dp / PAPER["data_parallel_gbit"] - 1,
    "diloco_error": diloco / PAPER["diloco_gbit"] - 1,
  }


# The simulation of both papers, for :func:`streaming_diloco_overlap_check`.
SIMULATION = {
  "params": 1e9,
  "step_s": 0.1,
  "workers": 2,
  "fragments": 24 // 3,
  "sync_every": 100,
  "bf16_bytes": 2,
  "fp4_bytes": 0.5,
}


def _simulated_profile(bytes_per_param: float, period: int, tau: int, lead: float) -> dict:
  """The 1B model's message (``bytes_per_param`` each) in the simulation's fragments."""
  nbytes = SIMULATION["params"] * bytes_per_param
  return overlapped_profile(nbytes, period, tau, lead, fragments=SIMULATION["fragments"])


def streaming_diloco_overlap_check(lead: float = OVERLAP) -> dict:
  """The overlapped rows of both papers' simulation (:data:`PAPER_OVERLAP`), modelled.

  1B parameters in 8 fragments (3 of the 24 layers each, one every H / 8 steps), a step
  of 0.1 s, M = 2 (ring factor 1), no latency, f = 2/3 for a step's own reduction.
  ``rows``: table 4 of Streaming DiLoCo, the bandwidth of each utilisation: its
  fragments without overlap (tau = 0), and overlapped over one inner step (tau = 1),
  bf16 and FP4, with the message starting under ``lead C`` of the boundary step (the
  simulation reduces a fragment's outer gradients during that backward pass, as every
  gradient; ``library_gbit``: with ``lead = 0``, the library's message frozen at the
  boundary, which needs more bandwidth). ``slowdowns``: table 1 of both papers, the
  hours at 1 Gbit/s over the hours at infinite bandwidth, 1 / U(1 Gbit/s):
  data-parallel (bf16, every step), tau = 1 FP4, and tau = H = 100 FP4 (a whole round
  in flight, the eager paper's, hidden entirely at 1 Gbit/s).

  ``not_reproduced``: the eager paper's table 5 rows at H = 30 and its tau = H rows,
  with the model's bandwidths (tau = H without lead): 32% to 100% off (its H = 100,
  tau = 1 row repeats table 4's FP4 row, reproduced in ``rows``). No model in
  which a link carries the fragments' bytes at W fits them: tau = H = 100 in FP4 moves
  8 x 0.5 Gbit per 100 x 0.1 s, 0.4 Gbit/s on average, so at the table's 0.2 Gbit/s for
  99% no schedule passes 50%; at H = 30, tau = 1, one fragment every 3.75 steps, 0.5
  Gbit at 2 Gbit/s takes 0.25 s against 0.375 s of compute, so even never hidden it
  leaves 60%, where the table needs 2.4 Gbit/s for 50%; and its tau = H rows need 10 to
  12 times the bandwidth at H = 30 as at H = 100, for 3.3 times the bytes per second.
  Their simulator's schedule is not published with them.
  """
  network = dict(workers=SIMULATION["workers"], overlap=OVERLAP, alpha=0.0)
  step, h = SIMULATION["step_s"], SIMULATION["sync_every"]
  fp4, bf16 = SIMULATION["fp4_bytes"], SIMULATION["bf16_bytes"]
  levels = PAPER_OVERLAP["utilisations"]

  def gbit(profile: dict) -> list[float]:
    return [bandwidth_for(u, profile, step, **network) for u in levels]

  def row(label: str, paper: tuple, model: list[float], **schedule) -> dict:
    errors = [m / g - 1 for m, g in zip(model, paper, strict=True)]
    return dict(source=label, **schedule, paper_gbit=list(paper), gbit=model, errors=errors)

  rows = {}
  for name, bytes_per_param, tau in (
    ("streaming_diloco", bf16, 0),
    ("overlapped", bf16, 1),
    ("overlapped_fp4", fp4, 1),
  ):
    label, paper = PAPER_OVERLAP["table_4"][name]
    ahead = lead if tau else 0.0
    rows[name] = row(
      label,
      paper,
      gbit(_simulated_profile(bytes_per_param, h, tau, ahead)),
      bytes_per_param=bytes_per_param,
      sync_every=h,
      tau=tau,
      lead=ahead,
    )
    if tau:
      rows[name]["library_gbit"] = gbit(_simulated_profile(bytes_per_param, h, tau, 0.0))

  slowdowns = {}
  for name, profile in (
    ("data_parallel", sync_every_profile(SIMULATION["params"] * bf16, 1)),
    ("overlapped_fp4", _simulated_profile(fp4, h, 1, lead)),
    ("outer_step_fp4", _simulated_profile(fp4, h, h, 0.0)),
  ):
    label, (fast, slow) = PAPER_OVERLAP["table_1_hours"][name]
    model = 1 / utilisation(profile, step, 1.0, **network)
    slowdowns[name] = dict(
      source=label, paper=slow / fast, model=model, error=model * fast / slow - 1
    )

  not_reproduced = {}
  for name, period, tau, ahead in (
    ("inner_fp4_h30", 30, 1, lead),
    ("outer_fp4_h30", 30, 30, 0.0),
    ("outer_fp4_h100", h, h, 0.0),
  ):
    label, paper = PAPER_OVERLAP["eager_table_5"][name]
    model = gbit(_simulated_profile(fp4, period, tau, ahead))
    schedule = dict(bytes_per_param=fp4, sync_every=period, tau=tau, lead=ahead)
    not_reproduced[name] = row(label, paper, model, **schedule)

  errors = [e for r in rows.values() for e in r["errors"]]
  errors += [s["error"] for s in slowdowns.values()]
  return {
    "assumptions": "1B parameters in 8 fragments of 3 of 24 layers, H = 100, 0.1 s per "
    "step, M = 2, no latency, a step's own reduction under 2/3 of it, chunks under all "
    f"of it, lead {lead:.3g} of the boundary step; bf16 2 bytes, FP4 0.5 byte per "
    "parameter",
    "utilisations": list(levels),
    "rows": rows,
    "slowdowns": slowdowns,
    "not_reproduced": not_reproduced,
    "max_abs_error": max(abs(e) for e in errors),
  }


def direct_profiles(config: Config, rank: int, only: tuple[str, ...] | None = None) -> dict:
  """The ledger profile of every method (or of ``only``) on all of ``config``'s shapes at
  ``rank``; every 2-D leaf but the embeddings low-rank, as in the paper."""
  shapes = param_shapes(config)
  chosen = methods(rank, communication_table.no_embeddings(shapes))
  return {
    name: ledger_profile(tx, shapes, period)
    for name, (period, tx) in chosen.items()
    if only is None or name in only
  }


# The vocabularies of the two small programs :func:`profiles` extrapolates from.
PROBE_VOCABS = (64, 128)


def profiles(config: Config, rank: int, only: tuple[str, ...] | None = None) -> dict:
  r""":func:`direct_profiles` of ``config``, measured on three small models of its family.

  The ledger sums what each leaf sends. The L blocks are identical, and the token
  embedding (V x d, full-rank in every method) sends a fixed number of bytes per row,
  so with ``b(l, v)`` the bytes (or all-reduce calls) of a step of the model with
  ``l`` layers and a vocabulary of ``v``, the whole model's are

  .. math::
    b(L, V) = b(1, v_1) + (L - 1)(b(2, v_1) - b(1, v_1))
      + \frac{V - v_1}{v_2 - v_1} (b(1, v_2) - b(1, v_1))

  with ``v_1, v_2`` = :data:`PROBE_VOCABS` (an exact integer: the last difference is a
  multiple of ``v_2 - v_1``, checked). The :data:`OVERLAPPED` methods are measured on
  the whole model (a chunk is the message's size over K, rounded up: not linear in the
  layers), each step hidden under its whole step (``"hide"``).

  Three small programs instead of one with L blocks and 50,257 rows (GPT-2 large's 36
  blocks take minutes to compile on 2 cores, and its embedding's AdamW seconds a step);
  the test compares it with :func:`direct_profiles` on a 3-layer model, every method,
  every step.
  """
  v1, v2 = PROBE_VOCABS
  names = tuple(methods(rank, None)) if only is None else only
  overlapped = tuple(name for name in names if name in OVERLAPPED)
  probed = tuple(name for name in names if name not in OVERLAPPED)
  probe = lambda n, v: direct_profiles(config._replace(n_layer=n, vocab=v), rank, probed)  # noqa: E731
  one, two, wide = probe(1, v1), probe(2, v1), probe(1, v2)
  result = {name: _hidden(p) for name, p in direct_profiles(config, rank, overlapped).items()}
  order = {name: i for i, name in enumerate(names)}
  for name, p1 in one.items():
    result[name] = {"period": p1["period"]}
    for key in ("bytes", "all_reduces"):
      rows = zip(p1[key], two[name][key], wide[name][key], strict=True)
      result[name][key] = [
        a + (config.n_layer - 1) * (b - a) + _per_row(w - a, v2 - v1) * (config.vocab - v1)
        for a, b, w in rows
      ]
  return dict(sorted(result.items(), key=lambda item: order[item[0]]))


def _hidden(profile: dict) -> dict:
  """A whole round in flight: every step's chunk hides under the whole step."""
  return {**profile, "hide": [1.0] * profile["period"]}


def _per_row(difference: int, rows: int) -> int:
  """``difference / rows``, which must be exact (bytes per embedding row)."""
  if difference % rows:
    raise ValueError(f"{difference} bytes over {rows} embedding rows is not a whole number")
  return difference // rows


@functools.cache
def _gpt2_small_profile(method: str, rank: int) -> dict:
  return profiles(GPT2_SMALL, rank, only=(method,))[method]


def bandwidth_for_utilisation(
  method: str, utilisation_target: float = 0.9, rank: int | None = None, **network
) -> float | None:
  """Gbit/s per worker at which ``method`` (a quality-study variant name) keeps GPT-2 small
  ``utilisation_target`` busy, under this module's defaults (H100 at 40% MFU, 64 x 1024
  tokens per worker-step, M = 8, overlap 2/3, K = T = 16, rank d/4 = 192 by default).

  Measures the ledger once per (method, rank), in about a second, and caches it.

  Examples:
    >>> round(bandwidth_for_utilisation("ddp"), 1)  # doctest: +SKIP
    52.5
  """
  profile = _gpt2_small_profile(method, rank or GPT2_SMALL.d_model // 4)
  return bandwidth_for(utilisation_target, profile, step_seconds(GPT2_SMALL), **network)


def steps_ratios(path: pathlib.Path = RATIOS_FILE) -> list[dict]:
  """Per target of ``time_to_target.json``: each method's steps to it over DDP's (None
  where the method never reaches it)."""
  record = json.loads(path.read_text())
  targets = []
  for table in record["targets"]:
    steps = {m["variant"]: m["step"] for m in table["methods"]}
    ratios = {k: (s / steps["ddp"] if s else None) for k, s in steps.items()}
    targets.append({"val_loss": table["val_loss"], "steps": steps, "ratios": ratios})
  return targets


def ddp_steps(config: Config) -> int:
  """DDP's steps for a Chinchilla budget: 20 tokens per parameter, M x tokens per step."""
  return math.ceil(CHINCHILLA_TOKENS_PER_PARAM * n_params(config) / (WORKERS * TOKENS_PER_STEP))


def time_to_target(steps: float, profile: dict, compute_s: float, gbit: float, **network):
  """Seconds for ``steps`` steps: steps x the period's mean step time, C / U(W)."""
  return steps * period_seconds(profile, compute_s, gbit, **network) / profile["period"]


def faster_than(run: tuple, other: tuple, compute_s: float, **network) -> dict:
  """Where ``run`` = (steps, profile) takes less time than ``other``, over 1 Mbit/s to
  10 Tbit/s per worker: ``{"when": "always" | "never" | "below" | "above", "gbit": W}``,
  W the crossing (bisection in log W from a grid of 8 points per decade; one crossing)."""

  def ahead(gbit: float) -> bool:
    mine = time_to_target(*run, compute_s, gbit, **network)
    return mine < time_to_target(*other, compute_s, gbit, **network)

  grid = [10 ** (k / 8) for k in range(-24, 33)]
  marks = [ahead(g) for g in grid]
  if all(marks) or not any(marks):
    return {"when": "always" if marks[0] else "never", "gbit": None}
  i = next(i for i in range(len(grid) - 1) if marks[i] != marks[i + 1])
  lo, hi = grid[i], grid[i + 1]
  for _ in range(60):
    mid = math.sqrt(lo * hi)
    lo, hi = (mid, hi) if ahead(mid) == marks[i] else (lo, mid)
  return {"when": "below" if marks[i] else "above", "gbit": hi}


def method_rows(config: Config, rank: int, found: dict, targets: list[dict], **network) -> list:
  """Per method on ``config`` at ``rank``: bytes, utilisation by bandwidth, the bandwidths
  of 90% and 95% (overlap f and f = 0), and seconds to each target at 1, 10, 100 Gbit/s."""
  c, rows = step_seconds(config), []
  strict = dict(network, overlap=0.0)
  for name, p in found.items():
    row = {
      "method": name,
      "rank": rank if name in RANKED else None,
      "bytes_per_step": sum(p["bytes"]) / p["period"],
      "profile": p,
      "utilisation": {str(g): utilisation(p, c, g, **network) for g in BANDWIDTHS_GBIT},
      "gbit_for": {str(u): bandwidth_for(u, p, c, **network) for u in UTILISATIONS},
      "gbit_for_no_overlap": {str(u): bandwidth_for(u, p, c, **strict) for u in UTILISATIONS},
      "time_to_target_s": [],
    }
    for target in targets:
      ratio = target["ratios"].get(name)
      steps = None if ratio is None else ratio * ddp_steps(config)
      seconds = {
        str(g): None if steps is None else time_to_target(steps, p, c, g, **network)
        for g in TIME_BANDWIDTHS_GBIT
      }
      ddp = (target["ratios"]["ddp"] * ddp_steps(config), found["ddp"])
      versus = None if steps is None else faster_than((steps, p), ddp, c, **network)
      row["time_to_target_s"].append(
        {"val_loss": target["val_loss"], "steps": steps, "seconds": seconds, "vs_ddp": versus}
      )
    rows.append(row)
  return rows


def analyse(quick: bool, ratios_file: pathlib.Path = RATIOS_FILE, small_only: bool = False):
  """Every model size and rank, every method (``small_only``: GPT-2 small at d/4; quick:
  that, for :data:`QUICK_METHODS`)."""
  targets = steps_ratios(ratios_file)
  small_only = small_only or quick
  configs = CONFIGS[:1] if small_only else CONFIGS
  sizes = []
  for config in configs:
    ranks = [config.d_model // 4] + ([] if small_only else [32])
    base = profiles(config, ranks[0], QUICK_METHODS if quick else None)
    for rank in ranks:
      found = base if rank == ranks[0] else {**base, **profiles(config, rank, only=RANKED)}
      sizes.append(
        {
          "config": config._asdict(),
          "params": n_params(config),
          "matmul_params": matmul_params(config),
          "flops_per_token": flops_per_token(
            matmul_params(config), config.n_layer, config.context, config.d_model
          ),
          "step_s": step_seconds(config),
          "ddp_steps": ddp_steps(config),
          "rank": rank,
          "methods": method_rows(config, rank, found, targets),
        }
      )
  return {
    "assumptions": {
      "peak_flops": PEAK_FLOPS,
      "mfu": MFU,
      "workers": WORKERS,
      "tokens_per_worker_step": TOKENS_PER_STEP,
      "overlap": OVERLAP,
      "alpha_s": ALPHA_S,
      "sync_every": K,
      "refresh_every": T,
      "chinchilla_tokens_per_param": CHINCHILLA_TOKENS_PER_PARAM,
      "bytes": "float32 payload, lordo_jax.communicated_bytes after each step",
    },
    "validation": streaming_diloco_check(),
    "targets": targets,
    "ratios_file": str(ratios_file.relative_to(studies.ROOT)),
    "sizes": sizes,
  }


def _g(x: float | None, fmt: str = ".3g") -> str:
  return "-" if x is None else format(x, fmt)


def _versus(v: dict | None) -> str:
  if v is None:
    return "-"
  return v["when"] if v["gbit"] is None else f"{v['when']} {v['gbit']:.3g} Gbit/s"


def size_tables(size: dict, targets: list[dict]) -> list[str]:
  """One model size at one rank: utilisation by bandwidth, then time to each target."""
  c = size["config"]
  lines = [
    f"**{c['name']}** ({c['n_layer']} layers, d = {c['d_model']}, {c['n_head']} heads; "
    f"{size['params']:,} parameters, N = {size['matmul_params']:,}; low-rank methods at "
    f"r = {size['rank']}): {size['flops_per_token'] / 1e9:.3f} GFLOP per token, "
    f"C = {1e3 * size['step_s']:.1f} ms per step; DDP's Chinchilla run: "
    f"{size['ddp_steps']:,} steps.",
    "",
  ]
  header = ["method", "MB / step"] + [f"U @ {g}" for g in BANDWIDTHS_GBIT]
  header += [f"Gbit/s for {u:.0%}" for u in UTILISATIONS]
  header += [f"{u:.0%}, no overlap" for u in UTILISATIONS]
  rows = []
  for m in size["methods"]:
    rows.append(
      [m["method"], f"{m['bytes_per_step'] / 1e6:.1f}"]
      + [f"{m['utilisation'][str(g)]:.2f}" for g in BANDWIDTHS_GBIT]
      + [_g(m["gbit_for"][str(u)]) for u in UTILISATIONS]
      + [_g(m["gbit_for_no_overlap"][str(u)]) for u in UTILISATIONS]
    )
  lines += studies.table(header, rows) + [""]
  header = ["method"]
  for t in targets:
    header += [f"steps to {t['val_loss']:.4f} (x DDP)"]
    header += [f"hours @ {g} Gbit/s" for g in TIME_BANDWIDTHS_GBIT] + ["before DDP"]
  rows = []
  for m in size["methods"]:
    row = [m["method"]]
    for t, reached in zip(targets, m["time_to_target_s"], strict=True):
      ratio = t["ratios"].get(m["method"])
      if m["method"] not in t["ratios"]:
        row.append("not measured")  # no quality run of this variant
      elif ratio is None:
        row.append("not reached")
      else:
        row.append(f"{reached['steps']:,.0f} ({ratio:.2f})")
      row += [_g(None if s is None else s / 3600) for s in reached["seconds"].values()]
      row.append(_versus(reached["vs_ddp"]) if m["method"] != "ddp" else "-")
    rows.append(row)
  return [*lines, *studies.table(header, rows), ""]


def markdown_lines(result: dict) -> list[str]:
  """The validation, then the tables of every size and rank, then the plot."""
  v = result["validation"]
  lines = [
    "Validation against the Streaming DiLoCo simulation (arXiv 2501.18512, table 4; "
    f"{v['assumptions']}): bandwidth for 95% compute utilisation, data-parallel "
    f"{v['data_parallel_gbit']:.1f} Gbit/s (paper: {v['paper_data_parallel_gbit']:.0f}, "
    f"{v['data_parallel_error']:+.1%}), DiLoCo {v['diloco_gbit']:.1f} Gbit/s (paper: "
    f"{v['paper_diloco_gbit']:.0f}, {v['diloco_error']:+.1%}).",
    "",
  ]
  for size in result["sizes"]:
    lines += size_tables(size, result["targets"])
  return [*lines, f"![compute utilisation against bandwidth]({PLOT})"]


PLOT = "accelerator_model.png"


def plot(result: dict, path: pathlib.Path) -> None:
  """Utilisation against bandwidth per worker, one panel per model size (rank d/4)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np

  sizes = [s for s in result["sizes"] if s["rank"] == s["config"]["d_model"] // 4]
  fig, axes = plt.subplots(
    1, len(sizes), figsize=(4.6 * len(sizes), 4.0), sharey=True, squeeze=False
  )
  gbits = np.geomspace(0.1, 400, 200)
  for ax, size in zip(axes[0], sizes, strict=True):
    for m in size["methods"]:
      u = [utilisation(m["profile"], size["step_s"], g) for g in gbits]
      style = ":" if m["method"] in OVERLAPPED else "--" if "projection" in m["method"] else "-"
      ax.plot(gbits, u, label=m["method"], linestyle=style)
    for level in UTILISATIONS:
      ax.axhline(level, color="gray", linewidth=0.6, linestyle=":")
    ax.set_xscale("log")
    ax.set_title(f"{size['config']['name']}, r = {size['rank']}", fontsize=10)
    ax.set_xlabel("bandwidth per worker (Gbit/s)")
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel("compute utilisation")
  axes[0][-1].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


NOTES = [
  "Compute per step C = tokens (6 N + 12 L T d) / (peak x MFU): N the parameters in a "
  "matmul (all but the position embeddings), L layers, T = 1024, d the width; 64 x 1024 "
  "tokens per worker-step; peak 989 TFLOP/s (H100 SXM, bf16 dense), MFU 40%. Optimizer "
  "compute (AdamW, SVDs) not counted.",
  "Bytes: lordo_jax.communicated_bytes and all_reduce_count after each step of each "
  "method's second period, on the real float32 shapes (one worker of a one-device "
  "shard_map); MB = 10^6 bytes, the period's mean per step.",
  "U(W) = P C / sum_s (C + max(0, tau_s - f C)), tau_s = 2(M-1)/M x 8 b_s / W + 50 us x "
  "calls; M = 8 workers, one H100 each; f = 2/3 (communication hides under the backward "
  "pass, the Streaming DiLoCo simulation's assumption); 'no overlap': f = 0.",
  "K = 16 for every local-update method, low-rank DDP's T = 16, as in the quality "
  "study; every 2-D leaf but the embeddings low-rank.",
  "Time to target: DDP's Chinchilla steps (20 tokens per parameter in 0.5M-token steps) x "
  "the method's steps-to-target ratio from the quality study's LM runs "
  "(time_to_target.json; 0.47M parameters: an extrapolation) x the mean step time C / U. "
  "'before DDP': the bandwidths per worker at which the method reaches the target before "
  "DDP does, under the same model.",
]


EXAMPLES_TABLE = studies.ROOT / "examples" / "lm" / "bandwidth_gpt2_small.json"


def examples_table(result: dict) -> dict:
  """What ``examples/main.py`` prints: per method, the Gbit/s per worker for 90% and 95%
  compute utilisation on GPT-2 small at r = d/4 (overlap f = 2/3), with the assumptions."""
  small = (GPT2_SMALL.name, GPT2_SMALL.d_model // 4)
  size = next(s for s in result["sizes"] if (s["config"]["name"], s["rank"]) == small)
  a = result["assumptions"]
  return {
    "generated_by": "python benchmarks/communication/accelerator_model.py --small-only "
    "--examples-table "
    f"{EXAMPLES_TABLE.relative_to(studies.ROOT)}",
    "model": f"{GPT2_SMALL.name}, {size['params']:,} parameters",
    "assumptions": f"{WORKERS} workers, one H100 each ({a['peak_flops'] / 1e12:g} TFLOP/s "
    f"bf16 dense at {a['mfu']:.0%} MFU, 64 x 1024 tokens per worker-step: "
    f"{1e3 * size['step_s']:.0f} ms per step), ring all-reduce of the float32 ledger "
    f"bytes overlapped with the backward pass, K = T = {K}, r = {size['rank']}",
    "gbit_for": {m["method"]: m["gbit_for"] for m in size["methods"]},
  }


def add_options(parser) -> None:
  """``--small-only``; ``--examples-table PATH``: also write :func:`examples_table`."""
  parser.add_argument(
    "--small-only",
    action="store_true",
    help="GPT-2 small at r = d/4 only, every method (the larger models take hours on 2 cores)",
  )
  parser.add_argument(
    "--examples-table",
    type=pathlib.Path,
    default=None,
    help=f"also write the table examples/main.py prints (the file it reads is {EXAMPLES_TABLE})",
  )


def main(argv=None) -> int:
  args = studies.parse_args(
    __doc__, "GPT-2 small, DDP and DiLoCo only (a minute)", argv, extra=add_options
  )
  result = analyse(args.quick, small_only=args.small_only)
  args.flags = ["--small-only"] if args.small_only and not args.quick else []
  if args.examples_table is not None:
    args.flags.append(f"--examples-table {args.examples_table}")
    args.examples_table.write_text(json.dumps(examples_table(result), indent=1) + "\n")
    print(f"wrote {args.examples_table}")
  studies.write(
    "accelerator_model",
    args,
    result,
    "Compute utilisation and time to target on accelerators, against bandwidth",
    markdown_lines(result),
    NOTES,
  )
  plot(result, args.out / PLOT)
  print(f"wrote {args.out / PLOT}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
