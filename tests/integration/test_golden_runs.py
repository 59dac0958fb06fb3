"""Every method reproduces the runs recorded before the library was restructured, and
compiles once over its run under ``jax.shard_map``.

``tests/golden/jax-<version>-cpu-<host>.npz`` holds, for each configuration below, the
parameters of every worker and the ledger totals after a short run (4 workers,
8 steps, rounds of 2 steps, so 4 syncs), recorded at commit dda80ce, before the
restructuring of issue 11 ("one idea per file"). The same program must give the
same bits: a change of structure that changes a number is a change of behaviour.

A change that is meant to round differently (the batched refresh: a stack of
matrices factorised at once, Cholesky-QR instead of Householder QR, both the same
mathematics to float32 rounding) starts a new generation of recordings, in
``tests/golden/<generation>/``, made on the hosts at hand. A run is compared bit for
bit with the newest generation's recording of its JAX version on its CPU, and, for
every generation, with the recording of the nearest JAX version on its CPU (or the
nearest CPU) to 1e-4 relative, ledgers exactly: the behaviour stays that of dda80ce.

Record (only at a commit whose behaviour is the reference)::

    .venv/bin/python -m tests.integration.test_golden_runs --record

XLA compiles for the CPU it runs on, and the same program rounds differently on another
one (up to 8e-6 relative between the two x86 hosts the project has run on), so ``<host>``
is :func:`host`'s tag of the CPU. Another compiler or CPU may round differently, and
that is not a change of this library. The ``unknown`` host is the first one, whose tag
was not kept.
"""

import hashlib
import pathlib
import platform
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lordo_jax
from tests.helpers import workers

M = 4
STEPS = 8
K = 2
RANK = 2
LR = 1e-2
GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "golden"
SHAPES = {"w": (12, 6), "v": (5, 10), "b": (6,)}


def initial_params():
  keys = jax.random.split(jax.random.key(7), len(SHAPES))
  return {
    name: 0.5 * jax.random.normal(key, shape)
    for key, (name, shape) in zip(keys, SHAPES.items(), strict=True)
  }


def loss(params, batch):
  r = batch["x"] @ params["w"] + params["b"] - batch["y"]
  s = batch["z"] @ params["v"] - batch["t"]
  return 0.5 * (jnp.mean(r**2) + jnp.mean(s**2))


def batches():
  out = []
  for t in range(STEPS):
    kx, ky, kz, kt = jax.random.split(jax.random.key(100 + t), 4)
    out.append(
      {
        "x": jax.random.normal(kx, (M, 8, 12)),
        "y": jax.random.normal(ky, (M, 8, 6)),
        "z": jax.random.normal(kz, (M, 8, 5)),
        "t": jax.random.normal(kt, (M, 8, 10)),
      }
    )
  return out


# The SVD, LoRDO's refresh when the runs were recorded (its default is now
# subspace_iteration, which lordo_subspace_iteration records).
SVD = {"projection": "svd"}


def _lordo(**options):
  options = SVD | options
  return lambda: lordo_jax.lordo(LR, rank=RANK, sync_every=K, axis_name=workers.AXIS, **options)


def _qsr():
  schedule = optax.cosine_decay_schedule(LR, STEPS)
  rule = lordo_jax.quadratic_sync_rule(K, 0.004, schedule)
  return lordo_jax.lordo(schedule, rank=RANK, sync_every=rule, axis_name=workers.AXIS, **SVD)


def _low_rank_ddp(**options):
  return lambda: lordo_jax.low_rank_ddp(
    LR, rank=RANK, refresh_every=3, axis_name=workers.AXIS, **options
  )


def _local(method, **options):
  return lambda: method(LR, sync_every=K, axis_name=workers.AXIS, **options)


CONFIGS = {
  "lordo": _lordo(),
  "lordo_subspace_iteration": _lordo(projection="subspace_iteration"),
  "lordo_dct": _lordo(projection="dct"),
  "lordo_feedback_vector": _lordo(
    error_feedback=True, omega=0.5, mu=2.0, full_rank_scale="vector", side="right"
  ),
  "lordo_feedback_bf16": _lordo(error_feedback=True, error_feedback_dtype="bfloat16"),
  "lordo_keep_random": _lordo(transport="keep", init_projection="random", seed=3),
  "lordo_reset_moments_every_2": _lordo(transport="reset", sync_moments_every=2),
  "lordo_two_sided": _lordo(two_sided=True, eps=1e-2),
  "lordo_two_sided_randomized": _lordo(
    two_sided=True, projection="randomized_svd", oversample=2, eps=1e-2
  ),
  "lordo_bfloat16": _lordo(compression="bfloat16"),
  "lordo_int8": _lordo(compression="int8"),
  "lordo_fragments": _lordo(fragments=2),
  "lordo_fault_tolerant": _lordo(fault_tolerant=True),
  "lordo_nesterov_outer": _lordo(outer_optimizer=optax.sgd(0.7, momentum=0.9, nesterov=True)),
  "lordo_qsr": _qsr,
  "lordo_weight_decay": _lordo(weight_decay=0.1, b1=0.8, b2=0.99),
  "ddp": lambda: lordo_jax.ddp(LR, axis_name=workers.AXIS),
  "ddp_int8": lambda: lordo_jax.ddp(LR, axis_name=workers.AXIS, compression="int8"),
  "low_rank_ddp": _low_rank_ddp(),
  "low_rank_ddp_qh_feedback": _low_rank_ddp(omega=0.7, error_feedback=True, transport="rotate"),
  "low_rank_ddp_projected": _low_rank_ddp(communicate="projected"),
  "low_rank_ddp_projected_dct": _low_rank_ddp(communicate="projected", projection="dct"),
  "low_rank_ddp_projected_two_sided": _low_rank_ddp(
    communicate="projected", two_sided=True, projection="randomized_svd", oversample=2, eps=1e-2
  ),
  "local_adam": _local(lordo_jax.local_adam),
  "local_adam_fragments": _local(lordo_jax.local_adam, fragments=2),
  "desloc": lambda: lordo_jax.desloc(
    LR, sync_every=K, first_moment_every=4, second_moment_every=8, axis_name=workers.AXIS
  ),
  "diloco": _local(lordo_jax.diloco),
  "diloco_bfloat16": _local(lordo_jax.diloco, compression="bfloat16"),
  "lordo_local_projection": _local(lordo_jax.lordo_local_projection, rank=RANK, **SVD),
  "lordo_global_projection_only": _local(lordo_jax.lordo_global_projection_only, rank=RANK, **SVD),
}


def run(name, compilations=None):
  """``{key: array}``: every worker's final params and the ledger totals; the number of
  programs the step compiled to is appended to the list ``compilations``, if given."""
  history, step = workers.run(CONFIGS[name](), loss, initial_params(), batches(), M)
  if compilations is not None:
    compilations.append(step._cache_size())
  params, state = history[-1]
  out = {f"{name}/params/{k}": np.asarray(v) for k, v in params.items()}
  one_worker = jax.tree.map(lambda x: np.asarray(x)[0], state)
  out[f"{name}/bytes"] = np.asarray(lordo_jax.communicated_bytes(one_worker), np.int64)
  out[f"{name}/elements"] = np.asarray(lordo_jax.communicated_elements(one_worker), np.int64)
  out[f"{name}/all_reduces"] = np.asarray(lordo_jax.all_reduce_count(one_worker), np.int64)
  return out


def _version(text):
  return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def host():
  """A tag of this machine's CPU: a hash of its architecture, model and instruction set
  extensions (``/proc/cpuinfo`` on Linux), which decide what XLA's CPU compiler emits."""
  cpuinfo = pathlib.Path("/proc/cpuinfo")
  lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else [platform.processor()]
  first = {}
  for line in lines:
    key, _, value = line.partition(":")
    first.setdefault(key.strip(), value.strip())
  flags = " ".join(sorted(first.get("flags", "").split()))
  text = f"{platform.machine()}|{first.get('model name', lines[0])}|{flags}"
  return hashlib.sha256(text.encode()).hexdigest()[:10]


# The generations of recordings, oldest first: a folder of tests/golden each ("": itself).
GENERATIONS = ("", "batched_refresh")


def _recordings(generation: str) -> dict[tuple, pathlib.Path]:
  files = {}
  for path in (GOLDEN / generation).glob("jax-*-cpu-*.npz"):
    version, cpu = path.stem.removeprefix("jax-").split("-cpu-")
    files[_version(version), cpu] = path
  return files


def recording(generation: str = GENERATIONS[-1]):
  """(the recorded arrays of ``generation``, whether they are this JAX version's own on
  this CPU): the own recording if there is one, else the nearest JAX version's (on this
  CPU first)."""
  files = _recordings(generation)
  own = (_version(jax.__version__), host())
  if own in files:
    return dict(np.load(files[own])), True

  def distance(key):
    return key[1] != own[1], [abs(a - b) for a, b in zip(key[0], own[0], strict=True)]

  return dict(np.load(files[min(files, key=distance)])), False


def _compare(got: dict, recorded: dict, exact: bool):
  for key, value in got.items():
    if exact or not key.split("/")[1] == "params":
      np.testing.assert_array_equal(value, recorded[key], err_msg=key)
    else:
      np.testing.assert_allclose(value, recorded[key], rtol=1e-4, atol=1e-6, err_msg=key)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_run_reproduces_the_recording_and_compiles_once(name):
  """The state each step returns is the state ``init`` gave, laid out alike: one program
  runs the eight steps (first step, four syncs, the steps between)."""
  compilations = []
  got = run(name, compilations)
  assert compilations == [1]
  for generation in GENERATIONS:
    recorded, own = recording(generation)
    assert set(got) == {k for k in recorded if k.startswith(name + "/")}
    _compare(got, recorded, exact=own and generation == GENERATIONS[-1])


def test_every_run_moves_and_differs():
  """The recording is not trivial: the methods' parameters differ from each other."""
  recorded, _ = recording()
  finals = {name: recorded[f"{name}/params/w"] for name in CONFIGS}
  assert len({v.tobytes() for v in finals.values()}) == len(CONFIGS)


@pytest.mark.parametrize("generation", GENERATIONS)
def test_recordings_on_different_cpus_agree_to_the_fallback_tolerance(generation):
  """What the fallback allows is what two CPUs (or two generations) differ by: each JAX
  version's recordings on every host agree with each other to 1e-4 relative, their
  ledgers exactly."""
  by_version = {}
  for (version, _), path in _recordings(generation).items():
    by_version.setdefault(version, []).append(dict(np.load(path)))
  if generation == GENERATIONS[0]:
    assert any(len(hosts) > 1 for hosts in by_version.values())
  first_generation = {v: dict(np.load(p)) for (v, _), p in _recordings(GENERATIONS[0]).items()}
  for version, recordings in by_version.items():
    for other in recordings + [first_generation[version]]:
      assert set(other) == set(recordings[0])
      _compare(recordings[0], other, exact=False)


if __name__ == "__main__" and "--record" in sys.argv:
  jax.config.update("jax_num_cpu_devices", 8)
  folder = GOLDEN / GENERATIONS[-1]
  folder.mkdir(exist_ok=True)
  arrays = {}
  for config in CONFIGS:
    arrays.update(run(config))
    print(config, arrays[f"{config}/bytes"])
  np.savez_compressed(folder / f"jax-{jax.__version__}-cpu-{host()}.npz", **arrays)
