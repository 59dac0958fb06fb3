"""Test configuration, set once before JAX starts.

* Eight simulated CPU devices.
* No persistent XLA compilation cache: with one shared by the run (2026-11-24), an
  FSDP + offload LM run loaded from it aborted in 1 of 4 runs on jaxlib 0.10.2 CPU (a
  collective rendezvous timed out: devices waiting in different collectives).
* The slowest modules first. ``pytest -n auto --dist loadfile --no-loadscope-reorder``
  (``pyproject.toml``) hands the modules to the workers in collection order, so the
  longest start at once and the short ones fill in around them; a long module handed
  out last would run alone at the end.
"""

import pytest

try:
  import jax
except ImportError as error:  # pytest run from a Python without the project installed
  raise pytest.UsageError(
    f"{error}: this Python lacks the project's dependencies. Run the README's test "
    "command: python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && "
    ".venv/bin/python -m pytest -q"
  ) from error

jax.config.update("jax_num_cpu_devices", 8)

# Seconds per module, summed over its tests (``pytest --durations=0``, 2 cores,
# 2026-11-24); the rest follow in their usual order.
SLOWEST_MODULES = (
  "test_benchmarks_quality.py",  # 362
  "test_sharded_workers.py",  # 222
  "test_benchmarks_accelerator.py",  # 100
  "test_examples.py",  # 81
  "test_golden_runs.py",  # 60
  "test_lm_resume.py",  # 54
  "test_streaming.py",  # 54
  "test_multiprocess_fsdp.py",  # 49
  "test_benchmarks_speed.py",  # 46
  "test_offload.py",  # 46
)


def pytest_collection_modifyitems(items):
  """Moves the modules of :data:`SLOWEST_MODULES` to the front, slowest first."""
  rank = {name: i for i, name in enumerate(SLOWEST_MODULES)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # Stable: order kept.
