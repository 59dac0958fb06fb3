r"""Run one LoRDO job as several local processes on JAX's distributed runtime.

    python3 examples/launch_multiprocess.py                        # 2 processes x 4 devices
    python3 examples/launch_multiprocess.py --processes 4 --devices-per-process 2
    python3 examples/launch_multiprocess.py --reference            # and compare with 1 x 8
    python3 examples/launch_multiprocess.py --fsdp 4 --reference   # 2 groups x 4-way FSDP

Starts ``--processes`` copies of ``examples/multiprocess_job.py`` on this machine,
each owning ``--devices-per-process`` simulated CPU devices; process 0 is the
coordinator, on ``127.0.0.1`` and a free port. Together they train one model with
``processes x devices-per-process`` LoRDO workers on one mesh, and the optimizer's
all-reduces cross the processes through gloo. With ``--fsdp F`` each worker is a group
of F devices of one process that shards its copy of the model F ways (FSDP), and the
worker axis spans the processes. This is the multi-host layout of a GPU cluster or a
TPU pod, on one machine: only the addresses change (docs/guides/multi_host.md).

The launcher waits for all processes, kills every one of them (their whole process
groups) if one fails or the time runs out, and prints process 0's results. With
``--reference`` it then runs the same job as one process with all the devices and
prints how far the two runs' parameters are apart (float rounding: the all-reduces
sum in another order).
"""

import argparse
import contextlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

JOB = pathlib.Path(__file__).resolve().with_name("multiprocess_job.py")


class LaunchError(RuntimeError):
  """A process of the job failed or ran out of time; the message holds its log.

  ``pids`` are the job's processes, all killed by the time this is raised.
  """

  def __init__(self, message: str, pids: list[int]):
    super().__init__(message)
    self.pids = pids


def free_port() -> int:
  """A TCP port on 127.0.0.1 that nothing listens on now."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _kill(processes: list[subprocess.Popen]) -> None:
  """Kills each process's group (the process and anything it started), then reaps it."""
  for p in processes:
    if p.poll() is None:
      with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
  for p in processes:
    with contextlib.suppress(subprocess.TimeoutExpired):
      p.wait(timeout=10)


def _tail(path: pathlib.Path, lines: int = 30) -> str:
  text = path.read_text(errors="replace") if path.exists() else ""
  useful = [line for line in text.splitlines() if not line.startswith("[Gloo]")]
  return "\n".join(useful[-lines:])


def launch(
  processes: int,
  devices_per_process: int,
  out: str | os.PathLike,
  *,
  job_args: tuple[str, ...] = (),
  timeout: float = 300.0,
) -> dict:
  """Runs the job as ``processes`` local processes and returns process 0's results.

  Args:
    processes: how many processes (1 runs the job without ``jax.distributed``).
    devices_per_process: simulated CPU devices each process owns.
    out: where process 0 writes ``result.npz`` / ``result.json`` and every process
      its log ``process_<i>.log``.
    job_args: more arguments for ``multiprocess_job.py`` (``--steps``, ...).
    timeout: seconds for the whole job; then every process is killed.

  Returns:
    ``{"params": {name: every worker's array}, **result.json}``, plus
    ``"restored"`` when ``job_args`` asked for ``--restore-from``.

  Raises:
    LaunchError: a process exited with an error or the job ran past ``timeout``; the
      message holds the end of each failed process's log.
  """
  out = pathlib.Path(out)
  out.mkdir(parents=True, exist_ok=True)
  coordinator = f"127.0.0.1:{free_port()}"
  children: list[subprocess.Popen] = []
  pids: list[int] = []
  logs = [out / f"process_{i}.log" for i in range(processes)]
  try:
    for i in range(processes):
      command = [
        sys.executable,
        str(JOB),
        f"--num-processes={processes}",
        f"--process-id={i}",
        f"--coordinator={coordinator}",
        f"--local-devices={devices_per_process}",
        f"--out={out}",
        *job_args,
      ]
      with open(logs[i], "w") as log:
        children.append(
          subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # killpg ends it with all it started
            env={**os.environ, "LORDO_LAUNCHER_PID": str(os.getpid())},
          )
        )
      pids.append(children[-1].pid)
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in children):
      failed = [i for i, p in enumerate(children) if p.poll() not in (None, 0)]
      if failed:  # the others would wait for it at the next collective, forever
        raise LaunchError(_report(f"process {failed[0]} failed", children, logs), pids)
      if time.monotonic() > deadline:
        raise LaunchError(_report(f"the job ran past {timeout:.0f} s", children, logs), pids)
      time.sleep(0.1)
    if any(p.returncode != 0 for p in children):
      raise LaunchError(_report("a process failed", children, logs), pids)
  finally:
    _kill(children)
  results = json.loads((out / "result.json").read_text())
  with np.load(out / "result.npz") as params:
    results["params"] = dict(params)
  if (out / "restored.npz").exists():
    with np.load(out / "restored.npz") as restored:
      results["restored"] = dict(restored)
  return results


def _report(what: str, children: list[subprocess.Popen], logs: list[pathlib.Path]) -> str:
  parts = [f"{what}; every process is killed."]
  for i, (p, log) in enumerate(zip(children, logs, strict=True)):
    status = "running" if p.poll() is None else f"exit code {p.returncode}"
    parts.append(f"--- process {i} ({status}), end of {log}:\n{_tail(log)}")
  return "\n".join(parts)


def max_difference(a: dict, b: dict) -> float:
  """The largest absolute difference between two dicts of arrays with the same keys."""
  return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--processes", type=int, default=2)
  parser.add_argument("--devices-per-process", type=int, default=4)
  parser.add_argument("--steps", type=int, default=24)
  parser.add_argument("--sync-every", type=int, default=4)
  parser.add_argument("--fsdp", type=int, default=1, help="devices per worker group (FSDP)")
  parser.add_argument("--timeout", type=float, default=300.0, help="seconds for each run")
  parser.add_argument("--out", help="results and logs (default: a temporary directory)")
  parser.add_argument(
    "--reference", action="store_true", help="also run 1 process with all the devices"
  )
  args = parser.parse_args(argv)
  out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="lordo_multiprocess_"))
  job_args = (f"--steps={args.steps}", f"--sync-every={args.sync_every}", f"--fsdp={args.fsdp}")

  def show(label, results):
    losses = results["losses"]
    print(
      f"{label}: {results['processes']} process(es), {results['workers']} workers x "
      f"{results['fsdp']}-way FSDP, "
      f"loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
      f"{results['communicated_bytes']:,} bytes all-reduced per worker"
    )

  start = time.perf_counter()
  multi = launch(
    args.processes, args.devices_per_process, out / "multi", job_args=job_args, timeout=args.timeout
  )
  show(f"multi-process ({time.perf_counter() - start:.1f} s)", multi)
  if args.reference:
    start = time.perf_counter()
    devices = args.processes * args.devices_per_process
    single = launch(1, devices, out / "single", job_args=job_args, timeout=args.timeout)
    show(f"single process ({time.perf_counter() - start:.1f} s)", single)
    print(
      "largest parameter difference, multi vs single process: "
      f"{max_difference(multi['params'], single['params']):.2e}"
    )
  print(f"results and logs in {out}")


if __name__ == "__main__":
  main()
