"""What the main command needs before JAX starts: tuned learning rates, bandwidths.

``TUNED_LEARNING_RATES``: each method's best peak learning rate in the quality study's
sweep of 1e-3, 2e-3, 5e-3, 1.25e-2 and 3e-2 (``BENCHMARKS.md``, "Quality against
communication"; ``benchmarks/results/quality.json``, ``best_lr``), on the main
command's defaults: the small preset, 256 steps, 8 workers x 8 windows, r = 32,
K = T = 16, 32 warmup steps, cosine decay to a tenth.

:func:`bandwidth_table`: per method, the bandwidth per worker (Gbit/s) at which it
keeps 90% (and 95%) of an H100's compute busy training GPT-2 small on 8 workers,
under the accelerator model of ``benchmarks/communication/accelerator_model.py`` (which writes
``bandwidth_gpt2_small.json``; a test regenerates it). Nothing here imports JAX.
"""

import json
import pathlib

TUNED_LEARNING_RATES = {
  "lordo": 1.25e-2,
  "low_rank_ddp": 1.25e-2,
  "ddp": 2e-3,
  "diloco": 1e-3,
  "local_adam": 2e-3,
  "desloc": 1e-3,
  "lordo_local_projection": 5e-3,
  "lordo_global_projection_only": 1.25e-2,
}


def tuned_learning_rate(method: str) -> float | None:
  """``method``'s tuned rate; a named variant of a swept method (``lordo_int8_overlap``,
  not swept on its own) takes its method's, the longest swept name it starts with."""
  if method in TUNED_LEARNING_RATES:
    return TUNED_LEARNING_RATES[method]
  bases = [m for m in TUNED_LEARNING_RATES if method.startswith(f"{m}_")]
  return TUNED_LEARNING_RATES[max(bases, key=len)] if bases else None


BANDWIDTH_TABLE = pathlib.Path(__file__).resolve().parent / "bandwidth_gpt2_small.json"


def bandwidth_table(path: pathlib.Path = BANDWIDTH_TABLE) -> dict:
  """The table of ``benchmarks/communication/accelerator_model.py --examples-table``.

  Returns:
    ``{"model": ..., "assumptions": ..., "generated_by": ..., "gbit_for": {method:
    {"0.9": Gbit/s, "0.95": Gbit/s}}}``; a bandwidth is None where no bandwidth reaches
    that utilisation.
  """
  return json.loads(path.read_text())
