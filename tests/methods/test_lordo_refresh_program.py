"""LoRDO's compiled sync step factorises each shape group once, batched (read from the HLO).

A transformer's matrices come in a few shapes, one per layer: the refresh stacks each
shape's matrices and factorises the stack in one solver call, never one matrix at a
time (an accelerator's solver library runs a loop of per-matrix QRs or SVDs serially,
which is what made the sync step cost seconds on a GPU); subspace iteration's ``r x r``
Cholesky factorizations, the same size in every group, are one call for all the
groups. Counted here: the solver library's custom calls in the compiled step of
``lordo`` on three "layers" of two matrix shapes (two groups of three).
"""

import jax
import jax.numpy as jnp
import pytest

import lordo_jax
from tests.helpers import hlo

LAYERS = 3
SHAPES = {"up": (32, 16), "down": (16, 48)}  # Left and right side.
RANK = 4
ITERATIONS = 2  # subspace_iterations' default
PASSES = 4  # Cholesky factorisations per orthonormalisation (shifted Cholesky-QR)


def _compiled_step(projection: str) -> str:
  params = {
    f"{name}{i}": jnp.ones(shape) for i in range(LAYERS) for name, shape in SHAPES.items()
  } | {"bias": jnp.zeros(16)}
  tx = lordo_jax.lordo(1e-2, rank=RANK, sync_every=2, projection=projection)
  state = tx.init(params)
  return jax.jit(tx.update).lower(params, state, params).compile().as_text()


def _batch(call: hlo.SolverCall) -> int:
  """The leading axis of a batched call's first result (1 for an unbatched one)."""
  dims = call.result_type.split("[", 1)[1].split("]", 1)[0].split(",")
  return int(dims[0]) if len(dims) == 3 else 1


# The CPU of jaxlib before 0.12 runs a batch of matrices through its solver in a loop
# over them (lax.map), one call in the program still: its batched LAPACK calls can hang.
LOOPED = jax.default_backend() == "cpu" and jax.__version_info__ < (0, 12)


def _one_call_per_group(calls: list[hlo.SolverCall], matrices: int = LAYERS) -> bool:
  return all(c.in_loop == LOOPED and _batch(c) == (1 if LOOPED else matrices) for c in calls)


def test_subspace_iteration_orthonormalises_every_group_with_one_batched_cholesky_per_pass():
  text = _compiled_step("subspace_iteration")
  cholesky = hlo.linear_algebra_calls(text, "cholesky")
  # ITERATIONS orthonormalisations x PASSES factorisations, each of every group's stack
  # (looped, each group's own: the CPU of jaxlib before 0.12 loops over matrices anyway).
  stacked = 1 if LOOPED else len(SHAPES)
  assert len(cholesky) == ITERATIONS * PASSES * len(SHAPES) // stacked
  assert _one_call_per_group(cholesky, LAYERS * stacked)
  # Each factor's r x r inverse, the only triangular solves (never one against n x r).
  solves = hlo.linear_algebra_calls(text, "triangular_solve")
  assert len(solves) == len(cholesky) and _one_call_per_group(solves, LAYERS * stacked)
  assert all(
    f",{RANK},{RANK}]" in c.result_type or f"[{RANK},{RANK}]" in c.result_type for c in solves
  )
  # Householder QR only as the fallback, each inside its own conditional within the
  # sync's; the SVD only for the run's first basis, one per group.
  qr = hlo.linear_algebra_calls(text, "qr")
  assert len(qr) == len(SHAPES) * ITERATIONS
  assert all(c.depth >= 2 for c in qr)
  assert len(hlo.linear_algebra_calls(text, "svd")) == len(SHAPES)


@pytest.mark.parametrize("projection", ["svd", "subspace_iteration"])
def test_the_exact_svd_is_one_call_per_group(projection):
  """One SVD per group of same-shape matrices, batched (looped on the CPU of jaxlib
  before 0.12): never one call per matrix."""
  svd = hlo.linear_algebra_calls(_compiled_step(projection), "svd")
  # The first basis (before step 1), and for svd every sync's refresh too.
  assert len(svd) == len(SHAPES) * (2 if projection == "svd" else 1)
  assert _one_call_per_group(svd)
