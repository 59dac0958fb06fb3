"""optax's own contract, on lordo_jax's six optimizers: ``optax/contrib/_common_test.py``.

optax checks every contributed optimizer with one file of common tests: it accepts extra
arguments to ``update`` and compiles once, converges on a parabola, Rosenbrock's function,
a matrix and a mixed tree in 30,000 steps, works under ``inject_hyperparams`` and
``optax.MultiSteps``, keeps the parameters' dtype, and keeps its state's shapes and dtypes
stable across an update in float16 to float64. That file, as installed with optax, is
read here, its optimizer list replaced by :data:`OPTIMIZERS` (and ``sync_every`` and
``refresh_every`` added to the arguments it keeps static under ``inject_hyperparams``,
as ``rank`` already is), and each case it generates runs as a test of its own.

Nothing of optax's is copied here: if the installed file no longer has the shape this
adaptation expects, collection fails and says what is missing. Every case passes except
those in :data:`EXPECTED_FAILURES`, each a property of its method, explained there.
"""

import ast
import importlib.util
import pathlib
import types
import unittest
from typing import Any

import pytest

import lordo_jax

# One worker (axis_name=None), small hyperparameters, every period a static int. rank=1 so
# that the 2 x 2 matrices of the matrix targets take the low-rank path.
OPTIMIZERS = (
  {"opt_name": "lordo", "opt_kwargs": {"learning_rate": 1e-2, "rank": 1, "sync_every": 2}},
  {
    "opt_name": "low_rank_ddp",
    "opt_kwargs": {"learning_rate": 1e-2, "rank": 1, "refresh_every": 10},
  },
  {"opt_name": "ddp", "opt_kwargs": {"learning_rate": 1e-2}},
  # DiLoCo's outer Nesterov step (its defaults: rate 0.7, momentum 0.9) moves up to
  # 0.7 / (1 - 0.9) = 7 times the averaged pseudo-gradient, and near an optimum Adam's
  # steps keep the size of the rate: at 1e-2 it circles the optimum at about 0.3, at 1e-3
  # it wanders in Rosenbrock's curved valley; at 1e-4 it converges on all four targets.
  {"opt_name": "diloco", "opt_kwargs": {"learning_rate": 1e-4, "sync_every": 2}},
  {"opt_name": "local_adam", "opt_kwargs": {"learning_rate": 1e-2, "sync_every": 2}},
  {"opt_name": "desloc", "opt_kwargs": {"learning_rate": 1e-2, "sync_every": 2}},
)
for _optimizer in OPTIMIZERS:
  _optimizer.update(wrapper_name=None, wrapper_kwargs=None)
# Integers that fix the program (its rounds, its refresh period): static under
# inject_hyperparams, where lordo_jax refuses them as arrays with a message naming them.
STATIC = ("sync_every", "refresh_every")


# The cases a method cannot pass, by test id, each with the property of the method that
# fails it (marked strict xfail: a pass fails the run). None today: with the rates above
# every case of the installed file passes for all six methods, those on parameters with
# no matrix included (lordo and low_rank_ddp warn there and train as local_adam and ddp).
EXPECTED_FAILURES: dict[str, str] = {}


def _installed_common_test() -> pathlib.Path:
  spec = importlib.util.find_spec("optax.contrib")
  if spec is None or not spec.submodule_search_locations:
    raise RuntimeError("optax.contrib is not installed: optax's common tests cannot run.")
  path = pathlib.Path(list(spec.submodule_search_locations)[0]) / "_common_test.py"
  if not path.exists():
    raise RuntimeError(f"{path} is missing: this optax ships no contrib common tests.")
  return path


def _assigned(node: ast.stmt) -> set[str]:
  targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
  return {t.id for t in targets if isinstance(t, ast.Name)}


def _adapted(source: str, path: pathlib.Path) -> ast.Module:
  """The common tests with lordo_jax's optimizers in place of optax's lists."""
  module = ast.parse(source, str(path))
  body = module.body
  lists = [i for i, node in enumerate(body) if "_MAIN_OPTIMIZERS_UNDER_TEST" in _assigned(node)]
  factory = [i for i, node in enumerate(body) if getattr(node, "name", None) == "_get_opt_factory"]
  if not lists or not factory or lists[0] > factory[0]:
    raise RuntimeError(
      f"{path}: expected the optimizer lists (_MAIN_OPTIMIZERS_UNDER_TEST ...) before "
      "def _get_opt_factory; the file's structure changed: update this adaptation."
    )
  replaced = body[lists[0] : factory[0]]
  names = set().union(*map(_assigned, replaced))
  if not {"_MAIN_OPTIMIZERS_UNDER_TEST", "_ALL_OPTIMIZERS_UNDER_TEST"} <= names:
    raise RuntimeError(f"{path}: the optimizer lists changed names ({sorted(names)}).")
  ours = ast.parse(
    "_MAIN_OPTIMIZERS_UNDER_TEST = _ALL_OPTIMIZERS_UNDER_TEST = LORDO_JAX_OPTIMIZERS"
  ).body
  module.body = body[: lists[0]] + ours + body[factory[0] :]
  loops = [
    node
    for node in ast.walk(module)
    if isinstance(node, ast.For)
    and getattr(node.target, "id", None) == "uninjectable_hparam"
    and isinstance(node.iter, ast.List)
  ]
  if len(loops) != 1:
    raise RuntimeError(f"{path}: no list of uninjectable hyperparameters to add {STATIC} to.")
  loops[0].iter.elts.extend(ast.Constant(name) for name in STATIC)
  return ast.fix_missing_locations(module)


def _common_tests() -> type[unittest.TestCase]:
  path = _installed_common_test()
  namespace = types.ModuleType("optax_common_test_on_lordo_jax")
  namespace.LORDO_JAX_OPTIMIZERS = OPTIMIZERS
  exec(compile(_adapted(path.read_text(), path), str(path), "exec"), namespace.__dict__)
  if not hasattr(namespace, "_get_opt_factory") or not hasattr(namespace, "ContribTest"):
    raise RuntimeError(f"{path}: expected _get_opt_factory and the class ContribTest.")
  namespace._get_opt_factory = lambda name: getattr(lordo_jax, name)
  return namespace.ContribTest


def _parameters(method) -> dict[str, Any]:
  """The parameters absl's ``parameterized`` bound to one generated test method."""
  cells = dict(zip(method.__code__.co_freevars, method.__closure__ or (), strict=True))
  if "testcase_params" not in cells or not isinstance(cells["testcase_params"].cell_contents, dict):
    raise RuntimeError(
      f"{method.__name__}: absl's parameterized no longer keeps a test's parameters as "
      "the dict testcase_params; update this adaptation."
    )
  return cells["testcase_params"].cell_contents


def _label(value) -> str:
  if callable(value) and hasattr(value, "__name__"):
    return value.__name__.removeprefix("_setup_")
  return getattr(value, "__name__", str(value))


def _cases(test_class) -> list:
  """One pytest case per generated method, named by its test, optimizer and parameters."""
  cases = []
  for name in unittest.TestLoader().getTestCaseNames(test_class):
    parameters = _parameters(getattr(test_class, name))
    others = [
      f"{k}={_label(v)}"
      for k, v in parameters.items()
      if k not in ("opt_name", "opt_kwargs") and not k.startswith("wrapper")
    ]
    label = "-".join([name.rstrip("0123456789"), parameters["opt_name"], *others])
    reason = EXPECTED_FAILURES.get(label)
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    cases.append(pytest.param(name, id=label, marks=marks))
  seen = {case.id.split("-")[1] for case in cases}
  if seen != {o["opt_name"] for o in OPTIMIZERS}:
    raise RuntimeError(f"the common tests reach {sorted(seen)}, not every optimizer.")
  unknown = set(EXPECTED_FAILURES) - {case.id for case in cases}
  if unknown:
    raise RuntimeError(f"EXPECTED_FAILURES names cases that do not exist: {sorted(unknown)}")
  return cases


# In a namespace, not a module attribute: pytest would collect the class as it stands.
COMMON = types.SimpleNamespace(tests=_common_tests())


@pytest.mark.parametrize("name", _cases(COMMON.tests))
def test_optax_contrib_common_test(name):
  case = COMMON.tests(name)
  case.setUp()
  try:
    getattr(case, name)()
  finally:
    case.tearDown()


def test_a_common_test_file_of_another_shape_fails_loudly():
  with pytest.raises(RuntimeError, match="structure changed: update this adaptation"):
    _adapted("OPTIMIZERS = []\n", pathlib.Path("_common_test.py"))
