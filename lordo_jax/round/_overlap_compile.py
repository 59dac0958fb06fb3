"""A training step compiled so that, on a GPU, the message in flight runs under all of it.

The chunk a step sends (:mod:`lordo_jax.round._overlap`) reads nothing the step
computes, but XLA's GPU scheduler starts it only as early as its latency model asks (a small part
of the step for a chunk), and one collective at a time. :func:`compile_overlapped`
finds the chunk's collectives in a first compile by their named scope and compiles again
with a profile that says they are slow, and every collective allowed in flight at once.
"""

import hashlib
import os
import re
import tempfile
from collections.abc import Callable

import jax

from lordo_jax.round._overlap import IN_FLIGHT_SCOPE

# What the profile says each of the message's collectives costs, in microseconds (10 s):
# longer than any step, so that the scheduler starts it before the first of the step's
# operations it may run under and ends it after the last.
_COST_US = 1e7
_COLLECTIVES = (
  "all-reduce",
  "all-gather",
  "reduce-scatter",
  "all-to-all",
  "ragged-all-to-all",
  "collective-permute",
  "collective-broadcast",
)
_STARTS = tuple(f"{c}-start" for c in _COLLECTIVES)
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = .*?\b([a-z][\w\-]*)\((.*)$")
_OPERAND = re.compile(r"%([\w.\-]+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def compile_overlapped(train_step: Callable, *args, **kwargs) -> jax.stages.Compiled:
  """``train_step`` compiled for ``args``; on a GPU, with the message in flight under all
  of it.

  A method built with ``overlap`` (``"round"``, or an int with its ``"send"`` steps,
  :func:`lordo_jax.overlap_phase`) sends a chunk of the last round's message at a step.
  The chunk depends on nothing the step computes, so it may run under the whole forward
  and backward pass; on a GPU, XLA's scheduler decides how much of it. That scheduler
  gives an asynchronous collective only as much compute as its latency model says the
  collective takes (for a chunk, a small part of the step: a few of the step's last
  matrix products), and keeps one collective in flight at a time, so
  that a collective of the step's own (the round's, in its conditional) holds the chunk
  back.

  This function compiles the step once and reads the optimised program for the
  asynchronous collectives of the message: those run in the named scope
  ``lordo_jax_in_flight``, by their ``op_name`` or by that of the operations that read
  their result (where XLA merges several collectives into one buffer, it keeps the
  scope only there). It then compiles the step again, with a profile for XLA's
  profile-guided latency estimator that costs each of them longer than any step
  (``--xla_gpu_pgle_profile_file_or_directory_path``), XLA's latency-hiding scheduler
  on (``--xla_gpu_enable_latency_hiding_scheduler``; the default in recent versions),
  and as many collectives allowed in flight at once as the program starts
  (``--xla_gpu_experimental_parallel_collective_overlap_limit``, by default 1): the chunk then
  starts before the step's first matrix product and is done after its last. These are
  ``compiler_options`` of this compile only, not flags of the process; the profile is a
  small file in the temporary directory, named by its contents, so that a persistent
  compilation cache finds the program again. On any other platform, or where the
  program sends no such collective (no ``overlap``; the ``"local"`` steps), the first
  compile is returned.

  The cost: two compiles on a GPU; and the message's collective may share the links
  with one of the step's own (at a round's end, or a sharded model's gather), the two
  then side by side. A message sent compressed is a chain of collectives, each waiting
  for the one before: the last runs under the whole step, the others before it.

  Args:
    train_step: the training step, jitted with :func:`jax.jit` (any other function is
      jitted here, with jit's defaults).
    *args: its arguments, arrays or :class:`jax.ShapeDtypeStruct` objects with their
      shardings, as ``train_step.lower`` takes them (its static arguments included).
    **kwargs: its keyword arguments, likewise.

  Returns:
    The compiled step (:class:`jax.stages.Compiled`). Call it in the step's place, at
    every step, with arguments of the same shapes, dtypes and shardings and without its
    static ones (``compiled(params, state, batch)``); it donates what the jitted step
    donates. A step with a static phase is one program per phase: compile each.

  Examples:
    On a CPU this is ``train_step.lower(*args).compile()``:

    >>> import jax, jax.numpy as jnp, lordo_jax
    >>> train_step = jax.jit(lambda x: x * 2.0 + 1.0)
    >>> compiled = lordo_jax.compile_overlapped(train_step, jnp.zeros(3))
    >>> compiled(jnp.arange(3.0))
    Array([1., 3., 5.], dtype=float32)
  """
  jitted = train_step if hasattr(train_step, "lower") else jax.jit(train_step)
  lowered = jitted.lower(*args, **kwargs)
  compiled = lowered.compile()
  if "gpu" not in _platforms(compiled):
    return compiled
  text = compiled.as_text()
  names = in_flight_collectives(text)
  if not names:
    return compiled
  return lowered.compile(
    compiler_options={
      # The scheduler that reads the profile (XLA's default for GPUs in recent versions).
      "xla_gpu_enable_latency_hiding_scheduler": True,
      "xla_gpu_pgle_profile_file_or_directory_path": _profile_file(names),
      "xla_gpu_experimental_parallel_collective_overlap_limit": _overlap_limit(text),
      # The profile names a few instructions: no warning for each of the others.
      "xla_gpu_pgle_accuracy_checker": "PGLE_STRICTNESS_LEVEL_OFF",
    }
  )


def _overlap_limit(hlo_text: str) -> int:
  """Collectives XLA may keep in flight at once: every asynchronous one of the program
  (at least two), so that none of the step's own (a round's, in its conditional; a
  sharded model's gathers) holds the message back. With two, the round's conditional,
  which holds all-reduces of its own, kept the message in flight behind nearly all of
  the step's forward and backward GEMMs (BENCHMARKS.md, "The GPU program, compiled on
  this CPU")."""
  matches = map(_INSTRUCTION.match, hlo_text.splitlines())
  opcodes = [match.group(2) for match in matches if match]
  return max(2, sum(opcode in _STARTS or opcode == "async-start" for opcode in opcodes))


def _platforms(compiled: jax.stages.Compiled) -> set[str]:
  """The platforms of the devices ``compiled`` runs on (a GPU's is ``"gpu"``, that of
  the devices of a topology compiled for on a host without one included)."""
  shardings = jax.tree.leaves((compiled.input_shardings, compiled.output_shardings))
  return {device.platform for sharding in shardings for device in sharding.device_set}


def in_flight_collectives(hlo_text: str) -> list[str]:
  """The names of the asynchronous collectives of the message in flight in an optimised
  module (``compiled.as_text()``): the ``-start`` instructions whose ``op_name``, that
  of their ``-done``, or that of an instruction reading the ``-done`` holds the named
  scope. XLA drops the ``op_name`` of a collective it builds from several (a tuple's
  parts of one dtype sent as one buffer); the slices that split its result keep it."""
  op_names, opcodes, readers = {}, {}, {}
  for line in hlo_text.splitlines():
    match = _INSTRUCTION.match(line)
    if not match:
      continue
    name, opcode, rest = match.groups()
    op_name = _OP_NAME.search(line)
    op_names[name], opcodes[name] = op_name.group(1) if op_name else "", opcode
    for operand in set(_OPERAND.findall(rest)):
      readers.setdefault(operand, []).append(name)

  def scoped(name: str) -> bool:
    return IN_FLIGHT_SCOPE in op_names.get(name, "")

  found = []
  for name, opcode in opcodes.items():
    if opcode not in _STARTS:
      continue
    dones = [r for r in readers.get(name, ()) if opcodes[r].endswith("-done")]
    around = [r for done in dones for r in readers.get(done, ())]
    if any(map(scoped, [name, *dones, *around])):
      found.append(name)
  return found


def _profile_file(names: list[str]) -> str:
  """A profile (XLA's ``ProfiledInstructionsProto``, as text) that costs each of
  ``names`` :data:`_COST_US`, written under the temporary directory and named by the
  user and its contents (the same program finds the same path in a persistent
  compilation cache's key; another user's file is never replaced); its path."""
  text = "".join(f'costs {{ name: "{n}" cost_us: {_COST_US} }}\n' for n in names)
  digest = hashlib.sha256(text.encode()).hexdigest()[:16]
  path = os.path.join(tempfile.gettempdir(), f"lordo_jax_overlap_{os.getuid()}_{digest}.pbtxt")
  # Written whole, then renamed: processes compiling side by side never read half of it.
  with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(path), delete=False) as f:
    f.write(text)
  os.replace(f.name, path)
  return path
