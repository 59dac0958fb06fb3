"""LoRDO's steps compiled for a GPU: the local step launches as few kernels as AdamW's,
with few temporaries; the round's boundary half the one program's launches.

The low-rank state is stored per shape group (:class:`lordo_jax.GroupedMoments`), so the step
compiled for a GPU reads and writes each group's stacks in place: a few kernels per
group, none per matrix, no copies. Read from the program XLA's GPU compiler makes for
one H100 (``benchmarks/gpu/targets/h100.txtpb``), run deviceless on this host through
JAX's CUDA plugin, and its thunk sequence (``benchmarks/gpu/gpu_program.py``'s reader), on
GPT-2's parameter tree with 6 layers of d = 768 (r = 192, every bias, norm and
embedding; the embeddings on full-rank Adam, as in the paper): AdamW's step, one
kernel per leaf, against LoRDO's local step (``round_phase="local"``), and LoRDO's
boundary (``round_phase="boundary"``) against its one program (no phase: the round and
the first bases in conditionals), each ``update`` + ``apply_updates`` with params and
state donated.
"""

import functools
import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp

import lordo_jax
from tests.helpers import gpu_compile

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAYERS = 6

# Run with JAX_PLATFORMS=cpu (the CUDA plugin registers its compiler only then on a host
# without a GPU) and no compilation cache (a program read from it writes no thunks).
# Prints, per program: its launches by kind, its temporaries and its state's bytes.
_GPU_COMPILE = """
import json, os, pathlib, sys, tempfile
dump = tempfile.mkdtemp(prefix="step_launches_")
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={dump}"
import jax, optax
from benchmarks.communication import communication_table as table
from benchmarks.gpu import gpu_program
from jax.sharding import NamedSharding, PartitionSpec as P
import lordo_jax

jax.config.update("jax_enable_compilation_cache", False)
config = gpu_program.target_config("h100")
one_gpu = NamedSharding(gpu_program.gpu_mesh(config, (1,), ("gpu",)), P())
shapes = table.gpt2_shapes(int(sys.argv[1]), 768, 50257, 1024)
lordo = lordo_jax.lordo(1e-3, axis_name=None, rank=192, sync_every=16, weight_decay=1e-4,
                        low_rank_labels=table.no_embeddings)
adamw = optax.adamw(1e-3, weight_decay=1e-4)
step = gpu_program._optimizer_step
programs = {
  "adamw": step("adamw", adamw, shapes, one_gpu),
  "lordo": step("lordo", lordo, shapes, one_gpu, round_phase="local"),
  "boundary": step("boundary", lordo, shapes, one_gpu, round_phase="boundary"),
  "one program": step("one program", lordo, shapes, one_gpu),
}
found = {}
for name, program in programs.items():
  record = gpu_program.read(program, pathlib.Path(dump))
  state = program.args[1]
  found[name] = {kind: record[kind] for kind in ("launches", *gpu_program.LAUNCH_KINDS)}
  for call in ("svd", "cholesky", "triangular-solve", "geqrf", "householder_product"):
    found[name][call] = record["solver_calls"].get(call, 0)
  found[name]["temp_bytes"] = record["temp_bytes"]
  found[name]["state_bytes"] = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state))
print(json.dumps(found))
"""


@functools.cache
def _programs() -> dict:
  env = gpu_compile.environment()
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  done = subprocess.run(
    [sys.executable, "-c", _GPU_COMPILE, str(LAYERS)],
    capture_output=True,
    text=True,
    cwd=ROOT,
    env=env,
    timeout=300,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_local_step_on_a_gpu_launches_as_adamw_does_with_few_temporaries():
  """At most 1.3x AdamW's launches (it has fewer: one fusion per full-rank leaf, a few
  per shape group), no copy, no conditional, and temporaries at most a quarter of the
  optimizer state (the stacked gradients of a group, whose buffer then holds its
  low-rank direction)."""
  found = _programs()
  adamw, lordo = found["adamw"], found["lordo"]
  assert adamw["launches"] == adamw["kernels"] == 12 * LAYERS + 6  # One per leaf.
  assert lordo["launches"] <= 1.3 * adamw["launches"], found
  assert lordo["copies"] == lordo["conditionals"] == lordo["solver"] == 0, found
  assert lordo["gemms"] == 2 * 4, found  # Project and unproject, one each per shape group.
  assert lordo["temp_bytes"] <= lordo["state_bytes"] / 4, found


def test_the_state_is_stored_per_shape_group():
  """The state the GPU program reads in place: one stack per shape group (the four
  matrices of a GPT-2 layer, over the layers), on any platform."""

  def layer(d):
    return {"attn": jnp.zeros((d, 3 * d)), "proj": jnp.zeros((d, d)), "fc": jnp.zeros((d, 4 * d))}

  params = {"h": [layer(16) for _ in range(3)], "bias": jnp.zeros(16)}
  tx = lordo_jax.lordo(1e-3, rank=4, sync_every=4, axis_name=None)
  is_grouped = lambda x: isinstance(x, lordo_jax.GroupedMoments)  # noqa: E731
  grouped = [x for x in jax.tree.leaves(tx.init(params), is_leaf=is_grouped) if is_grouped(x)]
  (moments,) = grouped
  assert [m.mu.shape for m in moments.groups] == [(3, 16, 4), (3, 16, 4), (3, 4, 16)]
  assert moments.matrices()["h"][1]["attn"].mu.shape == (16, 4)


def test_the_boundary_on_a_gpu_is_half_the_one_program():
  """The boundary program (``round_phase="boundary"``) runs the round with no
  conditional and without the first bases: at most half the one program's copies and
  conditionals, and much fewer launches (only the orthonormalisation's fallbacks are left, one per
  subspace iteration), no SVD, and the fallback's Householder QRs of all four shape
  groups in one batched call per iteration (they were one per group and iteration)."""
  found = _programs()
  boundary, whole = found["boundary"], found["one program"]
  # 0.46x with jaxlib 0.10, 0.57x with 0.12 (whose one program copies less around its
  # conditionals: 121 copies where 0.10's has 277; the boundary 14 with both).
  assert boundary["launches"] <= 0.6 * whole["launches"], found
  assert boundary["copies"] <= whole["copies"] / 2, found
  assert boundary["conditionals"] <= whole["conditionals"] / 2, found
  iterations = 2  # subspace_iterations' default: an orthonormalisation per iteration.
  assert boundary["conditionals"] <= iterations, found
  assert boundary["svd"] == 0 and whole["svd"] == 4, found  # The first bases: one per group.
  assert max(boundary["geqrf"], boundary["householder_product"]) <= iterations, found
  # At most four shifted Cholesky-QR passes per iteration, the groups' Grams in one call each.
  assert max(boundary["cholesky"], boundary["triangular-solve"]) <= 4 * iterations, found
