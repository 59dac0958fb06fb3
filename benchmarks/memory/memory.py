r"""Optimizer-state memory per method on GPT-2 small's shapes: on device, and offloadable.

    python benchmarks/memory/memory.py           # every method at r = 192, LoRDO at 4 ranks
    python benchmarks/memory/memory.py --quick   # the same (it allocates nothing: seconds)

Every number is ``lordo_jax.state_bytes(jax.eval_shape(tx.init, params))`` of one
worker's state, so no GPT-2-sized array is ever allocated, split as ``offload=True``
places it (``communication_table.offloaded``): ``device`` is what each step reads and
writes (moments, bases, error buffers, counters, ledgers); ``host`` is what only a sync
touches (the anchor, and DiLoCo's outer momentum), which ``offload=True`` keeps in host
memory (MATH.md §8; without offload it is on the device too).

The shapes, the methods and their settings (r = d/4 = 192, K = 16, T = 200;
embeddings on the full-rank path, as in the paper) are those of
``communication_table.py``, imported from it. Added here: LoRDO with the ``dct``
projection (r int32 frequencies per matrix instead of an ``n x r`` basis) and with
error feedback (a ``p x q`` buffer per matrix, float32 or bfloat16), two-sided
projection (U and V per matrix, ``r x r`` moments), and LoRDO at
several ranks.

Each LoRDO row is checked against MATH.md §8's formula: per ``p x q`` low-rank
matrix, left case when p >= q, with :math:`n = \max(p, q)`, :math:`m = \min(p, q)`,

.. math::
  \text{device} = 4\,(n r + 2 r m) \;[+\, b\, p q \text{ with error feedback}],
  \qquad \text{host} = 4\, p q,

(``dct``: :math:`4 r` instead of :math:`4 n r`; two-sided: :math:`4\,((p + q) r + 2 r^2)`;
b = 4 or 2 bytes), plus AdamW's
:math:`2 \cdot 4` bytes per element of every full-rank leaf on device and its anchor
on host. The difference (``counters`` in the JSON) is the counters and ledgers.
"""

import math
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks.*

import jax

import lordo_jax
from benchmarks.communication import communication_table as table
from benchmarks.harness import studies

RANKS = (64, 128, 192, 384)
MB = 1e6


def variants(rank: int) -> list[tuple[str, str, dict]]:
  """(name, what differs, lordo options) of the LoRDO variants beyond the shared methods."""
  return [
    ("LoRDO, dct", f"r = {rank} DCT frequencies per matrix", dict(projection="dct")),
    (
      "LoRDO, error feedback float32",
      "+ p x q float32 buffer per matrix",
      dict(error_feedback=True),
    ),
    (
      "LoRDO, error feedback bfloat16",
      "+ p x q bfloat16 buffer per matrix",
      dict(error_feedback=True, error_feedback_dtype="bfloat16"),
    ),
    (
      "LoRDO, two-sided (TSR)",
      "U and V per matrix, r x r moments",
      dict(two_sided=True, projection="randomized_svd"),
    ),
  ]


def lordo(rank: int, labels, **options):
  return lordo_jax.lordo(
    1e-3, rank=rank, sync_every=table.K, low_rank_labels=labels, axis_name=table.AXIS, **options
  )


def spec_formula(shapes, labels, rank: int, options: dict) -> dict[str, int]:
  """MATH.md §8's bytes of a LoRDO state, without counters and ledgers."""
  marks = labels(shapes) if labels else jax.tree.map(lambda x: len(x.shape) == 2, shapes)
  device = host = 0
  for x, low_rank in zip(jax.tree.leaves(shapes), jax.tree.leaves(marks), strict=True):
    size = math.prod(x.shape)
    host += 4 * size
    if not low_rank:
      device += 2 * 4 * size
      continue
    n, m = max(x.shape), min(x.shape)
    if options.get("two_sided"):
      device += 4 * rank * (n + m) + 4 * 2 * rank * rank
    else:
      device += 4 * rank * (1 if options.get("projection") == "dct" else n) + 4 * 2 * rank * m
    if options.get("error_feedback"):
      device += (2 if options.get("error_feedback_dtype") == "bfloat16" else 4) * size
  return {"device": device, "host": host}


def row(name: str, what: str, tx, shapes, blocks_tx, blocks) -> dict:
  whole = table.offloaded(lordo_jax.state_bytes(jax.eval_shape(tx.init, shapes)))
  only_blocks = table.offloaded(lordo_jax.state_bytes(jax.eval_shape(blocks_tx.init, blocks)))
  return {"method": name, "what": what, "whole": whole, "blocks": only_blocks}


def measure() -> dict:
  shapes, blocks = table.gpt2_small_shapes(), table.gpt2_small_shapes(embeddings=False)
  shared = zip(
    table.methods(table.RANK, table.K, table.T, table.no_embeddings),
    table.methods(table.RANK, table.K, table.T, None),
    strict=True,
  )
  rows = [row(name, what, tx, shapes, btx, blocks) for (name, what, _, tx), (*_, btx) in shared]
  for name, what, options in variants(table.RANK):
    tx, btx = lordo(table.RANK, table.no_embeddings, **options), lordo(table.RANK, None, **options)
    rows.append(row(name, what, tx, shapes, btx, blocks))
  checks = [({}, table.RANK)] + [(options, table.RANK) for *_, options in variants(table.RANK)]
  ranks = []
  for rank in RANKS:
    for projection in ("svd", "dct"):
      tx = lordo(rank, table.no_embeddings, projection=projection)
      measured = table.offloaded(lordo_jax.state_bytes(jax.eval_shape(tx.init, shapes)))
      formula = spec_formula(shapes, table.no_embeddings, rank, {"projection": projection})
      ranks.append(
        {"rank": rank, "projection": projection, "measured": measured, "formula": formula}
      )
  formula_checks = []
  for options, rank in checks:
    tx = lordo(rank, table.no_embeddings, **options)
    measured = table.offloaded(lordo_jax.state_bytes(jax.eval_shape(tx.init, shapes)))
    formula = spec_formula(shapes, table.no_embeddings, rank, options)
    formula_checks.append(
      {
        "options": options,
        "rank": rank,
        "measured": measured,
        "formula": formula,
        "counters": measured["device"] - formula["device"],
      }
    )
  return {"rows": rows, "ranks": ranks, "formula_checks": formula_checks}


def markdown(result: dict) -> list[str]:
  adamw = result["rows"][0]
  header = ["method", "what it is", "device MB", "host MB", "device vs AdamW"]
  header += ["blocks only: device MB", "host MB", "device vs AdamW"]
  body = []
  for r in result["rows"]:
    w, b = r["whole"], r["blocks"]
    body.append(
      [
        r["method"],
        r["what"],
        f"{w['device'] / MB:.1f}",
        f"{w['host'] / MB:.1f}",
        f"{w['device'] / adamw['whole']['device']:.2f}",
        f"{b['device'] / MB:.1f}",
        f"{b['host'] / MB:.1f}",
        f"{b['device'] / adamw['blocks']['device']:.2f}",
      ]
    )
  lines = studies.table(header, body, align="ll" + "r" * (len(header) - 2))
  lines += ["", f"LoRDO at other ranks (whole model; K = {table.K}):", ""]
  body = [
    [
      r["rank"],
      r["projection"],
      f"{r['measured']['device'] / MB:.1f}",
      f"{r['measured']['host'] / MB:.1f}",
      f"{r['measured']['device'] / adamw['whole']['device']:.2f}",
      f"{r['formula']['device'] / MB:.1f}",
    ]
    for r in result["ranks"]
  ]
  header = ["r", "projection", "device MB", "host MB", "device vs AdamW", "MATH.md §8 formula MB"]
  return lines + studies.table(header, body, align="rl" + "r" * 4)


def main(argv=None) -> int:
  args = studies.parse_args(
    __doc__, "the same study (it allocates nothing and takes seconds)", argv
  )
  start = time.perf_counter()
  result = measure()
  counters = max(c["counters"] for c in result["formula_checks"])
  notes = [
    "Bytes of one worker's optimizer state, lordo_jax.state_bytes of "
    "jax.eval_shape(tx.init, params) (nothing allocated); MB = 10^6 bytes.",
    "GPT-2 small (124,439,808 float32 parameters; 48 matrices low-rank; embeddings, "
    "biases and norms on the full-rank AdamW path); 'blocks only' drops the "
    f"embeddings. r = {table.RANK}, K = {table.K}, T = {table.T}, as in the "
    "communication table.",
    "device: read and written every step (moments, bases, error buffers, counters). "
    "host: the anchor and the outer optimizer's state, touched only at a sync, which "
    "offload=True keeps in host memory (without it they are on the device too).",
    "Every LoRDO number equals MATH.md §8's formula (see memory.py) plus at most "
    f"{counters} bytes of counters and ledgers.",
  ]
  studies.write(
    "memory",
    args,
    {**result, "wall_time_s": time.perf_counter() - start},
    "Optimizer state per worker on GPT-2 small shapes: on device and host-offloadable",
    markdown(result),
    notes,
  )
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
