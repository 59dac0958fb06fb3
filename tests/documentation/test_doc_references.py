"""The documentation points at things that exist: MATH.md's sections and the repo's paths.

The code and the pages cite the mathematics as "MATH.md §N" (docs/MATH.md); every such
section must be a heading there. Every repository path a page names in backticks or a
link (``lordo_jax/round/_synchronize.py``, ``tests/round/test_sync.py::name``) must exist.
"""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOP_FOLDERS = ("lordo_jax", "tests", "docs", "examples", "benchmarks", "notebooks")
PAGES = sorted([ROOT / "README.md", ROOT / "BENCHMARKS.md", *(ROOT / "docs").glob("*.md")])


def _texts():
  for folder in TOP_FOLDERS:
    for path in sorted((ROOT / folder).rglob("*")):
      if path.suffix in (".py", ".md", ".ipynb") and "_build" not in path.parts:
        yield path
  yield from (ROOT / "README.md", ROOT / "BENCHMARKS.md")


def math_sections() -> set[str]:
  """The numbers of docs/MATH.md's headings: "1" ... "8", "4.1" ... "4.7"."""
  text = (ROOT / "docs" / "MATH.md").read_text()
  return set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", text, re.M))


def cited_sections(text: str) -> set[str]:
  """Every section cited as "MATH.md §N", with the "and §M" / "to §M" that follow."""
  found = set()
  for match in re.finditer(
    r"MATH\.md\s+§(\d+(?:\.\d+)?)((?:\s+(?:and|to)\s+§\d+(?:\.\d+)?)*)", text
  ):
    found.add(match.group(1).rstrip("."))
    found.update(re.findall(r"§(\d+(?:\.\d+)?)", match.group(2)))
  return found


def test_the_section_reader_reads_headings_and_citations():
  assert {"1", "4", "4.6", "8"} <= math_sections()
  assert cited_sections("see MATH.md §3 and §6, MATH.md\n  §4.6.") == {"3", "6", "4.6"}


@pytest.mark.parametrize("path", list(_texts()), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_section_of_the_mathematics_exists(path):
  missing = cited_sections(path.read_text()) - math_sections()
  assert not missing, f"{path.name} cites MATH.md sections that do not exist: {missing}"


@pytest.mark.parametrize("path", list(_texts()), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_text_cites_a_specification_outside_the_repository(path):
  text = path.read_text()
  assert not re.search(r"SPEC(\.md|\s*§|\s+sections?\s+\d)", text), path.name


LAYERS = ("methods", "round", "comm", "local", "state")


def named_paths(text: str) -> set[str]:
  """Repository paths in backticks or markdown links, with their ``::name`` suffix;
  a path inside the package may start at its layer (``round/_schedule.py``), and a
  private module may be named alone (``_keywords.py``; other lone file names are the
  authors' code, cited in docs/FIDELITY.md)."""
  candidates = re.findall(r"`([^`\s]+)`", text) + re.findall(r"\]\(([^)\s#]+)", text)
  paths = set()
  for candidate in candidates:
    candidate = candidate.rstrip(".,;:")
    path = candidate.split("::")[0]
    placeholder = "*" in path or "<" in path
    if placeholder:
      continue
    if path.split("/")[0] in TOP_FOLDERS and "/" in path:
      paths.add(candidate)
    elif path.split("/")[0] in LAYERS and path.endswith(".py"):
      paths.add("lordo_jax/" + candidate)
    elif path in ("README.md", "BENCHMARKS.md") or re.fullmatch(r"_\w+\.py", path):
      paths.add(candidate)
  return paths


def _exists(named: str) -> bool:
  """The file exists (a lone file name: somewhere in the repository), and so does the
  ``::name`` it names: a function, class or assignment in it."""
  path, _, name = named.partition("::")
  files = [ROOT / path] if "/" in path or path.endswith(".md") else _files_named(path)
  files = [f for f in files if f.exists()]
  if not files or not name:
    return bool(files)
  top = name.split(".")[0]
  pattern = rf"^\s*(def|class)\s+{re.escape(top)}\b|^\s*{re.escape(top)}\s*[:=]"
  return any(re.search(pattern, f.read_text(), re.M) for f in files)


def _files_named(name: str) -> list[pathlib.Path]:
  return [p for folder in TOP_FOLDERS for p in (ROOT / folder).rglob(name)]


def test_the_path_reader_finds_paths_and_leaves_names_alone():
  text = (
    "`lordo_jax/round/_periods.py::sync_steps`, [site](docs/MATH.md), `optax.adamw`, "
    "`round/_schedule.py`, `_keywords.py::takes`"
  )
  assert named_paths(text) == {
    "lordo_jax/round/_periods.py::sync_steps",
    "docs/MATH.md",
    "lordo_jax/round/_schedule.py",
    "_keywords.py::takes",
  }
  assert _exists("lordo_jax/round/_periods.py::sync_steps") and _exists("_keywords.py::takes")
  assert not _exists("lordo_jax/round/_periods.py::no_such_function")
  assert not _exists("aliases.py")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_path_a_page_names_exists(page):
  missing = sorted(p for p in named_paths(page.read_text()) if not _exists(p))
  assert not missing, f"{page.name} names paths that do not exist: {missing}"
