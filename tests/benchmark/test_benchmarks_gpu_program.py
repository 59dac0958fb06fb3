"""benchmarks/gpu/gpu_program.py: its reader of thunks and of an HLO module's bytes and flops,
the model's fit, and its quick mode, which compiles the steps for 8 H100s on this CPU
(JAX's deviceless AOT compile with the jax-cuda12 plugin of the test extra)."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from tests.helpers import gpu_compile

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu import gpu_program  # noqa: E402

pytestmark = pytest.mark.timeout(600)

METADATA = """thunk_metadata {
  thunk_info {
    profile_annotation: "command_buffer"
    thunk_id: 1
  }
  thunk_kind: "kCommandBuffer"
}
thunk_metadata {
  thunk_info {
    profile_annotation: "loop_add_fusion.1"
    thunk_id: 2
  }
  thunk_kind: "kCustomKernel"
}
thunk_metadata {
  thunk_info {
    profile_annotation: "gemm_fusion_dot.3"
    thunk_id: 3
  }
  thunk_kind: "kCustomKernel"
}
thunk_metadata {
  thunk_info {
    profile_annotation: "copy.2"
    thunk_id: 4
  }
  thunk_kind: "kCopy"
}
thunk_metadata {
  thunk_info {
    profile_annotation: "custom-call.7"
    thunk_id: 5
  }
  thunk_kind: "kCustomCall"
}
thunk_metadata {
  thunk_info {
    profile_annotation: "conditional"
    thunk_id: 6
  }
  thunk_kind: "kConditional"
}
"""


def test_thunks_are_read_in_order_and_containers_are_not_launches():
  found = gpu_program.thunks(METADATA)
  assert [t.name for t in found] == [
    "command_buffer",
    "loop_add_fusion.1",
    "gemm_fusion_dot.3",
    "copy.2",
    "custom-call.7",
    "conditional",
  ]
  kinds = [gpu_program.launch_kind(t) for t in found]
  assert kinds == [None, "kernels", "gemms", "copies", "solver", "conditionals"]


def test_a_dots_flops_and_bytes_are_read_from_the_optimised_module():
  m, k, n = 48, 40, 24
  text = (
    jax.jit(lambda a, b: jnp.dot(a, b))
    .lower(jax.ShapeDtypeStruct((m, k), jnp.float32), jax.ShapeDtypeStruct((k, n), jnp.float32))
    .compile()
    .as_text()
  )
  hlo = gpu_program.Hlo.of(text)
  gemms = [name for name in hlo.instructions if hlo.flops(name) > 0]
  # The one dot, seen at its own line and from the fusion or call that runs it, if any.
  assert gemms and all(hlo.flops(name) == 2 * m * k * n for name in gemms)
  dot = next(n for n in gemms if hlo.instructions[n].opcode == "dot")
  assert hlo.bytes(dot) == 4 * (m * k + k * n + m * n)


def test_the_fit_recovers_the_model_that_made_the_timed_rows():
  truth = gpu_program.Model(0.6, 300, 5)
  bandwidth = 3e12
  records = {
    name: {"launch_costs": [[2e6 * (i + 1), 1e9 * i]] * (40 * (i + 1)), "launches": 40 * (i + 1)}
    | {"collective_bytes": 0}
    for i, name in enumerate(gpu_program.CALIBRATION)
  }
  measured = {name: truth.ms(r, bandwidth, 450, 1) for name, r in records.items()}
  saved = dict(gpu_program.CALIBRATION)
  try:
    for name, ms in measured.items():
      target, _, row = gpu_program.CALIBRATION[name]
      gpu_program.CALIBRATION[name] = (target, ms, row)
    model, errors = gpu_program.fit(records, bandwidth, 450)
  finally:
    gpu_program.CALIBRATION.update(saved)
  assert model == truth
  assert all(abs(e["modelled_ms"] / e["measured_ms"] - 1) < 1e-9 for e in errors)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
  """The quick run's record; the plugin's absence is an error that says what to install."""
  env = gpu_compile.environment()
  env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
  out = tmp_path_factory.mktemp("gpu_program")
  done = subprocess.run(
    [
      sys.executable,
      str(ROOT / "benchmarks" / "gpu" / "gpu_program.py"),
      "--quick",
      "--out",
      str(out),
    ],
    capture_output=True,
    text=True,
    env=env,
    cwd=ROOT,
    timeout=560,
  )
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
  folder = out / "gpu_program_h100"
  return json.loads((folder / "gpu_program.json").read_text()), folder


def _program(record, name):
  return next(p for p in record["programs"] if p["name"] == name)


def test_every_program_is_compiled_for_the_target_and_its_launches_add_up(quick):
  record, folder = quick
  assert record["target"]["device"] == "NVIDIA H100 80GB HBM3"
  names = [p["name"] for p in record["programs"]]
  assert names == [
    "adamw",
    "lordo local",
    "lordo local, per matrix",
    "lm ddp",
    "lm lordo local",
    'lm lordo overlap="round"',
  ]
  for p in record["programs"]:
    assert p["launches"] == sum(p[k] for k in gpu_program.LAUNCH_KINDS), p["name"]
    assert p["launches"] > 0 and p["peak_bytes"] > 0 and p["modelled_ms"] > 0, p["name"]
  adamw = _program(record, "adamw")
  assert adamw["launches"] == adamw["kernels"] and adamw["temp_bytes"] < 1e4
  assert f"`{record['command']}`" in (folder / "gpu_program.md").read_text()


def test_the_local_step_batches_by_shape_on_a_gpu_with_no_conditional_and_no_copy(quick):
  record, _ = quick
  local, per_matrix = (_program(record, n) for n in ("lordo local", "lordo local, per matrix"))
  for p in (local, per_matrix):  # No round in the program.
    assert p["conditionals"] == p["solver"] == 0, p["name"]
  # The state is stored per shape group: the batched step reads and writes each group's
  # stacks in place, with no copy (the per-matrix step, the CPU's, takes slices of them).
  assert local["copies"] == 0
  assert _program(record, "lm lordo local")["conditionals"] == 0
  # Two layers of four matrices of four shapes: one projection and one back-projection
  # per shape batched, per matrix one of each. "lordo local" takes the grouping of the
  # platform it is compiled for, not the host's (tests/local/test_step_grouping_target.py):
  # compiled on this CPU for a GPU, it is batched.
  assert (local["gemms"], per_matrix["gemms"]) == (8, 16)


def test_ddp_all_reduces_every_gradient_between_the_eight_workers(quick):
  record, _ = quick
  sys.path.insert(0, str(ROOT / "examples"))
  from lm import model

  shapes = model.param_shapes(model.PRESETS["tiny"])
  parameter_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(shapes))
  ddp = _program(record, "lm ddp")
  assert ddp["collective_bytes"] == parameter_bytes
  between = [c for c in ddp["schedule"]["collectives"] if c["group_size"] == 8]
  assert between and all(c["op"] == "all-reduce" for c in between)


def test_the_round_in_flight_runs_under_the_whole_step(quick):
  """Compiled as the overlap guide shows (lordo_jax.compile_overlapped), the message's
  all-reduce between the 8 workers starts before the first forward GEMM and is done
  after the last backward one."""
  record, _ = quick
  program = _program(record, 'lm lordo overlap="round"')
  between = [c for c in program["schedule"]["collectives"] if c["group_size"] == 8]
  in_flight = [c for c in between if c["in_flight"]]
  assert len(in_flight) == 1, between
  assert in_flight[0]["gemms_between"] == program["schedule"]["model_gemms"] > 0
