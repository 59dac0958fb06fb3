"""XLA's settings for the suite: a quick compile, and collectives that wait out a busy host.

* **Quick compile.** The suite is bound by compilation and its programs are small, so
  LLVM's optimisations cost more than they save. :func:`enable` compiles with LLVM at
  ``-O0`` (``JAX_DISABLE_MOST_OPTIMIZATIONS``) and, on jaxlib 0.10, with its older CPU
  code generator in one piece (``--xla_cpu_use_fusion_emitters=false``, a flag jaxlib
  0.12 no longer has: an unknown flag aborts). The same HLO optimisations run, and the
  arithmetic is IEEE's either way (no fast math): the golden runs are bit-identical under
  it. On the LoRDO and DiLoCo steps of ``tests/integration/test_sharded_workers.py``
  (2 cores) a compile takes 0.8 s of CPU instead of 3.9 on jaxlib 0.10.2, and 1.6 s
  instead of 2.2 on 0.12.
* **Patient collectives.** XLA's CPU client ends the process when the simulated devices
  of a collective have not all arrived within 20 s; on a host running other work their
  threads can be that late with nothing wrong. The suite waits 10 minutes (a test's own
  time limit ends a true deadlock first).
"""

import importlib.metadata
import os

SWITCH = "JAX_DISABLE_MOST_OPTIMIZATIONS"
JAXLIB_0_10_FLAGS = (
  "--xla_cpu_use_fusion_emitters=false",
  "--xla_cpu_parallel_codegen_split_count=1",
)
PATIENT_COLLECTIVES = "--xla_cpu_collective_call_terminate_timeout_seconds=600"


def enable() -> None:
  """Both settings in this process and the processes it starts; call before JAX starts.
  A setting already in the environment is kept."""
  os.environ.setdefault(SWITCH, "1")
  flags = [PATIENT_COLLECTIVES]
  try:
    if importlib.metadata.version("jaxlib").startswith("0.10."):
      flags += JAXLIB_0_10_FLAGS
  except importlib.metadata.PackageNotFoundError:  # conftest says what to install
    return
  given = os.environ.get("XLA_FLAGS", "").split()
  named = {flag.split("=")[0] for flag in given}
  given += [flag for flag in flags if flag.split("=")[0] not in named]
  os.environ["XLA_FLAGS"] = " ".join(given)
