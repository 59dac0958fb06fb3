"""The documentation's text: a page's sections and Python blocks, and a runner for its examples.

The README is the landing page; the guides, the API reference and the benchmarks live in
``docs/`` (Markdown pages of the site). ``section(title, page=...)`` reads a section of
any of them by its heading, at any level.

A page's Python blocks run as a reader runs them: in page order, each after the ones
before it in one interpreter (:func:`page_outputs`). Two things in the Markdown change
that, both visible in the page's source:

* ``<!-- not run: why -->`` on the line just above a block's fence: the block is not run
  (it needs what this machine lacks: several hosts, a GPU's compiler); it still compiles;
* a block that sets ``jax_num_cpu_devices`` starts a new interpreter, since that must
  come before JAX starts (the blocks after it run in that one).
"""

import json
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


NOT_RUN = re.compile(r"<!-- not run: (.+?) -->")
# Pages whose Python blocks run (the README and the site's Markdown pages).
PAGES = (
  "README.md",
  *sorted(
    str(path.relative_to(ROOT))
    for path in (ROOT / "docs").rglob("*.md")
    if "_build" not in path.parts
  ),
)


def page_blocks(path: str) -> list[tuple[str, str | None]]:
  """Every ```python block of the page at ``path``, in order, with why it is not run (the
  ``<!-- not run: why -->`` line just above its fence), or None for a block that runs."""
  lines = page_text(path).splitlines(keepends=True)
  blocks, fenced, code, why = [], None, [], None
  for i, line in enumerate(lines):
    if fenced is None and line.startswith("```"):
      fenced = line.strip()
      if fenced == "```python":
        above = NOT_RUN.fullmatch(lines[i - 1].strip()) if i else None
        why, code = (above.group(1) if above else None), []
    elif fenced is not None and line.startswith("```"):
      if fenced == "```python":
        blocks.append(("".join(code), why))
      fenced = None
    elif fenced == "```python":
      code.append(line)
  return blocks


def sessions(path: str) -> list[list[tuple[int, str]]]:
  """The page's blocks that run, as (block number from 1, code), cut into interpreters:
  a block that sets ``jax_num_cpu_devices`` starts a new one."""
  cut: list[list[tuple[int, str]]] = [[]]
  for number, (code, why) in enumerate(page_blocks(path), start=1):
    if why is not None:
      continue
    if "jax_num_cpu_devices" in code and cut[-1]:
      cut.append([])
    cut[-1].append((number, code))
  return [session for session in cut if session]


_SESSION = """
import json, sys
page, blocks, probes = json.load(sys.stdin)
probes = {number: (before, after) for number, before, after in probes}
scope = {"__name__": "__main__"}
for number, code in blocks:
  before, after = probes.get(number, ("", ""))
  print(f"\\x1eprobe {number}", flush=True)
  exec(compile(before, f"{page}, before block {number}", "exec"), scope)
  print(f"\\x1eblock {number}", flush=True)
  exec(compile(code, f"{page}, block {number}", "exec"), scope)
  print(f"\\x1eprobe {number}", flush=True)
  exec(compile(after, f"{page}, after block {number}", "exec"), scope)
"""

# A test's own code run beside a page's block, in its interpreter: block number -> (code
# run just before the block, code run just after it).
Probes = dict[int, tuple[str, str]]

_SESSIONS_RUN: dict[tuple, tuple[dict[int, str], dict[int, str]]] = {}


def _session_outputs(blocks: tuple[tuple[int, str], ...], name: str, probes: tuple, timeout: float):
  """One interpreter running ``blocks`` of the page ``name`` in order, each between its
  ``probes``: what each block printed and what its probes printed, by block number. The
  same blocks and probes on two pages (the README's example opens three) run once."""
  key = (blocks, probes)
  if key in _SESSIONS_RUN:
    return _SESSIONS_RUN[key]
  result = subprocess.run(
    [sys.executable, "-c", _SESSION],
    input=json.dumps([name, blocks, probes]),
    capture_output=True,
    text=True,
    timeout=timeout,
    cwd=ROOT,
  )
  assert result.returncode == 0, f"{name}:\n{result.stderr[-3000:]}"
  printed = {"block": {}, "probe": {}}
  for part in result.stdout.split("\x1e")[1:]:
    head, _, text = part.partition("\n")
    kind, number = head.split()
    printed[kind][int(number)] = printed[kind].get(int(number), "") + text
  _SESSIONS_RUN[key] = printed["block"], printed["probe"]
  return _SESSIONS_RUN[key]


def _page_run(path: str, probes: Probes | None, timeout: float):
  outputs, probed = {}, {}
  for blocks in sessions(path):
    numbers = {number for number, _ in blocks}
    mine = tuple((n, *code) for n, code in sorted((probes or {}).items()) if n in numbers)
    got, got_probes = _session_outputs(tuple(map(tuple, blocks)), path, mine, timeout)
    outputs |= got
    probed |= got_probes
  return outputs, probed


def page_outputs(path: str, probes: Probes | None = None, timeout: float = 600) -> dict[int, str]:
  """Every block of the page that runs, run in page order (:func:`sessions`), each between
  its ``probes``: the stdout of each block, by block number. A block that fails fails the
  call, naming its page and block in the traceback."""
  return _page_run(path, probes, timeout)[0]


def probe_outputs(path: str, probes: Probes, timeout: float = 600) -> dict[int, str]:
  """What the ``probes`` of :func:`page_outputs`'s run printed (both of a block's, in
  order), by block number; the same run as ``page_outputs(path, probes)``."""
  return _page_run(path, probes, timeout)[1]
