"""Test configuration, set once before JAX starts.

* Eight simulated CPU devices, and the CPU as JAX's only platform (``JAX_PLATFORMS``).
* One persistent XLA compilation cache for the whole run: the pytest process, its
  xdist workers and every subprocess a test starts (the LM job, the benchmarks) inherit
  its directory through the environment, so a program compiled once (the same model
  step in a resumed run, in each seed of a study) is not compiled again. The suite is
  bound by single-threaded compilation, and this removes about a third of it. The
  directory is fresh for each run, so no result depends on an earlier one; a
  ``JAX_COMPILATION_CACHE_DIR`` already set is used as it is.
* XLA's settings for the suite (``tests/helpers/xla_settings.py``): a quick compile (the
  suite is bound by compilation, and its programs are small, so LLVM's optimisations
  cost more than they save; the same HLO passes run and the arithmetic is the same),
  and collectives that wait out a busy host instead of ending the process.
* Except for tests marked ``no_compilation_cache``: those that run programs with
  host-offloaded state. On jaxlib 0.10.2's CPU client, the LM job's FSDP + offload run
  aborted in 2 of 6 runs whose executables came from the cache (a collective
  rendezvous timed out: one device never arrived) and never without it.
* Python's garbage collector, tuned for a process that holds JAX's caches of traced and
  compiled programs: the objects alive after collection are frozen (``gc.freeze``: no
  collection walks them again) and a young collection waits for 50,000 new objects, not
  700. Cycles are still collected; on two modules (136 tests) this took the collector's
  share of the process's CPU from 4.2 s of 73 to 0.9 s, with the same peak memory. The
  Python processes the tests start take the same thresholds from
  ``tests/helpers/startup/sitecustomize.py``, on ``PYTHONPATH`` for them.
* One xdist worker more than the cores (``-n auto``): a test that waits leaves its core
  to the extra worker.
* The slowest modules first. ``pytest -n auto --dist loadfile --no-loadscope-reorder``
  (``pyproject.toml``) hands the modules to the workers in collection order, so the
  longest start at once and the short ones fill in around them; a long module handed
  out last would run alone at the end.
"""

import atexit
import gc
import os
import shutil
import tempfile

import pytest

from tests.helpers import xla_settings

if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="lordo_jax_xla_cache_")
  atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
xla_settings.enable()

# The suite runs on the CPU. The test extra's CUDA plugin (deviceless GPU compiles) would
# otherwise try to start a GPU in every process and log a traceback where none is found;
# with the CPU named, it only registers its compiler.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

try:
  import jax
except ImportError as error:  # pytest run from a Python without the project installed
  raise pytest.UsageError(
    f"{error}: this Python lacks the project's dependencies. Run the README's test "
    "command: python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && "
    ".venv/bin/python -m pytest -q"
  ) from error

from jax.experimental.compilation_cache import compilation_cache  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

# Seconds per module, summed over its tests (``--junitxml`` of the whole suite alone on 2
# cores, a fresh clone, 2026-11-28, a quiet host); the rest follow in their usual order.
SLOWEST_MODULES = (
  "test_sharded_workers.py",  # 76
  "test_doc_pages.py",  # 64
  "test_benchmarks_accelerator.py",  # 55
  "test_examples.py",  # 52
  "test_benchmarks_quality.py",  # 50
  "test_lm_elastic.py",  # 46
  "test_lm_fsdp.py",  # 43
  "test_streaming.py",  # 40
  "test_benchmarks_device_speed.py",  # 38
  "test_benchmarks_quality_promises.py",  # 37
  "test_overlap_compile.py",  # 35
  "test_flax.py",  # 34
  "test_benchmarks_gpu_program.py",  # 34
  "test_step_launches_target.py",  # 33
  "test_checkpoint.py",  # 29
  "test_basis_batched.py",  # 27
  "test_offload.py",  # 27
  "test_golden_runs.py",  # 24
  "test_two_sided.py",  # 23
  "test_multiprocess_fsdp.py",  # 23
  "test_baselines.py",  # 23
  "test_benchmarks_elastic.py",  # 22
  "test_overlap.py",  # 22
  "test_optax_common.py",  # 22
)


# Thresholds of the young, middle and old generations (Python's are 700, 10, 10).
gc.set_threshold(50_000, 20, 20)
STARTUP = os.path.join(os.path.dirname(__file__), "helpers", "startup")
PATHS = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path]
os.environ["PYTHONPATH"] = os.pathsep.join(PATHS + [STARTUP] * (STARTUP not in PATHS))


def pytest_xdist_auto_num_workers(config):
  """``-n auto``: one worker more than the cores. A worker's test is not always on a core
  (checkpoint writes, processes that wait on each other, subprocesses starting), and a
  third worker on 2 cores fills those gaps."""
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return (cores or 1) + 1


def pytest_collection_finish(session):
  """Freezes what the imports and the collection made: they live as long as the process."""
  gc.collect()
  gc.freeze()


def pytest_collection_modifyitems(items):
  """Moves the modules of :data:`SLOWEST_MODULES` to the front, slowest first."""
  rank = {name: i for i, name in enumerate(SLOWEST_MODULES)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # Stable: order kept.


@pytest.fixture(scope="module", autouse=True)
def _compilation_cache(request):
  """The persistent cache off for a module marked ``no_compilation_cache``, in this
  process and in the processes its tests start, from before its first fixture (autouse
  fixtures of a scope come first) until after its last test; back on after it."""
  if request.node.get_closest_marker("no_compilation_cache") is None:
    yield
    return
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("JAX_ENABLE_COMPILATION_CACHE", "false")
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()  # The next compilation reads the setting again.
    try:
      yield
    finally:
      jax.config.update("jax_enable_compilation_cache", True)
      compilation_cache.reset_cache()
