"""Reads the collectives of a compiled XLA program, and how deep in conditionals each is.

Used to check the communication ledger against what the program really sends. Reads
both a compiled module (``compiled.as_text()``) and the program as lowered, before the
backend's passes (``lowered.as_text(dialect="hlo")``): XLA's CPU backend widens
bfloat16 collectives to float32, which a GPU's NCCL does not, so the dtypes the
program asks to send are read from the lowered one.
"""

import re
from typing import NamedTuple

import numpy as np

_DTYPE_BYTES = {
  "f32": 4,
  "bf16": 2,
  "f16": 2,
  "s32": 4,
  "u32": 4,
  "f64": 8,
  "s8": 1,
  "u8": 1,
  "pred": 1,
}
_ARRAY = re.compile(r"\b(f32|bf16|f16|s32|u32|f64|s8|u8|pred)\[([0-9,]*)\]")
_COMPUTATION = re.compile(r"^(ENTRY )?%?([\w.\-]+) .*\{$")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRUE_FALSE = re.compile(r"(?:true|false)_computation=%?([\w.\-]+)")
_CALLS = re.compile(r"\b(?:to_apply|calls)=%?([\w.\-]+)")
_LOOP_BODIES = re.compile(r"\bbody=%?([\w.\-]+)")


def _array_bytes(type_text: str) -> tuple[int, int]:
  """(elements, bytes) of every array type in ``type_text``."""
  elements = nbytes = 0
  for dtype, dims in _ARRAY.findall(type_text):
    size = 1
    for d in filter(None, dims.split(",")):
      size *= int(d)
    elements += size
    nbytes += size * _DTYPE_BYTES[dtype]
  return elements, nbytes


def lines_by_depth(hlo_text: str, loops: bool = False):
  """``(depth, line)`` of every instruction reached from the entry computation of a
  compiled module: depth 0 is the entry computation, depth 1 a branch of a conditional
  in it, and so on (a called computation, such as a lowered shard_map body, keeps its
  caller's depth). With ``loops``, the bodies of while loops too, as
  ``(depth, line, in_loop)``."""
  computations: dict[str, list[str]] = {}
  entry = None
  current = None
  for line in hlo_text.splitlines():
    match = _COMPUTATION.match(line)
    if match:
      current = match.group(2)
      computations[current] = []
      if match.group(1):
        entry = current
    elif current is not None and line.startswith("  "):
      computations[current].append(line)

  def visit(name: str, depth: int, in_loop: bool):
    for line in computations[name]:
      yield (depth, line, in_loop) if loops else (depth, line)
      branches = _BRANCHES.search(line)
      names = [b.strip().lstrip("%") for b in branches.group(1).split(",")] if branches else []
      names += _TRUE_FALSE.findall(line)
      for branch in names:
        yield from visit(branch, depth + 1, in_loop)
      for called in _CALLS.findall(line):
        yield from visit(called, depth, in_loop)
      for body in _LOOP_BODIES.findall(line) if loops else ():
        yield from visit(body, depth, True)

  yield from visit(entry, 0, False)


def collectives_by_depth(hlo_text: str, op: str = "all-reduce") -> dict[int, list[tuple[int, int]]]:
  """{conditional depth: [(elements, bytes) of each ``op``]} of a compiled module.

  ``op`` is an HLO collective: ``all-reduce`` (the result is the payload),
  ``all-to-all`` (the result has the operand's size) or ``all-gather`` (the result
  is the gathered array). Depth 0 is the entry computation, depth 1 a branch of a
  conditional in it, and so on (:func:`lines_by_depth`).
  """
  found: dict[int, list[tuple[int, int]]] = {}
  for depth, line in lines_by_depth(hlo_text):
    if f" {op}(" in line or f" {op}-start(" in line:
      result_type = line.split("=", 1)[1].split(f" {op}", 1)[0]
      found.setdefault(depth, []).append(_array_bytes(result_type))
  return found


# The solver library calls of each factorisation, on CPU (LAPACK) and GPU (cuSOLVER, cuBLAS).
_LINEAR_ALGEBRA = {
  "qr": ("geqrf",),
  "svd": ("gesdd", "gesvd"),
  "cholesky": ("potrf",),
  "eigh": ("syevd", "heevd", "syev"),
  "triangular_solve": ("trsm", "triangularSolve"),
}
_TARGET = re.compile(r'custom_call_target="([^"]+)"')


class SolverCall(NamedTuple):
  """One solver-library call of a compiled module."""

  depth: int  # Of conditionals around it (0: the entry computation).
  in_loop: bool  # Inside the body of a while loop (a loop over matrices, say).
  result_type: str  # Its result's type: leading batch axes for a batched call.


def linear_algebra_calls(hlo_text: str, kind: str) -> list[SolverCall]:
  """Every solver-library call of ``kind`` (a key of :data:`_LINEAR_ALGEBRA`: ``qr``,
  ``svd``, ``cholesky``, ``eigh``, ``triangular_solve``) reached from the entry
  computation. A batched call is one call whose operand has leading batch axes; a loop
  of per-matrix calls is one call ``in_loop``."""
  calls = []
  for depth, line, in_loop in lines_by_depth(hlo_text, loops=True):
    target = _TARGET.search(line)
    if target and any(name in target.group(1) for name in _LINEAR_ALGEBRA[kind]):
      result_type = line.split("custom-call(", 1)[0].split("=", 1)[1].strip()
      calls.append(SolverCall(depth, in_loop, result_type))
  return calls


_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = .*?\b([a-z][\w\-]*)\((.*)$")
_PARAMETER = re.compile(r"\bparameter\((\d+)\)")


def _operands(call_text: str) -> list[str]:
  """The ``%names`` inside the operand list that starts ``call_text`` (up to its ``)``)."""
  depth, end = 1, len(call_text)
  for at, char in enumerate(call_text):
    depth += {"(": 1, ")": -1}.get(char, 0)
    if depth == 0:
      end = at
      break
  return re.findall(r"%([\w.\-]+)", call_text[:end])


def _entry(hlo_text: str) -> list[str]:
  """The instruction lines of a module's entry computation."""
  lines, inside = [], False
  for line in hlo_text.splitlines():
    if line.startswith("ENTRY "):
      inside = True
    elif inside and line.startswith("}"):
      break
    elif inside:
      lines.append(line)
  return lines


def collective_inputs(
  hlo_text: str, op: str = "all-reduce", groups: str | None = None
) -> list[set[int]]:
  """For each ``op`` at the top level of a compiled module's entry computation (with
  ``groups``, only those whose ``replica_groups`` are that text: the collectives over
  one mesh axis), the entry parameters (their numbers) it depends on, directly or
  through any instruction.

  A collective can overlap the compute of its step only if it is at the top level (not
  in a conditional's branch or a loop's body) and depends on no parameter computed
  this step (the step's gradients or parameters): :func:`overlappable`.
  """
  inputs: dict[str, list[str]] = {}
  parameters: dict[str, int] = {}
  collectives = []
  for line in _entry(hlo_text):
    match = _INSTRUCTION.match(line)
    if not match:
      continue
    name, opcode, rest = match.groups()
    inputs[name] = _operands(rest)
    number = _PARAMETER.search(line)
    if opcode == "parameter" and number:
      parameters[name] = int(number.group(1))
    if opcode in (op, f"{op}-start") and _in_groups(line, groups):
      collectives.append(name)

  def reached(name: str) -> set[int]:
    seen, todo = set(), [name]
    while todo:
      for operand in inputs.get(todo.pop(), ()):
        if operand not in seen:
          seen.add(operand)
          todo.append(operand)
    return {parameters[n] for n in seen if n in parameters}

  return [reached(name) for name in collectives]


def _in_groups(line: str, groups: str | None) -> bool:
  """Whether ``line``'s collective runs over ``groups`` (written ``{{0,2},{1,3}}``),
  whichever way XLA prints its replica groups."""
  return groups is None or replica_groups(line) == replica_groups(f"replica_groups={groups}")


_EXPLICIT = re.compile(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}")
_IOTA = re.compile(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")
_MESH = re.compile(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}")


def replica_groups(line: str) -> frozenset[frozenset[int]] | None:
  """The replica groups of an HLO collective, as sets of device ids, from any of the
  forms XLA prints: explicit (``{{0,2,4,6},{1,3,5,7}}``), iota
  (``[2,4]<=[4,2]T(1,0)``: the devices ``0..n-1`` laid out as ``[4,2]``, transposed,
  reshaped to groups of 4) or named mesh axes (``mesh['workers'=4,'fsdp'=2]
  {'workers'}``: devices in mesh order, one group per index of the other axes)."""

  def sets(rows) -> frozenset[frozenset[int]]:
    return frozenset(frozenset(int(d) for d in row) for row in rows)

  if match := _EXPLICIT.search(line):
    return sets(row.split(",") for row in re.findall(r"\{([\d,]+)\}", match.group(1)))
  if match := _IOTA.search(line):
    shape = [int(d) for d in match.group(1).split(",")]
    dims = [int(d) for d in match.group(2).split(",")]
    devices = np.arange(int(np.prod(dims))).reshape(dims)
    if match.group(3):
      devices = devices.transpose([int(d) for d in match.group(3).split(",")])
    return sets(devices.reshape(shape))
  if match := _MESH.search(line):
    axes = [
      (name.strip(" '"), int(size))
      for name, size in (axis.split("=") for axis in match.group(1).split(","))
    ]
    chosen = {name.strip(" '") for name in match.group(2).split(",")}
    devices = np.arange(int(np.prod([size for _, size in axes]))).reshape([s for _, s in axes])
    inner = [i for i, (name, _) in enumerate(axes) if name in chosen]
    outer = [i for i in range(len(axes)) if i not in inner]
    grouped = devices.transpose(outer + inner).reshape(
      -1, int(np.prod([axes[i][1] for i in inner]))
    )
    return sets(grouped)
  return None


def overlappable(
  hlo_text: str, computed_this_step: set[int], op: str = "all-reduce", groups: str | None = None
) -> bool:
  """Whether every ``op`` of the program (with ``groups``, every one over those replica
  groups: the workers, not the collectives of a model split inside each worker) could
  run under its step's compute: each one at the top level of the entry computation
  (none in a conditional or a loop) and none depending on the entry parameters
  ``computed_this_step``."""
  top = collective_inputs(hlo_text, op, groups)
  lines = re.findall(rf"^.*= [^=]*? {op}(?:-start)?\(.*$", hlo_text, re.M)
  everywhere = sum(_in_groups(line, groups) for line in lines)
  return everywhere == len(top) > 0 and not any(reads & computed_this_step for reads in top)
