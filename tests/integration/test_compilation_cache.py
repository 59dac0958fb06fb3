"""The suite's persistent compilation cache (tests/conftest.py) is on, but not for a
module marked ``no_compilation_cache`` nor for the processes its tests start."""

import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp

CODE = "import jax; print(jax.config.jax_enable_compilation_cache)"


def entries(name: str) -> set[str]:
  """The cache's entries of the programs named ``name`` (the other test processes of
  the run share the directory and write their own entries at any time)."""
  return {e for e in os.listdir(os.environ["JAX_COMPILATION_CACHE_DIR"]) if name in e}


def compile_something_new(name: str, seed: float) -> None:
  """A program no other test compiles: its name and its constant are this test's own."""

  def program(x):
    return jnp.sin(x) * seed

  program.__name__ = program.__qualname__ = name
  jax.block_until_ready(jax.jit(program)(jnp.ones(3)))


def test_a_new_program_is_written_to_the_cache():
  assert pathlib.Path(os.environ["JAX_COMPILATION_CACHE_DIR"]).is_dir()
  assert not entries("cache_probe_on")
  compile_something_new("cache_probe_on", 1.2345)
  assert entries("cache_probe_on")
  child = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
  assert child.stdout.strip() == "True"
