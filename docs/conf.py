"""Sphinx configuration of the lordo_jax documentation.

Build: ``pip install -e ".[docs]" && sphinx-build -W -b html docs docs/_build/html``.
The pages are MyST Markdown (myst-nb, which also renders the quickstart notebook
without running it), the API reference is autodoc on the Google-style docstrings
(napoleon), the theme is sphinx-book-theme (optax's set), and MathJax is served from
the site itself (sphinx-mathjax-offline), so a page needs no network.
"""

import ast
import inspect
import os
import pathlib
import re
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# The pages are built on the CPU; where the CUDA plugin is installed (the test extra, for
# deviceless GPU compiles) it would otherwise look for a GPU and log a traceback.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import optax  # noqa: E402

import lordo_jax  # noqa: E402

project = "lordo_jax"
author = "the lordo_jax authors"
copyright = "the lordo_jax authors"  # noqa: A001
release = lordo_jax.__version__
version = release

extensions = [
  "myst_nb",
  "sphinx.ext.autodoc",
  "sphinx.ext.autosummary",
  "sphinx.ext.napoleon",
  "sphinx.ext.intersphinx",
  "sphinx.ext.mathjax",
  "sphinx-mathjax-offline",
]

# Links to jax, optax, flax and orbax from inventories written here (no download).
sys.path.insert(0, str(ROOT / "docs"))
import external_names  # noqa: E402

intersphinx_mapping = external_names.write_inventories(ROOT / "docs" / "_build" / "inventories")

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"
exclude_patterns = ["_build", "**.ipynb_checkpoints", "Thumbs.db", ".DS_Store"]

# MyST: $...$ and $$...$$ math (amsmath environments too), and an id on every heading
# down to ### so that a link can name a section ("page.md#a-heading", GitHub's slugs).
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
myst_dmath_double_inline = True
# The quickstart notebook is executed by the test suite, not by the build.
nb_execution_mode = "off"
nb_ipywidgets_js = {}  # The notebook has no widgets; never load their scripts.

# autodoc + napoleon: the docstrings are Google style with ``.. math::`` blocks.
autodoc_member_order = "bysource"
# Types in the Args entries, so that a signature of thirty options stays readable.
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"
autosummary_generate = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = True
add_module_names = False
python_display_short_literal_types = True

html_theme = "sphinx_book_theme"
html_title = "lordo_jax"
html_theme_options = {
  "show_toc_level": 2,
  "home_page_in_toc": True,
  "use_download_button": False,
  "use_fullscreen_button": False,
  "navigation_with_keys": False,
  # The book layout has no top bar: its search is in the sidebar (pydata-sphinx-theme
  # would otherwise put a second search field in a header above the page).
  "navbar_persistent": [],
}
html_static_path = ["_static"]
html_css_files = ["lordo.css"]  # Tables of long inline code fit the page.
html_last_updated_fmt = None
html_show_sourcelink = False

# A cross-reference to a name outside the site (jax.Array, optax's types, a private
# module a docstring names) renders as code; it is not an error.
nitpicky = False


def _field_comments(cls) -> dict[str, str]:
  """The comment of each field of a NamedTuple or dataclass, read from its source: the
  ``# comment`` after the field, or the comment lines right above it."""
  try:
    source = textwrap.dedent(inspect.getsource(cls))
  except (OSError, TypeError):
    return {}
  lines = source.splitlines()
  comments = {}
  for node in ast.parse(source).body[0].body:
    if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
      continue
    line = lines[node.lineno - 1]
    if "#" in line:
      comments[node.target.id] = line.split("#", 1)[1].strip()
      continue
    above = []
    for previous in reversed(lines[: node.lineno - 1]):
      if not previous.strip().startswith("#"):
        break
      above.insert(0, previous.strip().lstrip("#").strip())
    if above:
      comments[node.target.id] = " ".join(above)
  return comments


def _document_fields(app, what, name, obj, options, lines):
  """A field of a state type says what its source's comment says, instead of nothing
  or NamedTuple's "Alias for field number N"."""
  if what not in ("attribute", "property"):
    return
  if lines and not lines[0].startswith("Alias for field number"):
    return
  owner_name, _, field = name.rpartition(".")
  module_name, _, class_name = owner_name.rpartition(".")
  owner = getattr(sys.modules.get(module_name), class_name, None)
  comment = _field_comments(owner).get(field) if isinstance(owner, type) else None
  if comment:
    lines[:] = [comment.replace("*", r"\*")]  # Plain text, not reStructuredText.


# Annotations shown by their optax name instead of the union they stand for.
TYPE_NAMES = {id(optax.ScalarOrSchedule): "optax.ScalarOrSchedule"}


def _name_aliased_types(app, what, name, obj, options, lines):
  """A ``:type:`` for each documented parameter annotated with an alias of
  :data:`TYPE_NAMES`, so that autodoc does not spell the alias out (runs after napoleon
  has turned ``Args:`` into ``:param:`` fields, and before the types are merged)."""
  try:
    parameters = inspect.signature(obj).parameters
  except (TypeError, ValueError):
    return
  for parameter in parameters.values():
    alias = TYPE_NAMES.get(id(parameter.annotation))
    field = f":param {parameter.name}:"
    start = next((i for i, line in enumerate(lines) if line.startswith(field)), None)
    if alias is None or start is None:
      continue
    end = start + 1
    while end < len(lines) and lines[end].startswith(" "):
      end += 1
    lines.insert(end, f":type {parameter.name}: {alias}")


def _math_sections() -> dict[str, str]:
  """Each numbered section of MATH.md (``"4.6"``) and its heading's anchor."""
  anchors = {}
  for line in (ROOT / "docs" / "MATH.md").read_text(encoding="utf-8").splitlines():
    heading = re.match(r"#{2,4} (\d+(?:\.\d+)?)\.? (.*)", line)
    if heading:
      words = re.sub(r"[^\w\- ]", "", f"{heading[1]} {heading[2]}".lower())
      anchors[heading[1]] = words.replace(" ", "-")
  return anchors


MATH_SECTIONS = _math_sections()


def _link_math_sections(app, what, name, obj, options, lines):
  """ "MATH.md §N" in a docstring, plain text in the source, a link to the section on the
  page (every API page sits one folder below MATH.html)."""

  def link(match):
    anchor = MATH_SECTIONS.get(match[1])
    return f"`MATH.md §{match[1]} <../MATH.html#{anchor}>`__" if anchor else match[0]

  lines[:] = [re.sub(r"(?<![`<])MATH\.md §(\d+(?:\.\d+)?)", link, line) for line in lines]


# The benchmarks' run records name the commit they were measured at ("(commit abc1234)");
# BENCHMARKS.md keeps it for the git log's reader, the site shows the records without it.
_COMMIT = re.compile(r" \(commit [0-9a-f]{7,40}\)")


def _without_commits(app, relative_path, parent_docname, content):
  if pathlib.Path(relative_path).name == "BENCHMARKS.md":
    content[0] = _COMMIT.sub("", content[0])


def _link_external_names(app, what, name, obj, options, lines):
  """A docstring's ``optax.partition`` (a jax, optax, flax or orbax name the inventories
  hold) becomes a link to its project's docs."""
  known = {n for _, entries in external_names.PROJECTS.values() for n in entries}

  def link(match):
    full = external_names.target(match[1])
    return f":py:obj:`{match[1]} <{full}>`" if match[1] in known else match[0]

  lines[:] = [re.sub(r"``([\w.]+)``", link, line) for line in lines]


def setup(app):
  app.connect("autodoc-process-docstring", _link_external_names)
  app.connect("include-read", _without_commits)
  app.connect("autodoc-process-docstring", _document_fields)
  app.connect("autodoc-process-docstring", _name_aliased_types, priority=600)
  app.connect("autodoc-process-docstring", _link_math_sections)
