"""The README tells the truth: its example runs, its commands are what CI runs."""

import pathlib
import re
import subprocess
import sys

import pytest

# Its offload example keeps state in host memory: without the compilation cache
# (tests/conftest.py).
pytestmark = pytest.mark.no_compilation_cache

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _run(code: str) -> str:
  result = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT
  )
  assert result.returncode == 0, result.stderr[-2000:]
  return result.stdout


def test_the_first_example_is_nnx_optimizer_on_one_worker_and_learns():
  code = re.findall(r"```python\n(.*?)```", README, re.S)[0]
  assert "nnx.Optimizer(model, lordo_jax.lordo(" in code
  losses = [float(x) for x in re.findall(r"step \d+: loss ([0-9.]+)", _run(code))]
  assert len(losses) == 2 and losses[1] < 0.7 * losses[0]


def test_nnx_shard_map_example_runs_and_learns():
  code = re.findall(r"```python\n(.*?)```", README, re.S)[1]
  assert "nnx.Optimizer(model, tx" in code
  output = _run(code)
  losses = [float(x) for x in re.findall(r"loss ([0-9.]+)", output)]
  sent = [int(x.replace(",", "")) for x in re.findall(r"sent ([0-9,]+) bytes", output)]
  assert len(losses) == 5 and losses[-1] < 0.7 * losses[0]
  # 32x128 and 128x32 kernels: the first gradient (2 x 4096 floats) at step 0, then per
  # sync (every 16 steps) the pseudo-gradient of all 8352 params and the moments:
  # 2 * 8 * 32 per kernel (rank 8, small side 32) + 2 * (128 + 32) for the biases.
  first, per_sync = 2 * 4096 * 4, (8352 + 2 * (2 * 8 * 32) + 2 * 160) * 4
  assert sent == [first + k * per_sync for k in (0, 1, 2, 3, 4)]


def test_sharded_models_example_runs_on_four_workers_times_two_way_fsdp():
  section = README.split("\n## Sharded models", 1)[1].split("\n## ", 1)[0]
  code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
  output = _run(code)
  pattern = r"sharded run: loss ([0-9.]+) -> ([0-9.]+), up sharded as (.*), sent ([0-9,]+) bytes"
  line = re.search(pattern, output)
  assert float(line.group(2)) < 0.8 * float(line.group(1)), output
  assert line.group(3) == "P('workers', 'fsdp', None)"
  # The first gradient, then 4 syncs of the pseudo-gradient and both moments (rank 4,
  # small side 32, two matrices): the same as unsharded.
  params, moments = 2 * 32 * 64, 2 * 2 * 4 * 32
  assert int(line.group(4).replace(",", "")) == (params + 4 * (params + moments)) * 4


def test_offload_example_continues_the_sharded_one():
  section = README.split("\n## Sharded models", 1)[1].split("\n## ", 1)[0]
  sharded, offload = re.findall(r"```python\n(.*?)```", section, re.S)[:2]
  kind, sizes = _run(sharded + offload).strip().splitlines()[-2:]
  assert kind == "pinned_host"
  sizes = eval(sizes)  # noqa: S307 - the dict state_bytes printed
  anchor = 4 * 2 * 32 * 64 * 4  # four workers' anchors of the two matrices, float32
  assert sizes["host"] == sizes["offloadable"] == anchor


def test_ci_runs_the_readme_test_command():
  command = re.search(r"# the tests\n(.*)\n", README).group(1)
  assert command in (ROOT / ".ci" / "run").read_text()


def test_every_public_name_is_in_the_api_table():
  import lordo_jax

  table = README.split("\n## Public API\n", 1)[1].split("\n## ", 1)[0]
  missing = [name for name in lordo_jax.__all__ if f"`{name}" not in table]
  assert not missing, f"not in the README's Public API table: {missing}"
