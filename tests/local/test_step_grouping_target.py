"""The local step's grouping follows the platform the program is compiled for, not the host.

Low-rank Adam steps the matrices of one shape one at a time in a program for a CPU and
stacked, one batched computation per shape, in a program for an accelerator
(:func:`lordo_jax.local._shape_groups.step_grouped`). The choice is made when the program
is lowered (:func:`jax.lax.platform_dependent`), so a GPU program lowered or compiled on
this CPU host is batched. Read here from the programs themselves, for LoRDO's local step
(``round_phase="local"``) on four 16 x 8 matrices (one shape group) and a vector: its
products, two per matrix stepped alone (project and unproject), two in all batched:
StableHLO lowered for ``cuda`` and for ``cpu`` from one trace, and the CPU's compiled
program. A real GPU compile on this host, XLA's GPU compiler for an H100 run deviceless
through JAX's CUDA plugin, is batched by the compile target with the per-matrix step
forced for comparison: ``tests/benchmark/test_benchmarks_gpu_program.py``'s
``test_the_local_step_batches_by_shape_on_a_gpu_with_no_conditional_and_no_copy`` (LoRDO's
local step compiled so by ``benchmarks/gpu/gpu_program.py --quick``: 8 GEMMs in the
program of the target's grouping, 16 in the per-matrix one). The forced batched step is
checked on a CPU by ``tests/local/test_batched_step.py``.
"""

import re

import jax
import jax.numpy as jnp

import lordo_jax

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
