"""What a process wrote to stderr, as a test reads it."""

# What jaxlib's CUDA plugin (the test extra's, for deviceless GPU compiles) logs in every
# process that imports jax on a machine without a CUDA driver: not the program's output.
_PLUGIN_LOG = ("WARNING: All log messages before absl::InitializeLog()", "cudart_stub.cc")


def error_lines(stderr: str) -> list[str]:
  """The non-blank lines a process wrote to stderr, less the CUDA plugin's log."""
  return [
    line
    for line in stderr.splitlines()
    if line.strip() and not any(mark in line for mark in _PLUGIN_LOG)
  ]
