"""Shared pieces of the optimizer-step studies: command line, interleaved timing, output.

``step_speed.py``, ``step_overhead.py`` and ``memory.py`` each write
``<out>/<name>.json`` (every number, with the command, the machine and the date) and
``<out>/<name>.md`` (a markdown table with the same header and notes), and print the
table. ``--out`` defaults to ``benchmarks/results`` (the committed results) and, with
``--quick``, to ``runs/benchmarks_quick`` (ignored by git), so a quick run never
writes over the committed full results; ``run_all.py`` passes ``--out`` either way.
"""

import argparse
import collections
import datetime
import json
import os
import pathlib
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
QUICK_RESULTS = ROOT / "runs" / "benchmarks_quick"
# glibc's malloc gives each allocation above the mmap threshold (at most 32 MB by
# default) fresh pages from the kernel, and returns free memory at the top of its heap
# above the trim threshold; either way a program whose scratch memory is large pays a
# page fault per 4 KiB it touches, on every call. step_speed.py shows it.
MALLOC_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def parse_args(doc: str, quick_help: str, argv=None, extra=None) -> argparse.Namespace:
  """``--quick`` and ``--out``; ``out`` is resolved to its default. ``doc``: the
  study's module docstring (its first paragraph describes the command); ``extra``: a
  function that adds the study's own options to the parser."""
  parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
  if extra is not None:
    extra(parser)
  parser.add_argument("--quick", action="store_true", help=quick_help)
  parser.add_argument(
    "--out",
    type=pathlib.Path,
    default=None,
    help="folder for the .json and .md (default: benchmarks/results, or "
    "runs/benchmarks_quick with --quick)",
  )
  args = parser.parse_args(argv)
  args.out = args.out or (QUICK_RESULTS if args.quick else RESULTS)
  return args


class Timed:
  """A function called ``calls`` times per round; call t (from 1) is of kind ``kind(t)``.

  Each call is followed by ``jax.block_until_ready`` and timed with
  ``time.perf_counter``. A study warms every candidate up with one untimed round, then
  runs timed rounds of all candidates in turn (:func:`interleave`), so that the load
  of other processes on the machine falls on all of them alike.
  """

  def __init__(
    self,
    call: Callable,
    calls: int,
    kind: Callable[[int], str] = lambda t: "local",
    prepare: Callable[[], tuple] = tuple,
  ):
    """``call(*prepare())``: ``prepare`` (untimed) makes the arguments of each call."""
    self.call, self.calls, self.kind, self.prepare = call, calls, kind, prepare
    self.count = 0
    self.seconds = collections.defaultdict(list)

  def round(self, record: bool) -> None:
    for _ in range(self.calls):
      self.count += 1
      args = jax.block_until_ready(self.prepare())
      tic = time.perf_counter()
      jax.block_until_ready(self.call(*args))
      if record:
        self.seconds[self.kind(self.count)].append(time.perf_counter() - tic)

  def ms(self, kind: str = "local") -> float:
    """Median milliseconds of the timed calls of ``kind``."""
    return 1e3 * statistics.median(self.seconds[kind])


def interleave(candidates: list[Timed], repeats: int) -> None:
  """One warm-up round of each candidate, then ``repeats`` timed rounds of all of them,
  in an order that rotates by one each time."""
  for candidate in candidates:
    candidate.round(record=False)
  for i in range(repeats):
    shift = i % len(candidates)
    for candidate in candidates[shift:] + candidates[:shift]:
      candidate.round(record=True)


def amortised(local: float, sync: float, period: int) -> float:
  """Mean time per step over a period of ``period - 1`` local steps and one sync step."""
  return ((period - 1) * local + sync) / period


def machine() -> dict[str, Any]:
  """The CPU model, its core count and the software a number was measured with."""
  cpu = platform.processor() or platform.machine()
  cpuinfo = pathlib.Path("/proc/cpuinfo")
  if cpuinfo.exists():
    names = [line for line in cpuinfo.read_text().splitlines() if line.startswith("model name")]
    cpu = names[0].split(":", 1)[1].strip() if names else cpu
  return {
    "cpu": cpu,
    "cores": os.cpu_count(),
    "jax": jax.__version__,
    "python": platform.python_version(),
    "backend": jax.default_backend(),
    "devices": jax.device_count(),
    "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS", "unset"),
    "malloc": malloc_settings() or "glibc default",
  }


def runs(out: pathlib.Path, name: str) -> pathlib.Path:
  """The folder of cached runs ``name`` under the results folder ``out``: ``<out>/runs/<name>``.

  A study's report (``<out>/<study>.json``, ``.md``, ``.png``) is what a reader opens; the
  runs it was made from (one file per run, read back so that a study resumes where it
  stopped) stay out of the way: ``lm`` (the LM runs the quality studies share, see
  :mod:`lm_runs`), ``elastic``, ``paper_protocol``.
  """
  return out / "runs" / name


def script(name: str) -> pathlib.Path:
  """The study ``name``'s script, ``benchmarks/<topic>/<name>``, relative to the repository."""
  (path,) = (ROOT / "benchmarks").glob(f"*/{name}")
  return path.relative_to(ROOT)


def command(name: str, args: argparse.Namespace) -> str:
  """The command that reproduces a result (with ``--out`` when it is not the default)."""
  line = f"python {script(name).as_posix()}" + (" --quick" if args.quick else "")
  line += "".join(f" {flag}" for flag in getattr(args, "flags", ()))  # The study's own.
  if args.out.resolve() not in (RESULTS.resolve(), QUICK_RESULTS.resolve()):
    line += f" --out {os.path.relpath(args.out, ROOT)}"
  return " ".join([malloc_settings(), line]).strip()


def malloc_settings() -> str:
  """The glibc malloc variables of :data:`MALLOC_SETTINGS` set in the environment."""
  return " ".join(f"{k}={os.environ[k]}" for k in MALLOC_SETTINGS if k in os.environ)


def table(header: list[str], rows: list[list[Any]], align: str | None = None) -> list[str]:
  """Markdown table lines; ``align`` is one of ``l``/``r`` per column (default all ``r``
  but the first)."""
  align = align or "l" + "r" * (len(header) - 1)
  rule = ["---:" if a == "r" else "---" for a in align]
  lines = ["| " + " | ".join(header) + " |", "|" + "|".join(rule) + "|"]
  return lines + ["| " + " | ".join(str(x) for x in row) + " |" for row in rows]


def write(
  name: str,
  args: argparse.Namespace,
  record: dict[str, Any],
  title: str,
  lines: list[str],
  notes: list[str],
) -> list[pathlib.Path]:
  """Writes ``<args.out>/<name>.json`` and ``.md``; prints the markdown.

  ``record`` gets ``study``, ``command`` (see :func:`command`; of the script ``<name>.py``
  unless ``record`` names its own), ``quick``, ``machine``, ``date`` and ``notes`` added.
  """
  quick = args.quick
  record = {
    "study": name,
    "command": record.get("command") or command(f"{name}.py", args),
    "quick": quick,
    "machine": machine(),
    "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    **record,
    "notes": notes,
  }
  m = record["machine"]
  header = [
    f"### {title}",
    "",
    f"Command: `{record['command']}`. Machine: {m['cpu']}, {m['cores']} cores, "
    f"jax {m['jax']} (Python {m['python']}, {m['backend']}), "
    f"OPENBLAS_NUM_THREADS={m['openblas_threads']}, malloc: {m['malloc']}. "
    f"Date: {record['date']}.",
    "",
  ]
  markdown = "\n".join([*header, *lines, "", *(f"- {n}" for n in notes)]) + "\n"
  args.out.mkdir(parents=True, exist_ok=True)
  paths = [args.out / f"{name}.json", args.out / f"{name}.md"]
  paths[0].write_text(json.dumps(record, indent=1) + "\n")
  paths[1].write_text(markdown)
  print(markdown)
  return paths
