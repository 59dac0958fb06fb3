"""Test configuration: eight simulated CPU devices, set once before JAX starts."""

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
