"""The package's shape: short functions, and a local step that cannot communicate.

Read from the source with ``ast``, so that a change that breaks the layering or grows
a function past the limit fails here, not in a reviewer's eye.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).parent.parent / "lordo_jax"
MAX_FUNCTION_LINES = 80
# Modules whose code sends messages between workers.
COMMUNICATING = {"lordo_jax.collectives"}
# The local step and everything a basis is made of: none of them may communicate.
LOCAL = ["low_rank.py", "projection.py", "two_sided.py", "quasi_hyperbolic.py", "bases"]


def _sources():
  return sorted(PACKAGE.rglob("*.py"))


def _docstring_lines(node) -> int:
  body = node.body
  if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
    if isinstance(body[0].value.value, str):
      return body[0].end_lineno - body[0].lineno + 1
  return 0


def function_lengths(source: str) -> dict[str, int]:
  """Lines of every function (nested ones too), its docstring not counted."""
  lengths = {}
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      total = node.end_lineno - node.lineno + 1
      lengths[f"{node.name}:{node.lineno}"] = total - _docstring_lines(node)
  return lengths


def imported_modules(source: str) -> set[str]:
  """Every module a source imports, ``from lordo_jax import x`` as ``lordo_jax.x``."""
  names = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      names.add(node.module)
      names.update(f"{node.module}.{alias.name}" for alias in node.names)
  return names


def test_function_lengths_are_counted_without_docstrings():
  source = 'def f():\n  """Doc\n  more."""\n  a = 1\n  return a\n\n\ndef g(): return 1\n'
  assert function_lengths(source) == {"f:1": 3, "g:8": 1}


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_function_is_longer_than_the_limit(path):
  long = {k: n for k, n in function_lengths(path.read_text()).items() if n > MAX_FUNCTION_LINES}
  assert not long, f"{path.name}: functions over {MAX_FUNCTION_LINES} lines: {long}"


def _module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
  """Each module of the package and the package modules it imports directly.

  ``from lordo_jax import x`` is an edge to ``lordo_jax.x`` only: the package's own
  ``__init__`` is imported before any of its modules, whoever imports them.
  """
  modules = {_module_name(path): path for path in _sources()}
  del modules["lordo_jax"]
  return {
    name: {m for m in imported_modules(path.read_text()) if m in modules}
    for name, path in modules.items()
  }


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
  """Every module ``start`` imports, directly or through others."""
  seen, todo = set(), [start]
  while todo:
    for module in graph.get(todo.pop(), ()):
      if module not in seen:
        seen.add(module)
        todo.append(module)
  return seen


def _local_modules() -> list[str]:
  paths = []
  for entry in LOCAL:
    path = PACKAGE / entry
    paths.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
  return [_module_name(path) for path in paths]


def test_the_import_check_sees_a_communicating_import():
  assert imported_modules("from lordo_jax import collectives\n") & COMMUNICATING
  assert imported_modules("import lordo_jax.collectives as c\n") & COMMUNICATING
  graph = {"a": {"b"}, "b": {"lordo_jax.collectives"}, "c": set()}
  assert reachable(graph, "a") & COMMUNICATING
  assert not reachable(graph, "c") & COMMUNICATING


def test_the_communicating_layer_is_seen():
  """The check has something to find: the round and low-rank DDP do communicate."""
  graph = _import_graph()
  for module in ("lordo_jax.sync", "lordo_jax.projected_mean", "lordo_jax.averaging"):
    assert reachable(graph, module) & COMMUNICATING, module


@pytest.mark.parametrize("module", _local_modules())
def test_the_local_step_imports_nothing_that_communicates(module):
  """low_rank.py and the bases never import the collectives, not even through others."""
  graph = _import_graph()
  assert module in graph, module
  assert not reachable(graph, module) & COMMUNICATING
