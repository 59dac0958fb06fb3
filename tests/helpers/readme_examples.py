"""The documentation's text: a page's sections and Python blocks, and a runner for its examples.

The README is the landing page; the guides, the API reference and the benchmarks live in
``docs/`` (Markdown pages of the site). ``section(title, page=...)`` reads a section of
any of them by its heading, at any level.
"""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def page_text(path: str) -> str:
  """The text of the page at ``path``, relative to the repository's root."""
  return (ROOT / path).read_text()


def headings(text: str) -> list[tuple[int, str]]:
  """The Markdown headings of ``text`` outside code blocks: (level, title), in order."""
  found, fenced = [], False
  for line in text.splitlines():
    if line.startswith("```"):
      fenced = not fenced
    elif not fenced and (match := re.match(r"(#{1,6}) (.+?)\s*$", line)):
      found.append((len(match.group(1)), match.group(2)))
  return found


def section(title: str, page: str = "README.md") -> str:
  """The body of the section of ``page`` whose heading (at any level) starts with
  ``title``: up to the next heading of the same or a higher level, code blocks aside."""
  body, level, fenced = [], None, False
  for line in page_text(page).splitlines(keepends=True):
    if line.startswith("```"):
      fenced = not fenced
    match = None if fenced else re.match(r"(#{1,6}) (.+)", line)
    if level is None:
      if match and match.group(2).startswith(title):
        level = len(match.group(1))
      continue
    if match and len(match.group(1)) <= level:
      break
    body.append(line)
  assert level is not None, f"{page} has no heading starting with {title!r}"
  return "".join(body)


def python_blocks(text: str = README) -> list[str]:
  """The ```python blocks of ``text``, in order."""
  return re.findall(r"```python\n(.*?)```", text, re.S)


def run(code: str, timeout: float = 300) -> str:
  """``code`` run in a fresh interpreter at the repository's root; its stdout."""
  result = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd=ROOT
  )
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout
