"""benchmarks/memory/sharded_memory.py on one GPT-2 small layer: per-device state read
from the shards halves when the worker group doubles, and offload moves the anchor."""

import math
import pathlib
import sys

import jax
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from benchmarks.communication import communication_table as table  # noqa: E402
from benchmarks.memory import sharded_memory  # noqa: E402

# Host-offloaded state: without the compilation cache (tests/conftest.py).
pytestmark = [pytest.mark.timeout(300, method="thread"), pytest.mark.no_compilation_cache]
SHAPES = table.gpt2_shapes(1, table.D, 256, 32)  # r = 192 needs the real width.
COUNTERS = 200  # Bytes of step counters, ledgers and flags, whole on every device.


def _sizes(name, offload, f):
  (factory,) = [make for row, make in sharded_memory.methods(table.no_embeddings) if row == name]
  return sharded_memory.measure_one(lambda: factory(offload), SHAPES, f)


def test_the_smallest_divisible_dimension_is_split():
  assert sharded_memory.fsdp_spec((768, 3072), 8) == jax.sharding.PartitionSpec("fsdp")
  assert sharded_memory.fsdp_spec((3072, 768), 8) == jax.sharding.PartitionSpec(None, "fsdp")
  assert sharded_memory.fsdp_spec((50257, 768), 8) == jax.sharding.PartitionSpec(None, "fsdp")
  assert sharded_memory.fsdp_spec((7,), 2) == jax.sharding.PartitionSpec()


@pytest.mark.parametrize("name", ["AdamW", "LoRDO", "DiLoCo"])
def test_per_device_state_halves_with_the_group(name):
  one, two = _sizes(name, False, 1), _sizes(name, False, 2)
  assert one["pinned_host"] == two["pinned_host"] == 0
  assert two["device"] <= one["device"] / 2 + COUNTERS
  assert one["whole"] == two["whole"]


def test_offload_puts_the_anchor_in_host_memory_split_like_it():
  parameters = sum(math.prod(s.shape) for s in jax.tree.leaves(SHAPES))
  plain, offloaded = _sizes("LoRDO", False, 2), _sizes("LoRDO", True, 2)
  assert offloaded["pinned_host"] == 4 * parameters // 2  # The anchor, float32, halved.
  assert offloaded["device"] + offloaded["pinned_host"] == plain["device"]
