r"""Per-device optimizer state on GPT-2 small shapes, F-way FSDP, with and without offload.

    python benchmarks/memory/sharded_memory.py           # F = 1, 2, 4, 8; GPT-2 small (124M)
    python benchmarks/memory/sharded_memory.py --quick   # the same on 2 of its 12 layers

One worker group of F simulated CPU devices (a ``(1, F)`` mesh, ``workers x fsdp``)
holds GPT-2 small's parameters, each leaf split F ways over ``fsdp`` along its smallest
dimension that F divides (a low-rank matrix's kept dimension: see :func:`fsdp_spec`).
The optimizer state is made for real, placed with ``lordo_jax.state_sharding`` (the
layout ``tx.init`` gives inside the worker step: moments, anchor, error buffers and
bases split like their parameter), and every
number is read from the arrays' shards on one device: the bytes of
``addressable_shards`` on device 0, split by the shard's memory kind (``device`` or
``pinned_host``). Nothing is computed from a formula. Methods: AdamW (what DDP keeps),
LoRDO (r = 192, K = 16, embeddings on the full-rank path, as the communication table)
and DiLoCo, each with ``offload=False`` and ``offload=True``.
"""

import math
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks.*

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import lordo_jax
from benchmarks.communication import communication_table as table
from benchmarks.harness import studies

FSDP = (1, 2, 4, 8)
MB = 1e6


def methods(labels):
  """(name, factory of offload) of each row; AdamW has no anchor to offload."""
  return (
    ("AdamW", lambda offload: None if offload else lordo_jax.ddp(1e-3)),
    (
      "LoRDO",
      lambda offload: lordo_jax.lordo(
        1e-3, rank=table.RANK, sync_every=table.K, low_rank_labels=labels, offload=offload
      ),
    ),
    ("DiLoCo", lambda offload: lordo_jax.diloco(1e-3, sync_every=table.K, offload=offload)),
  )


def fsdp_spec(shape: tuple[int, ...], f: int) -> P:
  """``fsdp`` on the leaf's smallest dimension that ``f`` divides; whole if none.

  For a low-rank matrix that is the dimension its moments keep (``r x m``, m the
  smaller side), so its moments split with it, and its ``n x r`` basis splits over
  the same axis along n (``lordo_jax._sharded.split_rows``): every leaf shrinks.
  """
  if f == 1:
    return P()
  # Ties go to the last dimension: a square matrix is projected on the left and keeps q.
  dims = sorted(range(len(shape)), key=lambda i: (shape[i], -i))
  for i in dims:
    if shape[i] % f == 0:
      return P(*(None,) * i, "fsdp")
  return P()


def per_device_bytes(state) -> dict[str, int]:
  """Bytes of device 0's shards of every leaf, by memory kind."""
  sizes = {"device": 0, "pinned_host": 0}
  device = jax.devices()[0]
  for leaf in jax.tree.leaves(state):
    for shard in leaf.addressable_shards:
      if shard.device == device:
        sizes[leaf.sharding.memory_kind or "device"] += shard.data.nbytes
  return sizes


def measure_one(make, shapes, f: int) -> dict[str, int]:
  """The per-device state of ``make()`` for ``shapes`` split ``f`` ways."""
  mesh = jax.make_mesh((1, f), ("workers", "fsdp"), devices=jax.devices()[:f])
  params = jax.tree.map(
    lambda s: jax.ShapeDtypeStruct(
      s.shape, s.dtype, sharding=NamedSharding(mesh, fsdp_spec(s.shape, f))
    ),
    shapes,
  )
  tx = make()
  shardings = lordo_jax.state_sharding(tx, params)
  shapes = params
  zeros = lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)  # noqa: E731
  params = jax.jit(zeros, out_shardings=jax.tree.map(lambda s: s.sharding, shapes))()
  state = jax.jit(tx.init, out_shardings=shardings)(params)
  jax.block_until_ready(state)
  del params
  sizes = per_device_bytes(state)
  whole = lordo_jax.state_bytes(state)
  del state
  return {**sizes, "whole": whole["device"] + whole["host"]}


def measure(quick: bool) -> dict:
  layers = 2 if quick else table.LAYERS
  shapes = table.gpt2_shapes(layers, table.D, 50257, 1024)
  rows = []
  for name, factory in methods(table.no_embeddings):
    for offload in (False, True):
      if factory(offload) is None:
        continue
      for f in FSDP:
        sizes = measure_one(lambda factory=factory, offload=offload: factory(offload), shapes, f)
        rows.append({"method": name, "offload": offload, "fsdp": f, **sizes})
  parameters = sum(math.prod(s.shape) for s in jax.tree.leaves(shapes))
  return {"layers": layers, "parameters": parameters, "rows": rows}


def markdown(result: dict) -> list[str]:
  adamw = {r["fsdp"]: r["device"] for r in result["rows"] if r["method"] == "AdamW"}
  header = ["method", "offload", "F", "device MB per device", "host MB per device"]
  header += ["device vs AdamW at F", "whole state / F, MB"]
  body = [
    [
      r["method"],
      "yes" if r["offload"] else "no",
      r["fsdp"],
      f"{r['device'] / MB:.1f}",
      f"{r['pinned_host'] / MB:.1f}",
      f"{r['device'] / adamw[r['fsdp']]:.2f}",
      f"{r['whole'] / r['fsdp'] / MB:.1f}",
    ]
    for r in result["rows"]
  ]
  return studies.table(header, body, align="llr" + "r" * 4)


def main(argv=None) -> int:
  args = studies.parse_args(__doc__, "2 of GPT-2 small's 12 layers (seconds)", argv)
  start = time.perf_counter()
  result = measure(args.quick)
  notes = [
    f"{result['parameters']:,} float32 parameters ({result['layers']} layers of GPT-2 "
    "small, embeddings included); one worker group of F devices, each leaf split F ways "
    "over its smallest dimension F divides (a low-rank matrix's kept dimension, so its "
    "moments and its basis split too); state placed by lordo_jax.state_sharding.",
    "Per device: the bytes of device 0's shards of every state leaf, by memory kind "
    "(pinned_host: offloaded); MB = 10^6 bytes. 'whole state / F' is the state's total "
    "size over F, what perfect splitting would give; counters and ledgers are whole "
    "on every device.",
  ]
  studies.write(
    "sharded_memory",
    args,
    {**result, "wall_time_s": time.perf_counter() - start},
    "Optimizer state per device under FSDP, with and without offload (GPT-2 small)",
    markdown(result),
    notes,
  )
  return 0


if __name__ == "__main__":
  jax.config.update("jax_num_cpu_devices", 8)
  np.set_printoptions(precision=3)
  raise SystemExit(main())
