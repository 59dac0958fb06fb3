"""The environment of a process that compiles for GPUs on this CPU (JAX's deviceless
ahead-of-time compile with the CUDA plugin of the test extra).

The process keeps the suite's quick compile (``tests/helpers/xla_settings.py``): on a GPU
it sets LLVM's optimisation level of the kernels' code and nothing the tests read. The
HLO passes, the fusions, the thunk sequence, the schedule and the buffers are those of a
user's compile: ``benchmarks/gpu/gpu_program.py --quick``'s record (every program's
launches by kind, bytes, flops, peak memory and collective schedule) and the launches and
temporaries of ``tests/local/test_step_launches_target.py``'s four programs were identical
with and without it (jaxlib 0.10.2, 2026-11-28), and those four took 36 s of CPU instead
of 55.

It also has ptxas, which turns each kernel's PTX into the GPU's machine code after the
program (its HLO, thunks and buffers) is made, compile without its optimisations
(:data:`PTXAS_FLAG`): the machine code is what no test reads (nothing runs). The schedules
of ``tests/round/test_overlap_compile.py``'s four programs were identical with and
without it (jaxlib 0.10.2, 2026-11-29); ptxas took 4.0 s of CPU instead of 5.2 on LoRDO's
one program of ``benchmarks/gpu/gpu_program.py --quick``'s shapes.

And it keeps the kernels it compiled in a file of its own (:data:`KERNEL_CACHE_FLAG`,
XLA's kernel cache), so a kernel that a later program of the same process has again (the
model's GEMMs in a step compiled plainly and then by ``compile_overlapped``, AdamW's and
LoRDO's elementwise fusions of the same leaves) is not lowered by Triton and assembled by
ptxas again. The programs are compiled as before, pass for pass; only the kernels' machine
code is read back instead of made. With and without it (2026-11-29): the four schedules of
``test_overlap_compile.py``, the four records of ``test_step_launches_target.py`` and
``gpu_program.py --quick``'s record (its compile times aside) were identical on jaxlib
0.10.2; the three modules that compile for a GPU took 118 s of CPU instead of 169, and
``test_benchmarks_gpu_program.py`` on jaxlib 0.12 76 s instead of 105.
"""

import atexit
import importlib.util
import os
import shutil
import tempfile

PTXAS_FLAG = "--xla_gpu_disable_gpuasm_optimizations=true"
KERNEL_CACHE_FLAG = "--xla_gpu_kernel_cache_file"


def environment() -> dict[str, str]:
  """This process's environment with ``JAX_PLATFORMS=cpu`` (without it, on a host with no
  GPU the plugin fails its CUDA check before it registers its compiler), ptxas at ``-O0``
  and a kernel cache in a new temporary file, removed when this process ends (each unless
  ``XLA_FLAGS`` names the flag); a failure that says what to install where the plugin is
  missing."""
  if importlib.util.find_spec("jax_plugins.xla_cuda12") is None:
    raise AssertionError(
      "jax's CUDA plugin (jax_plugins.xla_cuda12) is not installed in this Python: the "
      "test compiles for a GPU on this CPU with it. Install the test extra: pip install "
      "-e '.[test]' (it brings jax[cuda12-local]: the plugin and its PJRT, no driver)."
    )
  flags = os.environ.get("XLA_FLAGS", "").split()
  named = {flag.split("=")[0] for flag in flags}
  if PTXAS_FLAG.split("=")[0] not in named:
    flags.append(PTXAS_FLAG)
  if KERNEL_CACHE_FLAG not in named:
    folder = tempfile.mkdtemp(prefix="xla_gpu_kernels_")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    flags.append(f"{KERNEL_CACHE_FLAG}={os.path.join(folder, 'kernels')}")
  return {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": " ".join(flags)}
