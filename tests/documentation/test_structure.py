"""The package's shape: short functions, and layers that import only downwards.

Read from the source with ``ast``, so that a change that breaks the layering or grows
a function past the limit fails here, not in a reviewer's eye. The layers are folders
(docs/ARCHITECTURE.md); :data:`LAYERS` is their rule, one line per folder.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "lordo_jax"
MAX_FUNCTION_LINES = 80
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


def _route_to_the_svd(monkeypatch) -> list[str]:
  """The package's functions on the stack from ``synchronize``'s ``_update`` to the SVD
  of a basis refresh at a sync of ``lordo``, outermost first, each as
  ``folder/module.function``."""
  import inspect

  import jax
  import jax.numpy as jnp

  import lordo_jax
  from lordo_jax.local.bases import svd

  routes, top = [], svd.top_singular_vectors

  def recorded(*args, **kwargs):
    # A comprehension is a frame on Python 3.11 (not 3.12, PEP 709), not a call.
    frames = [f for f in inspect.stack() if str(PACKAGE) in f.filename][::-1]
    frames = [f for f in frames if not f.function.startswith("<")]
    where = lambda f: pathlib.Path(f.filename).relative_to(PACKAGE).with_suffix("")  # noqa: E731
    routes.append([f"{where(f).as_posix()}.{f.function}" for f in frames])
    return top(*args, **kwargs)

  monkeypatch.setattr(svd, "top_singular_vectors", recorded)
  tx = lordo_jax.lordo(1e-2, rank=2, sync_every=1, init_projection="random", projection="svd")
  params = {"w": jnp.ones((8, 4))}
  jax.eval_shape(tx.update, params, tx.init(params), params)
  (route,) = routes
  return route[[i for i, name in enumerate(route) if name == "round/_synchronize._update"][0] :]


# The layers from the lowest up: a call goes to its own layer or one below it.
LAYER_ORDER = ("local", "comm", "round", "state", "methods")


def test_a_refresh_at_a_sync_reaches_the_projection_method_in_at_most_6_calls(monkeypatch):
  """Whatever the functions are called: from synchronize's update to the SVD method's
  compute in at most 6 calls, and never a call back up the layers."""
  route = _route_to_the_svd(monkeypatch)
  assert route[0] == "round/_synchronize._update", route
  assert route[-1].startswith("local/bases/svd."), route
  assert len(route) - 1 <= 6, route
  layers = [LAYER_ORDER.index(frame.split("/")[0]) for frame in route]
  assert layers == sorted(layers, reverse=True), route


def test_building_lordo_reaches_the_projection_method_in_at_most_5_calls(monkeypatch):
  """From the call ``lordo(...)`` (its keyword check included) to the function that makes
  the SVD method, the route a reader follows through the build in at most 5 calls, never
  back up the layers (it was 8 when the options travelled as ``**options``)."""
  import inspect

  import lordo_jax
  from lordo_jax.local import bases

  routes, make = [], bases.ONE_SIDED["svd"]

  def recorded(*args, **kwargs):
    frames = [f for f in inspect.stack() if str(PACKAGE) in f.filename][::-1]
    where = lambda f: pathlib.Path(f.filename).relative_to(PACKAGE).with_suffix("")  # noqa: E731
    routes.append([f"{where(f).as_posix()}.{f.function}" for f in frames])
    return make(*args, **kwargs)

  monkeypatch.setitem(bases.ONE_SIDED, "svd", recorded)
  lordo_jax.lordo(1e-2, rank=2, sync_every=4, projection="svd")
  (route,) = routes
  assert route[0] == "_keywords.wrapper" and route[1] == "methods/lordo.lordo", route
  assert route[-1] == "local/bases/__init__.method", route
  assert len(route) <= 5, route  # the calls: each frame, and the projection's own method
  layers = [LAYER_ORDER.index(frame.split("/")[0]) for frame in route[1:]]
  assert layers == sorted(layers, reverse=True), route


MAX_MODULE_DOCSTRING_LINES = 10


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_module_docstring_says_what_the_module_is_for_in_a_few_lines(path):
  """The mathematics belongs on the public functions, where help() and the API reference
  show it; a module's docstring says what the module holds."""
  lines = _docstring_lines(ast.parse(path.read_text()))
  assert lines <= MAX_MODULE_DOCSTRING_LINES, f"{path.name}: {lines} lines"


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


def module_aliases(sources) -> dict[str, set[str]]:
  """Every module of the package that ``sources`` import by ``from ... import``, and
  the names they import it under."""
  aliases = {}
  for source in sources:
    for node in ast.walk(ast.parse(source)):
      if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lordo_jax"):
        for alias in node.names:
          path = PACKAGE.parent / f"{node.module}.{alias.name}".replace(".", "/")
          if path.with_suffix(".py").exists() or path.is_dir():
            aliases.setdefault(f"{node.module}.{alias.name}", set()).add(alias.asname or alias.name)
  return aliases


def test_every_module_is_imported_under_one_name():
  """One name per module across the package (``low_rank_lib`` wherever
  ``local/_low_rank_adam.py`` is imported), and no name for two modules: a bare name
  such as ``low_rank`` is then always a value, never the module."""
  aliases = module_aliases(path.read_text() for path in _sources())
  assert {module: names for module, names in aliases.items() if len(names) > 1} == {}
  owners = {}
  for module, (name,) in aliases.items():
    owners.setdefault(name, []).append(module)
  assert {name: modules for name, modules in owners.items() if len(modules) > 1} == {}


def test_the_alias_check_sees_a_module_under_two_names():
  sources = [
    "from lordo_jax.local import _low_rank_adam as low_rank",
    "from lordo_jax.local import _low_rank_adam as low_rank_lib",
    "from lordo_jax.local._low_rank_adam import scale_by_low_rank_adam",  # A function.
  ]
  assert module_aliases(sources) == {"lordo_jax.local._low_rank_adam": {"low_rank", "low_rank_lib"}}


def shadowed_modules(source: str) -> set[str]:
  """The names of modules a source imports that it also binds to a value (an
  assignment, a parameter, a loop variable)."""
  tree = ast.parse(source)
  modules = set()
  for node in tree.body:
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lordo_jax"):
      for alias in node.names:
        path = PACKAGE.parent / f"{node.module}.{alias.name}".replace(".", "/")
        if path.with_suffix(".py").exists() or path.is_dir():
          modules.add(alias.asname or alias.name)
  bound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
  bound |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in n.args}
  bound |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in n.kwonlyargs}
  return modules & bound


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_name_is_also_a_value(path):
  assert shadowed_modules(path.read_text()) == set()


def test_the_shadow_check_sees_a_module_bound_to_a_value():
  source = (
    "from lordo_jax import _sharded as sharded\n\ndef f(x):\n  sharded = [x]\n  return sharded\n"
  )
  assert shadowed_modules(source) == {"sharded"}
  assert shadowed_modules("from lordo_jax import _sharded as sharded\n\ndef f(sharded): ...") == {
    "sharded"
  }


def bound_names(source: str) -> set[str]:
  """Every name a source binds: functions, classes, assignments, loop variables,
  parameters and import aliases."""
  names = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      names.add(node.name)
    elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
      names.add(node.id)
    elif isinstance(node, ast.arg):
      names.add(node.arg)
    elif isinstance(node, ast.alias):
      names.add(node.asname or node.name.split(".")[-1])
  return names


# Names that meant two or three things, each now bound only where it keeps its one
# meaning (the folders of the package where it may be bound; () for nowhere).
ONE_MEANING = {
  "overlap": ("round", "methods"),  # the message in flight; the change of basis is change_of_basis
  "layout": ("checkpoint.py",),  # a checkpoint's record; MessageLayout, row_layout, _sharded
  "Layout": (),
  "mean": ("local", "comm"),  # a list of arrays to its average (Averaging has gradient_mean)
  "schedules": (),  # round/_periods is periods
  "round_schedule": (),  # round/_schedule is schedule
  "local_step_": (),  # the local optimizer is local_optimizer
  # A step's number, or LowRankAdam.step taking one; never the low-rank step's options
  # (step_options) in methods/, where the three met beside the module local_step.
  "step": ("local", "round", "state", "checkpoint.py"),
}


def misplaced_names(sources: dict[str, str]) -> list[str]:
  """``relative path: name`` for each name of :data:`ONE_MEANING` a source binds outside
  the places where it keeps its meaning."""
  found = []
  for relative, source in sources.items():
    top = relative.split("/")[0]
    for name in sorted(bound_names(source) & set(ONE_MEANING)):
      if top not in ONE_MEANING[name]:
        found.append(f"{relative}: {name}")
  return found


def test_a_name_with_one_meaning_is_bound_only_where_it_has_it():
  sources = {p.relative_to(PACKAGE).as_posix(): p.read_text() for p in _sources()}
  assert misplaced_names(sources) == []


def test_the_meaning_check_sees_a_name_come_back():
  sources = {
    "local/bases/strategy.py": "def overlap(new, old):\n  return new.T @ old\n",
    "round/_overlap.py": "class Layout:\n  pass\n",
    "methods/lordo.py": "step = object()\nimport x as schedules\n",
  }
  assert misplaced_names(sources) == [
    "local/bases/strategy.py: overlap",
    "round/_overlap.py: Layout",
    "methods/lordo.py: schedules",
    "methods/lordo.py: step",
  ]
