"""The environment of a process that compiles for GPUs on this CPU (JAX's deviceless
ahead-of-time compile with the CUDA plugin of the test extra)."""

import importlib.util
import os

from tests.helpers import xla_settings


def environment() -> dict[str, str]:
  """This process's environment with ``JAX_PLATFORMS=cpu`` (without it, on a host with no
  GPU the plugin fails its CUDA check before it registers its compiler) and without the
  suite's quick compile (the program a user's compile gives); a failure that says what to
  install where the plugin is missing."""
  if importlib.util.find_spec("jax_plugins.xla_cuda12") is None:
    raise AssertionError(
      "jax's CUDA plugin (jax_plugins.xla_cuda12) is not installed in this Python: the "
      "test compiles for a GPU on this CPU with it. Install the test extra: pip install "
      "-e '.[test]' (it brings jax[cuda12-local]: the plugin and its PJRT, no driver)."
    )
  return xla_settings.without_quick_compile({**os.environ, "JAX_PLATFORMS": "cpu"})
