"""The package's layers import only downwards, and the local step never communicates.

Read from the source with ``ast``, so that an import that breaks the layering (the local
step reaching the collectives, a cycle) fails here, not in a reviewer's eye. The layers are folders
(docs/ARCHITECTURE.md); :data:`LAYERS` is their rule, one line per folder.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "lordo_jax"
# Modules whose code sends messages between workers.
COMMUNICATING = {"lordo_jax.comm._collectives"}
# Each folder of the package and the other folders its modules may import.
LAYERS = {
  "local": set(),  # the local step imports nothing from the round, comm or above
  "comm": {"local"},  # low-rank DDP's projected mean takes the local step apart
  "round": {"local", "comm"},  # the round communicates through comm only
  "state": {"local", "comm", "round"},  # reads the states every layer makes
  "methods": {"local", "comm", "round"},  # the optimizers, chains of the layers below
}
# Helpers every layer may import; they import nothing from the package but each other.
SHARED = {
  "lordo_jax._checks",
  "lordo_jax._keywords",
  "lordo_jax._sharded",
  "lordo_jax._tree_structure",
}


def _sources():
  return sorted(PACKAGE.rglob("*.py"))


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


def _layer(module: str) -> str:
  """``local`` for ``lordo_jax.local._routing``; the module itself for a shared helper."""
  return module if module in SHARED else module.split(".")[1]


def _layer_modules(layer: str) -> list[str]:
  return [_module_name(path) for path in sorted((PACKAGE / layer).rglob("*.py"))]


def test_every_module_is_in_a_layer_or_shared():
  modules = set(_import_graph())
  layered = {m for layer in LAYERS for m in _layer_modules(layer)}
  assert modules - layered == SHARED | {"lordo_jax.checkpoint"}


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_a_layer_imports_only_itself_the_layers_below_and_the_shared_helpers(layer):
  graph = _import_graph()
  allowed = LAYERS[layer] | {layer}
  wrong = {
    module: sorted(m for m in imports if m not in SHARED and _layer(m) not in allowed)
    for module in _layer_modules(layer)
    for imports in [graph[module]]
  }
  assert not {k: v for k, v in wrong.items() if v}, f"{layer}/ imports above itself"


def test_the_shared_helpers_and_the_checkpoint_module_import_nothing_of_the_layers():
  graph = _import_graph()
  for module in SHARED:
    assert graph[module] <= SHARED, module
  assert not graph["lordo_jax.checkpoint"]


def test_the_import_check_sees_a_communicating_import():
  assert imported_modules("from lordo_jax.comm import _collectives\n") & COMMUNICATING
  assert imported_modules("import lordo_jax.comm._collectives as c\n") & COMMUNICATING
  graph = {"a": {"b"}, "b": {"lordo_jax.comm._collectives"}, "c": set()}
  assert reachable(graph, "a") & COMMUNICATING
  assert not reachable(graph, "c") & COMMUNICATING


def test_the_communicating_layer_is_seen():
  """The check has something to find: the round and low-rank DDP do communicate."""
  graph = _import_graph()
  for module in (
    "lordo_jax.round._synchronize",
    "lordo_jax.comm._projected_mean",
    "lordo_jax.round._averaging",
  ):
    assert reachable(graph, module) & COMMUNICATING, module


@pytest.mark.parametrize("module", _layer_modules("local"))
def test_the_local_step_imports_nothing_that_communicates(module):
  """The local step and its bases never import the collectives, not even through others."""
  graph = _import_graph()
  assert module in graph, module
  assert not reachable(graph, module) & COMMUNICATING


def module_graph() -> dict[str, set[str]]:
  """:func:`_import_graph` without a module's edges to its own packages: Python runs a
  package's ``__init__`` before any of its modules, so those are not import cycles."""
  return {
    module: {m for m in imports if m != module and not module.startswith(m + ".")}
    for module, imports in _import_graph().items()
  }


def test_no_module_imports_itself_through_others():
  graph = module_graph()
  assert not [m for m in graph if m in reachable(graph, m)]


def test_the_cycle_check_sees_a_cycle():
  graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
  assert [m for m in graph if m in reachable(graph, m)] == ["a", "b", "c"]
