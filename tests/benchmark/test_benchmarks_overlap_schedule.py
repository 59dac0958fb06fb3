"""benchmarks/overlap/overlap_schedule.py: its reader of a compiled schedule on hand-written GPU
HLO (async pairs around cuBLAS and Triton GEMMs, at the top level and nested), and its
quick mode on 8 CPU devices, where the overlapped programs' collective sits at the top
level of the step and the controls' only in the round's conditional."""

import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.overlap import overlap_schedule as schedule  # noqa: E402

pytestmark = pytest.mark.timeout(300)

FWD = 'metadata={op_name="jit(step)/shard_map/jvp(loss)/dot_general"}'
BWD = 'metadata={op_name="jit(step)/shard_map/transpose(jvp(loss))/dot_general"}'
OPTIMIZER = 'metadata={op_name="jit(step)/shard_map/dot_general"}'
ASYNC = (
  'backend_config={"operation_queue_id":"0","wait_on_operation_queues":[],'
  '"collective_backend_config":{"is_sync":false,"no_parallel_custom_call":false}}'
)
HEADER = """HloModule jit_step, is_scheduled=true

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(f32[] %x, f32[] %y)
}

%gemm_fusion_dot.1_computation (p0: f32[64,64], p1: f32[64,64]) -> f32[64,64] {
  %p0 = f32[64,64]{1,0} parameter(0)
  %p1 = f32[64,64]{1,0} parameter(1)
  ROOT %dot.1 = f32[64,64]{1,0} dot(f32[64,64]{1,0} %p0, f32[64,64]{1,0} %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""  # noqa: E501
LINES = {
  "params": "%params = f32[64,64]{1,0} parameter(0)",
  "carried": "%carried = f32[64]{0} parameter(1)",
  "start": "%all-reduce-start = f32[64]{0} all-reduce-start(f32[64]{0} %carried), channel_id=1, "
  f"replica_groups={{{{0,1,2,3,4,5,6,7}}}}, use_global_device_ids=true, to_apply=%add, {ASYNC}",
  "cublas": "%custom-call.1 = (f32[64,64]{1,0}, s8[4194304]{0}) custom-call(f32[64,64]{1,0} "
  f'%params, f32[64,64]{{1,0}} %params), custom_call_target="__cublas$gemm", {FWD}',
  "gte": "%get-tuple-element.1 = f32[64,64]{1,0} get-tuple-element((f32[64,64]{1,0}, "
  "s8[4194304]{0}) %custom-call.1), index=0",
  "triton": "%gemm_fusion_dot.1 = f32[64,64]{1,0} fusion(f32[64,64]{1,0} %get-tuple-element.1, "
  "f32[64,64]{1,0} %params), kind=kCustom, calls=%gemm_fusion_dot.1_computation, "
  f'{BWD}, backend_config={{"fusion_backend_config":{{"kind":"__triton_gemm"}}}}',
  "optimizer": "%custom-call.2 = (f32[64,64]{1,0}, s8[4194304]{0}) custom-call(f32[64,64]{1,0} "
  f'%params, f32[64,64]{{1,0}} %params), custom_call_target="__cublas$lt$matmul", {OPTIMIZER}',
  "done": "%all-reduce-done = f32[64]{0} all-reduce-done(f32[64]{0} %all-reduce-start)",
  "root": "ROOT %tuple = (f32[64,64]{1,0}, f32[64]{0}) tuple(f32[64,64]{1,0} "
  "%gemm_fusion_dot.1, f32[64]{0} %all-reduce-done)",
}


def _module(*keys: str, computations: str = "") -> schedule.Module:
  """A module whose entry computation holds :data:`LINES`' ``keys`` in that order."""
  entry = "\n".join(f"  {LINES.get(k, k)}" for k in keys)
  text = f"{HEADER}{computations}\nENTRY %main (params: f32[64,64], carried: f32[64]) -> (f32[64,64], f32[64]) {{\n{entry}\n}}\n"  # noqa: E501
  return schedule.parse(text)


def test_a_pair_around_every_gemm_of_the_step_is_in_flight():
  module = _module("params", "carried", "start", "cublas", "gte", "triton", "optimizer", "done")
  assert [i.opcode for i in module.computations["main"]][2:5] == [
    "all-reduce-start",
    "custom-call",
    "get-tuple-element",
  ]
  (window,) = schedule.collective_windows(module)
  assert window.op == "all-reduce" and window.asynchronous and not window.is_sync
  assert (window.start, window.done, window.first_gemm, window.last_gemm) == (2, 7, 3, 5)
  assert (window.gemms_before, window.gemms_between, window.gemms_after) == (0, 2, 0)
  assert window.in_flight and not window.nested and window.group_size == 8


def test_a_pair_started_after_the_gemms_is_not_in_flight():
  module = _module("params", "carried", "cublas", "gte", "triton", "start", "optimizer", "done")
  (window,) = schedule.collective_windows(module)
  assert (window.start, window.done, window.first_gemm, window.last_gemm) == (5, 7, 2, 4)
  assert (window.gemms_before, window.gemms_between, window.gemms_after) == (2, 0, 0)
  assert not window.in_flight


def test_a_pair_done_before_the_last_gemm_is_not_in_flight():
  module = _module("params", "carried", "start", "cublas", "gte", "done", "triton", "root")
  (window,) = schedule.collective_windows(module)
  assert (window.gemms_before, window.gemms_between, window.gemms_after) == (0, 1, 1)
  assert not window.in_flight


def test_the_summary_counts_gemms_and_collectives():
  text = "\n".join(
    [
      HEADER,
      "ENTRY %main (params: f32[64,64], carried: f32[64]) -> (f32[64,64], f32[64]) {",
      *(f"  {LINES[k]}" for k in ("params", "carried", "start", "cublas", "gte", "triton")),
      f"  {LINES['optimizer']}",
      f"  {LINES['done']}",
      "  %trivial = f32[64]{0} all-reduce(f32[64]{0} %carried), channel_id=2, "
      "replica_groups={{0},{1},{2},{3},{4},{5},{6},{7}}, to_apply=%add",
      "  %blocking = f32[64]{0} all-reduce(f32[64]{0} %carried), channel_id=3, "
      "replica_groups=[2,4]<=[8], to_apply=%add",
      f"  {LINES['root']}",
      "}",
    ]
  )
  summary = schedule.schedule_summary(text)
  assert (summary["gemms"], summary["model_gemms"]) == (3, 2)
  assert (summary["asynchronous"], summary["in_flight"], summary["marked_sync"]) == (1, 1, 0)
  assert (summary["synchronous"], summary["trivial"]) == (1, 1)
  blocking = summary["collectives"][1]
  assert blocking["group_size"] == 4 and (blocking["start"], blocking["done"]) == (9, 9)
  assert blocking["gemms_before"] == 2 and not blocking["in_flight"]


def test_a_pair_xla_marked_synchronous_is_counted_so():
  marked = LINES["start"].replace('"is_sync":false', '"is_sync":true')
  module = _module("params", "carried", "cublas", marked, "done", "triton")
  (window,) = schedule.collective_windows(module)
  assert window.is_sync and window.asynchronous and (window.start, window.done) == (3, 4)
  assert (window.gemms_before, window.gemms_between, window.gemms_after) == (1, 0, 1)


def test_an_async_all_to_all_printed_without_percent_signs():
  """Newer XLA prints names without ``%``; an all-to-all runs in an ``async-start``."""
  text = f"""HloModule m, is_scheduled=true

wrapped_all_to_all {{
  p = f32[8,64]{{1,0}} parameter(0)
  ROOT a2a = f32[8,64]{{1,0}} all-to-all(p), replica_groups=[1,8]<=[8], dimensions={{0}}
}}

ENTRY main.9_spmd {{
  p0 = f32[8,64]{{1,0}} parameter(0)
  w = f32[64,64]{{1,0}} parameter(1)
  a2a-start = ((f32[8,64]{{1,0}}), f32[8,64]{{1,0}}) async-start(p0), calls=wrapped_all_to_all
  gemm = (f32[8,64]{{1,0}}, s8[0]{{0}}) custom-call(p0, w), custom_call_target="__cublas$lt$matmul", {FWD}
  ROOT a2a-done = f32[8,64]{{1,0}} async-done(a2a-start)
}}
"""  # noqa: E501
  module = schedule.parse(text)
  assert module.entry == "main.9_spmd"
  assert module.computations["main.9_spmd"][2].operands == ("p0",)
  (window,) = schedule.collective_windows(module)
  assert (window.op, window.group_size, window.start, window.done) == ("all-to-all", 8, 2, 4)
  assert window.in_flight


def test_collectives_in_called_computations():
  """A pair in a loop body is placed among the body's GEMMs; a blocking all-reduce in a
  conditional's branch is placed at the conditional in the entry; a command buffer's
  GEMMs count at its call."""
  computations = f"""
%body (state: f32[64]) -> f32[64] {{
  %state = f32[64]{{0}} parameter(0)
  %body-start = f32[64]{{0}} all-reduce-start(f32[64]{{0}} %state), replica_groups={{{{0,1,2,3,4,5,6,7}}}}, to_apply=%add, {ASYNC}
  %w = f32[64,64]{{1,0}} constant({{...}})
  {LINES["cublas"].replace("%params", "%w")}
  ROOT %body-done = f32[64]{{0}} all-reduce-done(f32[64]{{0}} %body-start)
}}

%cond (state: f32[64]) -> pred[] {{
  %state.1 = f32[64]{{0}} parameter(0)
  ROOT %false = pred[] constant(false)
}}

%branch_0 (carried: f32[64]) -> f32[64] {{
  ROOT %carried.2 = f32[64]{{0}} parameter(0)
}}

%branch_1 (carried: f32[64]) -> f32[64] {{
  %carried.3 = f32[64]{{0}} parameter(0)
  ROOT %sync = f32[64]{{0}} all-reduce(f32[64]{{0}} %carried.3), replica_groups={{{{0,1,2,3,4,5,6,7}}}}, to_apply=%add
}}

%command_buffer (params.1: f32[64,64]) -> f32[64,64] {{
  %params.1 = f32[64,64]{{1,0}} parameter(0)
  {LINES["triton"].replace("%get-tuple-element.1", "%params.1").replace("%params)", "%params.1)")}
  ROOT %gemm_fusion_dot.2 = f32[64,64]{{1,0}} fusion(f32[64,64]{{1,0}} %gemm_fusion_dot.1, f32[64,64]{{1,0}} %params.1), kind=kCustom, calls=%gemm_fusion_dot.1_computation, {BWD}
}}
"""  # noqa: E501
  module = _module(
    "params",
    "carried",
    "start",
    "%call = f32[64,64]{1,0} call(f32[64,64]{1,0} %params), to_apply=%command_buffer",
    "%loop = f32[64]{0} while(f32[64]{0} %carried), condition=%cond, body=%body",
    "%index = s32[] constant(1)",
    "%branch = f32[64]{0} conditional(s32[] %index, f32[64]{0} %loop, f32[64]{0} %loop), "
    "branch_computations={%branch_0, %branch_1}",
    "done",
    computations=computations,
  )
  entry, body, branch = schedule.collective_windows(module)
  assert (entry.start, entry.done, entry.first_gemm, entry.last_gemm) == (2, 7, 3, 4)
  assert (entry.gemms_before, entry.gemms_between, entry.gemms_after) == (0, 3, 0)
  assert entry.in_flight and not entry.nested
  assert (body.computation, body.nested, body.entry_position) == ("body", True, 4)
  assert (body.start, body.done, body.first_gemm, body.gemms_between) == (1, 4, 3, 1)
  assert body.in_flight
  assert (branch.computation, branch.entry_position, branch.start, branch.done) == (
    "branch_1",
    6,
    1,
    1,
  )
  assert not branch.asynchronous and not branch.in_flight and branch.first_gemm is None


def test_quick_mode_on_cpu(tmp_path):
  """The four programs of DiLoCo compile on 8 CPU devices; the round in flight and
  ``overlap=1``'s send step have their chunk's all-reduce at the top level of the step,
  the blocking sync and the local step only in a conditional. DiLoCo's programs compile
  in less time than LoRDO's, and the script's wiring is the method's: LoRDO's sync, its
  round in flight and its send and local steps are checked the same way on the library's
  programs (``tests/comm/test_overlap_check.py``, ``tests/round/test_overlap.py``). The
  script's ``main`` runs here: it compiles in a child process of its own, as from the
  command line."""
  status = schedule.main(["--quick", "--methods", "diloco", "--out", str(tmp_path)])
  record = json.loads((tmp_path / "overlap_schedule.json").read_text())
  markdown = (tmp_path / "overlap_schedule.md").read_text()
  (run,) = record["runs"]
  assert status == 0 and "error" not in run, run.get("error")
  assert record["quick"] and record["preset"] == "tiny" and record["workers"] == 8
  assert "--quick --methods diloco --out" in record["command"]
  assert run["setting"] == "default" and run["devices"] == 8 and run["backend"] == "cpu"
  assert f"Device: {run['device_kind']} (cpu, 8 devices)." in markdown
  programs = {p["program"]: p for p in run["programs"]}
  assert list(programs) == [name for name, _, _ in schedule.PROGRAMS]
  for name, p in programs.items():
    assert p["model_gemms"] > 0 and p["asynchronous"] == p["in_flight"] == 0, name
    top = [c for c in p["collectives"] if not c["nested"]]
    assert bool(top) == (name in ('overlap="round"', "overlap=1, send")), (name, top)
    assert all(c["group_size"] == 8 and c["op"] == "all-reduce" for c in p["collectives"])
    assert f"| diloco | {name} | default | {p['gemms']} ({p['model_gemms']}) |" in markdown


@pytest.mark.parametrize(
  ("groups", "size"),
  [
    ("replica_groups={{0,1,2,3},{4,5,6,7}}", 4),
    ("replica_groups=[4,2]<=[8]", 2),
    ("replica_groups=mesh['workers'=8,'data'=1] {'workers'}", 8),
    ("replica_groups=mesh['workers'=8,'data'=1] {'data'}", 1),
    ("replica_groups=mesh['workers'=4,'data'=2] {'workers','data'}", 8),
    ("channel_id=1", None),
  ],
)
def test_group_size_reads_each_form_xla_prints(groups, size):
  """Explicit groups, iota groups and jax 0.12's mesh form (a reduction over an axis of
  size one, the model's backward pass over ``data``, sends nothing)."""
  line = f"%all-reduce = f32[8]{{0}} all-reduce(f32[8]{{0}} %x), {groups}, to_apply=%add"
  assert schedule.group_size(line) == size
