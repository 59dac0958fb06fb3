"""Every ``Examples:`` block in the package's docstrings runs, and every public function
says what its parameters are and shows itself in an example."""

import doctest
import importlib
import inspect
import pkgutil

import pytest

import lordo_jax
from lordo_jax import checkpoint

MODULES = sorted(m.name for m in pkgutil.walk_packages(lordo_jax.__path__, "lordo_jax."))


def public_functions() -> dict[str, object]:
  """``lordo_jax``'s and ``lordo_jax.checkpoint``'s public functions, by name."""
  found = {name: getattr(lordo_jax, name) for name in lordo_jax.__all__}
  found |= {
    f"checkpoint.{name}": value
    for name, value in vars(checkpoint).items()
    if not name.startswith("_") and getattr(value, "__module__", None) == checkpoint.__name__
  }
  return {name: value for name, value in found.items() if inspect.isfunction(value)}


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
  module = importlib.import_module(name)
  result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
  assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"


def test_every_public_function_has_its_parameters_and_an_example():
  lacking = []
  for name, function in sorted(public_functions().items()):
    doc = inspect.getdoc(function) or ""
    if inspect.signature(function).parameters and "Args:" not in doc:
      lacking.append(f"{name}: no Args section")
    if ">>>" not in doc:
      lacking.append(f"{name}: no example")
  assert {"lordo", "remap_workers", "checkpoint.restore"} <= set(public_functions())
  assert not lacking, "\n".join(lacking)
