"""A module marked ``no_compilation_cache`` compiles without the persistent cache, and
so do the processes its tests start (tests/conftest.py)."""

import os
import subprocess
import sys

import jax
import pytest
from test_compilation_cache import CODE
from test_compilation_cache import compile_something_new
from test_compilation_cache import entries

pytestmark = pytest.mark.no_compilation_cache


def test_nothing_is_written_to_the_cache():
  assert not jax.config.jax_enable_compilation_cache
  compile_something_new("cache_probe_off", 5.4321)
  assert not entries("cache_probe_off")
  child = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
  assert child.stdout.strip() == "False"
  assert os.environ["JAX_ENABLE_COMPILATION_CACHE"] == "false"
