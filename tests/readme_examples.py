"""The README's text, its sections and Python blocks, and a runner for its examples."""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def section(title: str) -> str:
  """The body of the README section whose heading starts ``## title``."""
  return README.split(f"\n## {title}", 1)[1].split("\n## ", 1)[0]


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
