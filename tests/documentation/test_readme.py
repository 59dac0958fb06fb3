"""The README tells the truth: its commands are what CI runs, every page it links to
exists, and the API table's defaults are the functions'. Every page's examples run in
``test_doc_pages.py``.
"""

import re
import tomllib

from tests.helpers.readme_examples import README
from tests.helpers.readme_examples import ROOT
from tests.helpers.readme_examples import section


def test_every_page_the_readme_links_to_exists():
  links = re.findall(r"\]\(([^)\s#]+)", README)
  missing = [link for link in links if "://" not in link and not (ROOT / link).exists()]
  assert not missing, missing


def test_ci_runs_the_readme_test_command():
  command = re.search(r"# the tests\n(.*)\n", README).group(1)
  assert command in (ROOT / ".ci" / "run").read_text()


def test_the_readme_builds_the_site_as_the_suite_does():
  """The README's site command, with its options, is the build the suite checks
  (``test_site.py``; CI runs the suite)."""
  from tests.documentation import test_site

  command = re.search(r"# the documentation site.*\n(.*)\n", README).group(1)
  assert command == 'pip install -e ".[docs]" && sphinx-build -W -b html docs docs/_build/html'
  assert {"-W", "-b", "html"} <= set(test_site.SPHINX_BUILD_OPTIONS)
  project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
  assert "docs" in project["optional-dependencies"]


def test_every_public_name_is_in_the_api_table():
  import lordo_jax

  table = section("Public API", page="docs/api/index.md")
  missing = [name for name in lordo_jax.__all__ if f"`{name}" not in table]
  assert not missing, f"not in the Public API table of docs/api/index.md: {missing}"


def test_the_api_tables_defaults_are_the_functions_defaults():
  """Each ``name=value`` of a signature in the Public API table, where the value is a
  literal, is that parameter's default (``projection=None`` is not ``"svd"``)."""
  import ast
  import inspect

  import lordo_jax

  table = section("Public API", page="docs/api/index.md")
  checked, wrong = 0, []
  for name, args, target in re.findall(r"\{func\}`(\w+)\(([^`]*)\) <lordo_jax\.(\w+)>`", table):
    parameters = inspect.signature(getattr(lordo_jax, target)).parameters
    for key, value in re.findall(r"(\w+)=([^,]+)", args):
      try:
        literal = ast.literal_eval(value.strip())
      except (ValueError, SyntaxError):
        continue  # A placeholder (K, r, T) or an expression, not a default.
      checked += 1
      if key not in parameters or parameters[key].default != literal:
        wrong.append(f"{name}({key}={value.strip()}): the default is {parameters[key].default!r}")
  assert checked > 30 and not wrong, wrong
