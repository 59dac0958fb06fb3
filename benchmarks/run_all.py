r"""Regenerates every table and plot behind BENCHMARKS.md, one study after another.

    python benchmarks/run_all.py            # full: results in benchmarks/results
    python benchmarks/run_all.py --quick    # minutes: results in runs/benchmarks_quick
    python benchmarks/run_all.py --quick --only quality,time_to_target --out /tmp/b

Each study is its own script, ``benchmarks/<topic>/<study>.py``, run in a subprocess
(each sets up its own simulated devices): ``quality.py`` (trains, or reads its cached runs),
``learning_rate.py`` (LoRDO's best learning rate against AdamW's on the README's example), then
``time_to_target.py`` (reads the quality study's runs), ``accelerator_model.py``
(utilisation and time to target on H100s against bandwidth, from the ledger on GPT-2
shapes and the full study's ``time_to_target.json``), ``extensions.py``
(compressed, streamed, two-sided and adaptive syncs, at the quality study's best
learning rates), then the optimizer-step
studies ``step_speed.py``, ``step_overhead.py``, ``memory.py``, ``sharded_memory.py``
(per-device state under FSDP, offload on and off), ``device_speed.py`` (the optimizer
step on GPT-2 small's shapes and the LM's whole step, timed on the device JAX runs on,
with their memory), ``compile_time.py`` (how long each method's step takes to compile
on this CPU), ``gpu_program.py`` (the same steps' programs compiled for GPUs on
this machine: launches, memory, collectives' places, a modelled time; it needs the test
extra's CUDA plugin) and ``refresh.py`` (refresh time and
LoRDO's quality per projection; it reads the quality study's results) where present,
then the studies of the paper's regime: ``fidelity.py`` (each of the paper's variants
alone), ``paper_protocol.py`` (its protocol as a whole, next to ours) and
``long_horizon.py`` (the claims at 1,024 and 2,048 steps; many CPU-hours in full mode,
cached run by run), ``overlap_quality.py`` (what each overlap and merge costs in
quality at 1,024 steps, at the long-horizon study's rates) and ``overlap_outer.py``
(the outer optimizer for a whole round in flight, swept at 1,024 steps) and
``elastic.py`` (a run resumed on another number of workers, workers away for rounds).
A study gets ``--quick`` and ``--out`` when its command line offers them (read from
its source, :func:`offered`, without starting a Python for it); in quick mode a study
that offers neither is skipped, so quick mode never writes over the committed full
results. The wall time of each study goes to ``run_all.json``.
"""

import argparse
import ast
import json
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
# Each study, in the order they run (a later one reads an earlier one's results), and
# its topic: the folder its script is in.
STUDIES = {
  "quality": "quality",
  "learning_rate": "quality",
  "time_to_target": "quality",
  "accelerator_model": "communication",
  "extensions": "quality",
  "step_speed": "speed",
  "step_overhead": "speed",
  "memory": "memory",
  "sharded_memory": "memory",
  "device_speed": "speed",
  "compile_time": "speed",
  "gpu_program": "gpu",
  "refresh": "quality",
  "precision": "quality",
  "fidelity": "paper",
  "paper_protocol": "paper",
  "long_horizon": "paper",
  "overlap_quality": "overlap",
  "overlap_outer": "overlap",
  "elastic": "elastic",
}
RESULTS = HERE / "results"
QUICK_RESULTS = ROOT / "runs" / "benchmarks_quick"


def offered(script: pathlib.Path) -> set[str]:
  """The options of ``script``'s command line, read from its source: the flags of its
  ``add_argument`` calls, and ``--quick`` and ``--out`` where it calls
  ``studies.parse_args`` (``benchmarks/harness/studies.py``), which adds both.

  Reading the source costs nothing; asking each script's ``--help`` cost a Python
  process per study, each importing JAX, Flax, Optax and matplotlib (seconds each)."""
  flags = set()
  for node in ast.walk(ast.parse(script.read_text(), filename=str(script))):
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
      continue
    if node.func.attr == "add_argument":
      flags |= {
        a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
      }
    elif node.func.attr == "parse_args" and getattr(node.func.value, "id", None) == "studies":
      flags |= {"--quick", "--out"}
  return flags


def command(study: str, quick: bool, out: pathlib.Path, default_out: bool) -> list[str] | None:
  """The command line of ``study``, or None when it cannot run as asked."""
  script = HERE / STUDIES[study] / f"{study}.py"
  if not script.exists():
    return None
  options = offered(script)
  args = [sys.executable, str(script)]
  if quick:
    if "--quick" not in options or "--out" not in options:
      return None
    args.append("--quick")
  if "--out" in options:
    args += ["--out", str(out)]
  elif not default_out:
    return None  # It would write to its own place, not to the --out asked for.
  return args


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--quick", action="store_true", help="every study's quick mode")
  parser.add_argument("--out", type=pathlib.Path, default=None, help="where results go")
  parser.add_argument("--only", default=",".join(STUDIES), help="comma-separated studies")
  args = parser.parse_args(argv)
  out = args.out or (QUICK_RESULTS if args.quick else RESULTS)
  out.mkdir(parents=True, exist_ok=True)
  timings = {}
  for study in args.only.split(","):
    if study not in STUDIES:
      parser.error(f"--only: unknown study {study!r}; choose among {','.join(STUDIES)}")
    argv_study = command(study, args.quick, out, default_out=args.out is None)
    if argv_study is None:
      print(f"{study}: skipped (no script, or no way to run it {'quickly ' * args.quick}in {out})")
      continue
    print(f"{study}: {' '.join(argv_study[1:])}", flush=True)
    start = time.perf_counter()
    subprocess.run(argv_study, check=True, cwd=ROOT)
    timings[study] = time.perf_counter() - start
  (out / "run_all.json").write_text(json.dumps({"quick": args.quick, "wall_time_s": timings}))
  print("wall time: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
