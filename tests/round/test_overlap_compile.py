"""``lordo_jax.compile_overlapped``: the message in flight under every GEMM of a GPU step.

The example LM's step (``benchmarks/overlap/overlap_schedule.py``'s ``lm_step``, the ``tiny``
preset) compiled on this CPU for 8 H100s (JAX's deviceless compile, the jax-cuda12
plugin of the test extra), for each kind of program the function must handle:
``overlap=1``'s ``"send"`` step (LoRDO's) and a round in flight on 4 workers x FSDP 2
(DiLoCo's). Compiled plainly (the jitted step's own compile, which is also
``compile_overlapped``'s first, so the two cost one compile), the message's all-reduce
between the workers starts after most of the forward/backward GEMMs; compiled by
``compile_overlapped``, it starts before the first GEMM and is done after the last.
LoRDO's round in flight on 8 workers compiled by ``compile_overlapped`` is checked by
``tests/benchmark/test_benchmarks_gpu_program.py`` (the quick run compiles it so).
The reader of the HLO finds the message's collectives by the named scope (also where
XLA merged a tuple's parts into one buffer and dropped the collective's ``op_name``),
and on a CPU the function is a plain compile.
"""

import json
import pathlib
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lordo_jax
from lordo_jax.round import _overlap_compile as overlap_compile
from tests.helpers import gpu_compile
from tests.helpers import workers

pytestmark = pytest.mark.timeout(600)

ROOT = pathlib.Path(__file__).resolve().parents[2]
# (method, overlap, the step's static phase, FSDP): 8 devices, 8 // FSDP workers.
PROGRAMS = {
  "lordo send": ("lordo", 1, "send", 1),
  "diloco round fsdp": ("diloco", "round", None, 2),
}
HOW = ("plain", "overlapped")
# The child: every program of PROGRAMS compiled plainly, then by compile_overlapped (whose
# first compile is the plain one, found in JAX's in-memory cache), each read by
# overlap_schedule.schedule_summary; JSON on stdout's last line.
CHILD = textwrap.dedent(
  """
  import json, sys
  sys.path[:0] = [sys.argv[1], sys.argv[1] + "/examples"]
  import jax
  from jax.experimental import topologies
  from jax.sharding import AxisType, Mesh
  import lordo_jax
  from benchmarks.overlap import overlap_schedule
  from lm import model
  from lordo_jax.round import _overlap_compile

  config = open(sys.argv[1] + "/benchmarks/gpu/targets/h100.txtpb").read()
  topology = topologies.get_topology_desc(
    platform="cuda", target_config=config, topology="1x1x8"
  )
  found = {}
  for name, (method, overlap, phase, fsdp) in json.loads(sys.argv[2]).items():
    names = ("workers", "data") + ("fsdp",) * (fsdp > 1)
    shape = (8 // fsdp, 1) + (fsdp,) * (fsdp > 1)
    devices = topologies.make_mesh(topology, shape, names).devices
    mesh = Mesh(devices, names, axis_types=(AxisType.Auto,) * len(names))
    static = None if phase is None else ("overlap_phase", phase)
    step, args = overlap_schedule.lm_step(
      method, overlap, static, model.PRESETS["tiny"], mesh, 8 // fsdp, fsdp=fsdp
    )
    plain = step.lower(*args).compile()
    overlapped = lordo_jax.compile_overlapped(step, *args)
    for how, compiled in (("plain", plain), ("overlapped", overlapped)):
      text = compiled.as_text()
      found[f"{name}, {how}"] = {
        "platform": mesh.devices.flat[0].platform,
        "schedule": overlap_schedule.schedule_summary(text),
        "named": _overlap_compile.in_flight_collectives(text),
      }
  print(json.dumps(found))
  """
)


@pytest.fixture(scope="module")
def compiled():
  """Each program's schedules, compiled in one child process (the plugin registers only
  in a process whose JAX starts with ``JAX_PLATFORMS=cpu``); the plugin's absence is a
  failure that says what to install."""
  env = gpu_compile.environment()
  done = subprocess.run(
    [sys.executable, "-c", CHILD, str(ROOT), json.dumps(PROGRAMS)],
    capture_output=True,
    text=True,
    env=env,
    cwd=ROOT,
    timeout=560,
  )
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


def _message(summary: dict, workers: int) -> dict:
  """The message's collective: the one all-reduce between the workers at the step's top
  level (a round's own collectives are in its conditional)."""
  (found,) = [
    c
    for c in summary["collectives"]
    if c["op"] == "all-reduce" and c["group_size"] == workers and not c["nested"]
  ]
  return found


def _window(collective: dict) -> tuple[int, int, int]:
  return tuple(collective[f"gemms_{k}"] for k in ("before", "between", "after"))


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_the_message_is_in_flight_under_every_gemm_only_when_compiled_overlapped(
  compiled, name, how
):
  program = compiled[f"{name}, {how}"]
  count = 8 // PROGRAMS[name][3]
  assert program["platform"] == "gpu"
  assert len(program["named"]) == 1, program["named"]  # Found by its named scope.
  message = _message(program["schedule"], count)
  gemms = program["schedule"]["model_gemms"]
  assert gemms > 0 and message["asynchronous"]
  if how == "plain":
    assert not message["in_flight"] and _window(message)[0] > 0, _window(message)
  else:
    assert message["in_flight"] and _window(message) == (0, gemms, 0)


# A module as XLA leaves it where it merges the parts of a tuple's all-reduce into one
# buffer: the collective has no op_name; the slices of its result keep the scope's.
MERGED = """
ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %all-reduce-start.1 = f32[8]{0} all-reduce-start(%p), metadata={scheduling_name="all-reduce-start.1"}
  %all-reduce-done.1 = f32[8]{0} all-reduce-done(%all-reduce-start.1)
  %wrapped_slice = f32[4]{0} fusion(%all-reduce-done.1), kind=kLoop, metadata={op_name="jit(step)/shard_map/lordo_jax_in_flight/psum_invariant"}
  %all-reduce-start.2 = f32[8]{0} all-reduce-start(%p), metadata={op_name="jit(step)/shard_map/cond/psum"}
  %all-reduce-done.2 = f32[8]{0} all-reduce-done(%all-reduce-start.2)
  %all-gather-start = (f32[8]{0}, f32[64]{0}) all-gather-start(%p), metadata={op_name="jit(step)/shard_map/lordo_jax_in_flight/all_gather"}
  %all-gather-done = f32[64]{0} all-gather-done((f32[8]{0}, f32[64]{0}) %all-gather-start)
  ROOT %sum = f32[8]{0} add(%wrapped_slice, %all-reduce-done.2)
}
"""  # noqa: E501


def test_the_messages_collectives_are_found_by_their_scope_or_their_results():
  assert overlap_compile.in_flight_collectives(MERGED) == ["all-reduce-start.1", "all-gather-start"]


def test_on_a_cpu_it_is_the_jitted_steps_program_with_its_results():
  tx = lordo_jax.diloco(0.1, sync_every=2, axis_name=workers.AXIS, overlap="round")
  mesh = jax.make_mesh((4,), (workers.AXIS,))
  spec = jax.sharding.PartitionSpec(workers.AXIS)

  def body(params, state, grads):
    one = lambda t: jax.tree.map(lambda x: x[0], t)  # noqa: E731
    updates, state = tx.update(one(grads), one(state), one(params))
    new = optax.apply_updates(one(params), updates)
    return jax.tree.map(lambda x: x[None], (new, state))

  step = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))
  params = workers.stack({"w": jnp.ones((6, 3)), "b": jnp.zeros(3)}, 4)
  state = workers.stack(tx.init(jax.tree.map(lambda x: x[0], params)), 4)
  grads = jax.tree.map(lambda x: x * jnp.arange(1.0, 5.0).reshape(-1, *[1] * (x.ndim - 1)), params)
  args = workers.shard((params, state, grads), mesh)
  compiled = lordo_jax.compile_overlapped(step, *args)
  assert compiled.as_text() == step.lower(*args).compile().as_text()
  # Each multi-device run waited on before the next (jaxlib 0.10's CPU deadlocks otherwise).
  got = jax.block_until_ready(compiled(*args))
  want = jax.block_until_ready(step(*args))
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_array_equal(g, w)
