"""The local step's grouping follows the platform the program is compiled for, not the host.

Low-rank Adam steps the matrices of one shape one at a time in a program for a CPU and
stacked, one batched computation per shape, in a program for an accelerator
(:func:`lordo_jax.local._shape_groups.step_grouped`). The choice is made when the program
is lowered (:func:`jax.lax.platform_dependent`), so a GPU program lowered or compiled on
this CPU host is batched. Read here from the programs themselves, for LoRDO's local step
(``round_phase="local"``) on four 16 x 8 matrices (one shape group) and a vector: its
products, two per matrix stepped alone (project and unproject), two in all batched.
StableHLO lowered for ``cuda`` and for ``cpu`` from one trace, the CPU's compiled
program, and a real GPU compile: XLA's GPU compiler for an H100
(``benchmarks/gpu/targets/h100.txtpb``), run deviceless on this host through JAX's CUDA
plugin (``jax.experimental.topologies``).
"""

import json
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp

import lordo_jax
from tests.helpers import gpu_compile

ROOT = pathlib.Path(__file__).resolve().parents[2]
TARGET = ROOT / "benchmarks" / "gpu" / "targets" / "h100.txtpb"
MATRICES = 4
PER_MATRIX, BATCHED = 2 * MATRICES, 2  # The local step's products each way.


def _params():
  params = {f"w{i}": jnp.full((16, 8), i + 1.0) for i in range(MATRICES)}
  return {**params, "bias": jnp.ones((8,))}


def _local_step(tx):
  """LoRDO's local step, the program ``round_phase="local"`` compiles."""
  return lambda params, state, grads: tx.update(grads, state, params, round_phase="local")


def test_one_trace_lowers_batched_for_cuda_and_per_matrix_for_cpu():
  """One trace, lowered for each platform: its products, and the compiled CPU program's."""
  tx = lordo_jax.lordo(1e-3, rank=4, sync_every=4, axis_name=None)
  params = _params()
  traced = jax.jit(_local_step(tx)).trace(params, tx.init(params), params)
  for platform, products in (("cuda", BATCHED), ("cpu", PER_MATRIX)):
    text = traced.lower(lowering_platforms=(platform,)).as_text()
    assert len(re.findall(r"stablehlo\.dot_general", text)) == products, platform
  compiled = traced.lower().compile().as_text()
  assert len(re.findall(r" dot\(", compiled)) == PER_MATRIX


def test_a_single_grouping_stages_no_platform_choice():
  """Matrices of distinct shapes group alike either way: the step is traced once, with
  no ``platform_index`` in its program; same-shape matrices stage the choice."""
  tx = lordo_jax.lordo(1e-3, rank=4, sync_every=4, axis_name=None)
  distinct = {f"w{i}": jnp.ones((16 + i, 8)) for i in range(MATRICES)}
  for params, staged in ((distinct, False), (_params(), True)):
    jaxpr = jax.make_jaxpr(_local_step(tx))(params, tx.init(params), params)
    assert ("platform_index" in str(jaxpr)) == staged


# Run with JAX_PLATFORMS=cpu, which the CUDA plugin needs to register on a host without a
# GPU (without it, its CUDA check fails and "cuda" has no topology). Prints the GEMMs
# (dots, in fusions or not, and cuBLAS calls) of the local step compiled for one H100,
# by the compile target's grouping ("target") and by each grouping forced.
_GPU_COMPILE = """
import json, re, sys
import jax
import jax.numpy as jnp
from jax.experimental import topologies
from jax.sharding import NamedSharding, PartitionSpec as P
import lordo_jax
from lordo_jax.local import _shape_groups as shape_groups

topology = topologies.get_topology_desc(
  platform="cuda", target_config=open(sys.argv[1]).read(), topology="1x1x1"
)
mesh = topologies.make_mesh(topology, (1,), ("x",))
params = {f"w{i}": jnp.ones((16, 8)) for i in range(int(sys.argv[2]))}
params["bias"] = jnp.ones((8,))
tx = lordo_jax.lordo(1e-3, rank=4, sync_every=4, axis_name=None)
on_gpu = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, P()))
params, state = jax.tree.map(on_gpu, (params, jax.eval_shape(tx.init, params)))
gemms = {}
for grouping in (None, "per_matrix", "batched"):
  shape_groups.FORCED_STEP_GROUPING = grouping
  # A new function each time: jit's cache would give the program of an earlier trace.
  step = lambda p, s, g: tx.update(g, s, p, round_phase="local")
  text = jax.jit(step).lower(params, state, params).compile().as_text()
  cublas = re.findall(r'custom_call_target="__cublas[^"]*"', text)
  gemms[grouping or "target"] = len(re.findall(r" dot\\(", text)) + len(cublas)
print(json.dumps(gemms))
"""


def test_a_gpu_program_compiled_on_this_host_is_batched():
  env = gpu_compile.environment()
  done = subprocess.run(
    [sys.executable, "-c", _GPU_COMPILE, str(TARGET), str(MATRICES)],
    capture_output=True,
    text=True,
    cwd=ROOT,
    env=env,
    timeout=180,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  gemms = json.loads(done.stdout.strip().splitlines()[-1])
  assert gemms == {"target": BATCHED, "per_matrix": PER_MATRIX, "batched": BATCHED}, gemms
