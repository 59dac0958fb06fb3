"""The suite's persistent compilation cache (tests/conftest.py) is on, but not for a
module marked ``no_compilation_cache`` nor for the processes its tests start."""

import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp

CODE = "import jax; print(jax.config.jax_enable_compilation_cache)"


def entries() -> set[str]:
  return set(os.listdir(os.environ["JAX_COMPILATION_CACHE_DIR"]))


def compile_something_new(seed: float) -> None:
  """A program no other test compiles: its constant is this test's own."""
  jax.block_until_ready(jax.jit(lambda x: jnp.sin(x) * seed)(jnp.ones(3)))


def test_a_new_program_is_written_to_the_cache():
  assert pathlib.Path(os.environ["JAX_COMPILATION_CACHE_DIR"]).is_dir()
  before = entries()
  compile_something_new(1.2345)
  assert entries() - before
  child = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
  assert child.stdout.strip() == "True"
