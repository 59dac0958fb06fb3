"""Every ``Examples:`` block in the package's docstrings runs."""

import doctest
import importlib
import pkgutil

import pytest

import lordo_jax

MODULES = sorted(m.name for m in pkgutil.walk_packages(lordo_jax.__path__, "lordo_jax."))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
  module = importlib.import_module(name)
  result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
  assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
