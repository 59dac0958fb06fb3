"""benchmarks/speed/step_profile.py in quick mode, in a subprocess: every candidate profiled,
its kernels counted from the profiler's trace and named from the compiled HLO, and
LoRDO's local step compiled with ``round_phase`` running fewer kernels than the one
program, with no conditional and no copy in its HLO, and, batched by shape (an
accelerator's grouping, forced on this CPU), fewer kernels and products than per matrix."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.speed import step_profile  # noqa: E402

pytestmark = pytest.mark.timeout(400)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
  out = tmp_path_factory.mktemp("step_profile")
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
  done = subprocess.run(
    [
      sys.executable,
      str(ROOT / "benchmarks" / "speed" / "step_profile.py"),
      "--quick",
      "--out",
      str(out),
    ]
    + ["--sections", "optimizer,lm"],
    capture_output=True,
    text=True,
    env=env,
    cwd=ROOT,
    timeout=380,
  )
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
  return json.loads((out / "step_profile_cpu.json").read_text()), out


def test_every_candidate_is_profiled(result):
  record, out = result
  names = [p["name"] for p in record["profiles"]]
  assert names == [
    "adamw",
    "local_adam",
    "lordo",
    "lordo, round phase",
    "lordo, round phase, batched by shape",
    "lm ddp",
    "lm lordo",
    "lm lordo, round phase",
    "lm lordo, round phase, batched by shape",
  ]
  for p in record["profiles"]:
    assert p["wall_ms"] > 0 and p["kernel_ms"] > 0 and p["kernels_per_step"] > 0, p["name"]
    assert abs(sum(r["ms"] for r in p["ops"]) - p["kernel_ms"]) < 1e-9
    assert (out / "hlo" / f"{p['name'].replace(' ', '_')}.hlo.txt").exists()
    # Every traced op is an instruction of the compiled step (its opcode read from the HLO).
    assert all(r["opcode"] != "?" for r in p["ops"]), p["name"]
  assert f"`{record['command']}`" in (out / "step_profile_cpu.md").read_text()


def copies(profile) -> list[str]:
  """The shapes of the copies a profiled step ran."""
  return [r["shape"] for r in profile["ops"] if r["kind"] == "copy"]


def test_the_round_phase_removes_the_rounds_conditional_and_copies(result):
  record, out = result
  profiles = {p["name"]: p for p in record["profiles"]}
  for one, phased in (("lordo", "lordo, round phase"), ("lm lordo", "lm lordo, round phase")):
    assert profiles[phased]["kernels_per_step"] < profiles[one]["kernels_per_step"]
    assert "conditional" not in {kind for kind, _, _ in profiles[phased]["by_kind"]}
    assert "conditional" in {kind for kind, _, _ in profiles[one]["by_kind"]}
    assert len(copies(profiles[phased])) < len(copies(profiles[one]))
    hlo = (out / "hlo" / f"{phased.replace(' ', '_')}.hlo.txt").read_text()
    assert " conditional(" not in hlo


def test_a_local_step_batched_by_shape_runs_fewer_kernels_and_products(result):
  """The quick shapes' 2 layers: each of the 4 shapes' 2 matrices in one batched
  computation, so 2 products per shape where per matrix takes 2 per matrix."""
  record, out = result
  profiles = {p["name"]: p for p in record["profiles"]}
  assert step_profile.REGROUPED == "lordo, round phase, batched by shape"  # On a CPU.
  for prefix in ("", "lm "):
    per_matrix, batched = (f"{prefix}lordo, round phase", f"{prefix}{step_profile.REGROUPED}")
    assert profiles[batched]["kernels_per_step"] < profiles[per_matrix]["kernels_per_step"]
    products = {
      name: (out / "hlo" / f"{name.replace(' ', '_')}.hlo.txt").read_text().count(" dot(")
      for name in (per_matrix, batched)
    }
    assert products[batched] < products[per_matrix], products


def test_kind_of_reads_gemms_fusions_and_custom_calls():
  assert step_profile.kind_of("custom-call", 'custom_call_target="__cublas$gemm"') == "gemm"
  assert step_profile.kind_of("fusion", "kind=kCustom, calls=%gemm_fusion") == "gemm"
  assert step_profile.kind_of("fusion", "kind=kLoop") == "fusion"
  target = 'custom_call_target="lapack_spotrf_ffi"'
  assert step_profile.kind_of("custom-call", target) == "custom-call lapack_spotrf_ffi"
  assert step_profile.kind_of("copy", "") == "copy"
