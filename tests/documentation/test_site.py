"""The documentation site builds, links, names every public name, and needs no network.

The site is built once per module, as the docs' own command does
(``sphinx-build -W -b html docs <out>``, warnings are errors), into a temporary folder;
the tests then read the built HTML: every internal link and image resolves (a
``#fragment`` to an element with that id), every name of ``lordo_jax.__all__`` and of
``lordo_jax.checkpoint`` has its API entry, and no page loads a script, a stylesheet or
a font from outside the site (MathJax is served from ``_static``). The docs packages
come with the ``test`` extra, so the build is never skipped.
"""

import doctest
import html.parser
import importlib
import inspect
import pathlib
import re
import subprocess
import sys
import urllib.parse

import pytest
from test_doc_references import _exists
from test_doc_references import named_paths

import lordo_jax
from lordo_jax import checkpoint
from tests.helpers import stderr as stderr_lib

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "docs"))
import external_names  # noqa: E402

pytestmark = pytest.mark.timeout(300, method="thread")

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# The README's sphinx-build options (warnings are errors), every warning reported, quietly.
SPHINX_BUILD_OPTIONS = ("-W", "--keep-going", "-b", "html", "-q")
EXTERNAL = re.compile(r"^(https?:)?//", re.I)


class _Page(html.parser.HTMLParser):
  """The ids, links, images, scripts and stylesheets of one HTML page."""

  def __init__(self):
    super().__init__()
    self.ids: set[str] = set()
    self.links: list[str] = []  # <a href>
    self.images: list[str] = []  # <img src>
    self.loads: list[str] = []  # what the browser fetches: scripts, stylesheets, preloads

  def handle_starttag(self, tag, attrs):
    attrs = dict(attrs)
    for key in ("id", "name"):
      if attrs.get(key) and (key == "id" or tag == "a"):
        self.ids.add(attrs[key])
    if tag == "a" and attrs.get("href"):
      self.links.append(attrs["href"])
    elif tag == "img" and attrs.get("src"):
      self.images.append(attrs["src"])
    elif tag == "script" and attrs.get("src"):
      self.loads.append(attrs["src"])
    elif tag == "link" and attrs.get("href"):
      if {"stylesheet", "preload", "modulepreload", "icon"} & set(attrs.get("rel", "").split()):
        self.loads.append(attrs["href"])


def parse(path: pathlib.Path) -> _Page:
  page = _Page()
  page.feed(path.read_text(encoding="utf-8"))
  return page


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> pathlib.Path:
  """The built site; the build's warnings fail it (``-W``), each one reported."""
  out = tmp_path_factory.mktemp("site")
  command = [sys.executable, "-m", "sphinx", *SPHINX_BUILD_OPTIONS]
  build = subprocess.run(
    [*command, str(DOCS), str(out)], capture_output=True, text=True, cwd=ROOT, timeout=600
  )
  warnings = "\n".join(stderr_lib.error_lines(build.stderr))  # Less the CUDA plugin's log.
  assert build.returncode == 0 and "WARNING" not in warnings, (
    f"sphinx-build -W failed (install the docs with pip install -e '.[docs]'):\n"
    f"{build.stdout[-3000:]}\n{build.stderr[-6000:]}"
  )
  return out


@pytest.fixture(scope="module")
def pages(site) -> dict[pathlib.Path, _Page]:
  return {
    path: parse(path)
    for path in sorted(site.rglob("*.html"))
    if "_static" not in path.relative_to(site).parts
  }


def test_the_site_has_its_pages(site):
  for page in (
    "index",
    "getting_started",
    "concepts/lordo",
    "MATH",
    "ARCHITECTURE",
    "FIDELITY",
    "benchmarks",
    "benchmark_tables",
    "notebooks/quickstart",
    "api/index",
    "guides/flax",
    "guides/optax",
    "guides/checkpoints",
    "guides/failed_workers",
    "guides/sharded_models",
    "guides/multi_host",
    "guides/bfloat16",
    "guides/overlap",
    "guides/pitfalls",
  ):
    assert (site / f"{page}.html").exists(), page


def _public_checkpoint_names() -> list[str]:
  return sorted(
    name
    for name, value in vars(checkpoint).items()
    if not name.startswith("_")
    and (inspect.isfunction(value) or inspect.isclass(value))
    and value.__module__ == checkpoint.__name__
  )


def test_every_public_name_has_an_api_entry(site):
  ids = set().union(*(parse(path).ids for path in (site / "api").glob("*.html")))
  wanted = [f"lordo_jax.{name}" for name in lordo_jax.__all__]
  wanted += [f"lordo_jax.checkpoint.{name}" for name in _public_checkpoint_names()]
  assert "lordo_jax.checkpoint.Checkpointer" in wanted
  missing = [name for name in wanted if name not in ids]
  assert not missing, f"public names without an entry in docs/api/: {missing}"


def test_every_field_of_a_state_type_says_what_it_holds(site):
  """A field's entry is its source comment, never empty nor NamedTuple's "Alias for field
  number N" (``docs/conf.py`` reads the comments)."""
  entry = re.compile(
    r'<dl class="py (?:attribute|property)">\s*<dt[^>]*id="([^"]+)".*?</dt>\s*<dd>(.*?)</dd>', re.S
  )
  bare = []
  for page in sorted((site / "api").glob("*.html")):
    for name, body in entry.findall(page.read_text(encoding="utf-8")):
      text = re.sub(r"<[^>]+>", "", body).strip()
      if not text or text.startswith("Alias for field number"):
        bare.append(name)
  assert not bare, f"fields without a description: {bare}"


def test_the_api_pages_show_the_expanded_options(site):
  methods = (site / "api" / "methods.html").read_text(encoding="utf-8")
  assert "{options}" not in methods
  assert 'id="lordo_jax.lordo"' in methods and "compression" in methods


def _target(page: pathlib.Path, reference: str, site: pathlib.Path):
  """The built file and fragment a relative reference points to; None outside the site."""
  parts = urllib.parse.urlsplit(reference)
  if parts.scheme or parts.netloc or reference.startswith(("mailto:", "data:", "javascript:")):
    return None
  path = page if not parts.path else (page.parent / urllib.parse.unquote(parts.path))
  path = path.resolve()
  if path.is_dir():
    path = path / "index.html"
  return path, urllib.parse.unquote(parts.fragment)


def test_every_internal_link_and_image_resolves(site, pages):
  broken = []
  for page, parsed in pages.items():
    for reference in parsed.links + parsed.images + parsed.loads:
      target = _target(page, reference, site)
      if target is None:
        continue
      path, fragment = target
      where = f"{page.relative_to(site)}: {reference}"
      if not path.is_file() or not path.is_relative_to(site.resolve()):
        broken.append(f"{where} (no such file)")
      elif fragment and path.suffix == ".html":
        ids = pages[path].ids if path in pages else parse(path).ids
        if fragment not in ids:
          broken.append(f"{where} (no id {fragment!r})")
  assert not broken, "broken links:\n" + "\n".join(broken)


# A cross-reference Sphinx could not resolve is still styled as one (code.xref), but
# sits in no <a>: a reader clicks on it and nothing happens.
_DEAD_XREF = re.compile(r'(<a [^>]*>)?<code class="xref py[^"]*"><span class="pre">([^<]+)<')


def dead_references(page: pathlib.Path) -> list[str]:
  """The link-styled references on ``page`` that link nowhere."""
  text = page.read_text(encoding="utf-8")
  return [m.group(2) for m in _DEAD_XREF.finditer(text) if not m.group(1)]


def test_every_link_styled_reference_on_the_api_pages_links(site):
  dead = {
    page.name: dead_references(page)
    for page in sorted((site / "api").glob("*.html"))
    if dead_references(page)
  }
  assert not dead, f"references to nothing (a private module, or an unknown name): {dead}"


def test_the_dead_reference_finder_finds_one(tmp_path):
  page = tmp_path / "page.html"
  page.write_text(
    '<a href="x.html"><code class="xref py py-func docutils literal notranslate">'
    '<span class="pre">lordo_jax.lordo()</span></code></a> and '
    '<code class="xref py py-mod docutils literal notranslate">'
    '<span class="pre">lordo_jax.round._periods</span></code>'
  )
  assert dead_references(page) == ["lordo_jax.round._periods"]


USER_PAGES = ("index", "getting_started", "concepts", "guides", "api", "notebooks")


def test_user_pages_name_no_test_file(site):
  """The tests behind a claim are for contributors (ARCHITECTURE, MATH, FIDELITY name
  them), not on the pages a user reads to use the library."""
  found = []
  for page in sorted(site.rglob("*.html")):
    relative = page.relative_to(site)
    if relative.parts[0].removesuffix(".html") not in USER_PAGES:
      continue
    text = re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8"))
    found += [f"{relative}: {m}" for m in re.findall(r"\btests/\w[\w/]*\.py", text)]
  assert not found, "\n".join(found)


# An issue's number, or a commit of this repository as git abbreviates it (seven hex
# digits, letters and digits both: one of digits only reads as a number, and is caught
# only after "commit"); the authors' code is cited at full or 8-digit hashes.
PROVENANCE = re.compile(
  r"\bissues? #?\d+|\bcommit [0-9a-f]{7,12}\b|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7}\b",
  re.I,
)


def provenance_on(page: pathlib.Path) -> list[str]:
  return PROVENANCE.findall(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))


def test_no_page_names_an_issue_or_a_commit(site):
  """Provenance lives in the git log and BENCHMARKS.md's Provenance section; the site's
  benchmark records are shown without their commits."""
  found = {str(p.relative_to(site)): provenance_on(p) for p in sorted(site.rglob("*.html"))}
  assert {page: names for page, names in found.items() if names} == {}


def test_the_provenance_finder_finds_an_issue_and_a_commit(tmp_path):
  page = tmp_path / "page.html"
  page.write_text("<p>As issue 7 asked, measured at <code>7f00fa8</code> (commit ab12cd3).</p>")
  assert provenance_on(page) == ["issue 7", "7f00fa8", "commit ab12cd3"]
  page.write_text("<p>The authors' code at 4455531d9bd5509ea47ca8bea4b70f296edfb4d9.</p>")
  assert provenance_on(page) == []


_PUBLIC = re.compile(r"(?:lordo_jax\.)?((?:checkpoint\.)?[A-Za-z_]\w*)(\(.*\))?$")


class _InlineCode(html.parser.HTMLParser):
  """The text of every inline ``<code>`` of a page, and whether it sits inside a link
  (or a heading, which is a link's target, not a place for one)."""

  def __init__(self):
    super().__init__()
    self.links = self.code = self.pre = 0
    self.spans: list[tuple[str, bool]] = []  # (text, inside a link)

  def handle_starttag(self, tag, attrs):
    if tag in ("a", "h1", "h2", "h3", "h4", "h5", "h6"):
      self.links += 1
    elif tag == "pre":
      self.pre += 1
    elif tag == "code" and not self.pre:
      self.code += 1
      if self.code == 1:
        self.spans.append(("", self.links > 0))

  def handle_endtag(self, tag):
    if tag in ("a", "h1", "h2", "h3", "h4", "h5", "h6"):
      self.links = max(0, self.links - 1)
    elif tag == "pre":
      self.pre = max(0, self.pre - 1)
    elif tag == "code" and self.code:
      self.code -= 1

  def handle_data(self, data):
    if self.code:
      text, linked = self.spans[-1]
      self.spans[-1] = (text + data, linked)


def unlinked_public_names(page: pathlib.Path) -> list[str]:
  """The inline code on ``page`` that names a public function or class (``name``,
  ``lordo_jax.name``, ``name(...)``) outside a link."""
  public = set(lordo_jax.__all__) | {f"checkpoint.{n}" for n in _public_checkpoint_names()}
  parser = _InlineCode()
  parser.feed(page.read_text(encoding="utf-8"))
  found = []
  for text, linked in parser.spans:
    name = _PUBLIC.match(" ".join(text.split()))
    if not linked and name and name.group(1) in public:
      found.append(text)
  return found


def test_every_public_name_a_user_page_mentions_is_a_link(site):
  """On the pages written for the site (the notebook, read in Jupyter too, keeps plain
  code)."""
  unlinked = {}
  for page in sorted(site.rglob("*.html")):
    relative = page.relative_to(site)
    written_for_the_site = relative.parts[0].removesuffix(".html") in USER_PAGES[:-1]
    if written_for_the_site and unlinked_public_names(page):
      unlinked[str(relative)] = unlinked_public_names(page)
  assert not unlinked, f"public names in inline code without a link to their entry: {unlinked}"


def test_every_jax_optax_flax_and_orbax_name_a_user_page_mentions_links_to_its_docs(site):
  """Through the inventories ``docs/external_names.py`` writes (the build is offline):
  each name it holds, in inline code on a page written for the site, is a link, and
  the link is the project's page for it."""
  names = {n: e for _, entries in external_names.PROJECTS.values() for n, e in entries.items()}
  unlinked, hrefs = {}, set()
  for page in sorted(site.rglob("*.html")):
    relative = page.relative_to(site)
    parsed = parse(page)
    hrefs |= {h for h in parsed.links if EXTERNAL.match(h)}
    if relative.parts[0].removesuffix(".html") not in USER_PAGES[:-1]:
      continue
    parser = _InlineCode()
    parser.feed(page.read_text(encoding="utf-8"))
    found = [t for t, linked in parser.spans if not linked and " ".join(t.split()) in names]
    if found:
      unlinked[str(relative)] = found
  assert unlinked == {}
  linked = {
    n for n, (full, page) in names.items() if any(h.endswith(f"{page}#{full}") for h in hrefs)
  }
  assert {"optax.inject_hyperparams", "nnx.Optimizer", "jax.shard_map"} <= linked


def test_the_inventories_read_as_sphinx_reads_them(tmp_path):
  from sphinx.util.inventory import InventoryFile

  mapping = external_names.write_inventories(tmp_path)
  for project, (url, path) in mapping.items():
    with open(path, "rb") as stream:
      read = InventoryFile.load(stream, url, lambda base, uri: base + uri)
    entries = {name: item for objects in read.values() for name, item in objects.items()}
    for full, page in external_names.PROJECTS[project][1].values():
      entry = entries[full]
      location = entry.uri if hasattr(entry, "uri") else entry[2]
      assert location == f"{url}{page}#{full}", (project, full)


class _TextOutsideLinks(html.parser.HTMLParser):
  """The text of a page that is not inside a link."""

  def __init__(self):
    super().__init__()
    self.links, self.text = 0, []

  def handle_starttag(self, tag, attrs):
    self.links += tag == "a"

  def handle_endtag(self, tag):
    self.links -= tag == "a" and self.links > 0

  def handle_data(self, data):
    if not self.links:
      self.text.append(data)


def test_every_math_section_an_api_page_cites_is_a_link(site):
  """The docstrings say "MATH.md §N" in plain text; the built page links the section."""
  unlinked = {}
  for page in sorted((site / "api").glob("*.html")):
    parser = _TextOutsideLinks()
    parser.feed(page.read_text(encoding="utf-8"))
    cites = re.findall(r"MATH\.md §[\d.]+", " ".join(parser.text))
    if cites:
      unlinked[page.name] = cites
  assert not unlinked, f"sections of MATH.md cited without a link: {unlinked}"


def test_the_link_checker_finds_a_broken_link_and_fragment(site, pages):
  index = site / "index.html"
  assert _target(index, "https://arxiv.org/abs/2602.04396", site) is None
  path, fragment = _target(index, "guides/flax.html#no-such-heading", site)
  assert path.is_file() and fragment not in pages[path].ids
  path, _ = _target(index, "guides/no_such_page.html", site)
  assert not path.exists()


def test_no_page_loads_anything_from_outside_the_site(site, pages):
  outside = [
    f"{page.relative_to(site)}: {load}"
    for page, parsed in pages.items()
    for load in parsed.loads
    if EXTERNAL.match(load)
  ]
  for css in (site / "_static").rglob("*.css"):
    text = css.read_text(encoding="utf-8", errors="replace")
    for url in re.findall(r"""(?:@import\s+|url\()\s*["']?([^"')\s;]+)""", text):
      if EXTERNAL.match(url):
        outside.append(f"{css.relative_to(site)}: {url}")
  assert not outside, "loaded from outside the site:\n" + "\n".join(outside)


def test_math_is_typeset_by_the_sites_own_mathjax(site, pages):
  page = pages[site / "MATH.html"]
  mathjax = [load for load in page.loads if "mathjax" in load.lower()]
  assert mathjax == ["_static/mathjax/tex-chtml.js"], mathjax
  assert (site / "_static" / "mathjax" / "tex-chtml.js").is_file()
  assert list((site / "_static" / "mathjax" / "output" / "chtml" / "fonts").rglob("*.woff"))
  text = (site / "MATH.html").read_text(encoding="utf-8")
  assert text.count('class="math') >= 5  # the equations reach MathJax as math, not code


def test_every_path_a_site_page_names_exists():
  missing = {
    str(page.relative_to(ROOT)): sorted(p for p in named_paths(page.read_text()) if not _exists(p))
    for page in sorted(DOCS.rglob("*.md"))
    if "_build" not in page.parts
  }
  missing = {page: paths for page, paths in missing.items() if paths}
  assert not missing, f"pages name paths that do not exist: {missing}"


def test_every_public_docstring_example_runs_as_a_doctest():
  """``tests/documentation/test_docstrings.py`` runs ``doctest.testmod`` on every module;
  this checks that it reaches the ``Examples:`` of every public name (a decorated factory
  whose module doctest would not find would otherwise never run)."""
  finder = doctest.DocTestFinder()
  unreached = []
  objects = [(name, getattr(lordo_jax, name)) for name in lordo_jax.__all__]
  objects += [(name, getattr(checkpoint, name)) for name in _public_checkpoint_names()]
  for name, value in objects:
    if ">>>" not in (value.__doc__ or ""):
      continue
    module = importlib.import_module(value.__module__)
    found = finder.find(module, module.__name__)
    qualname = f"{module.__name__}.{value.__qualname__}"
    if not any(test.name == qualname and test.examples for test in found):
      unreached.append(name)
  assert not unreached, f"docstring examples that doctest.testmod does not run: {unreached}"
