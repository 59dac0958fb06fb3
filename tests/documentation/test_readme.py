"""The README tells the truth: its example runs and learns, its commands are what CI
runs, and every page it links to exists. The guides' examples run in
``test_readme_guides.py``.
"""

import re
import tomllib

import pytest

from tests.helpers.readme_examples import README
from tests.helpers.readme_examples import ROOT
from tests.helpers.readme_examples import page_text
from tests.helpers.readme_examples import python_blocks
from tests.helpers.readme_examples import run
from tests.helpers.readme_examples import section

# Its offload example keeps state in host memory: without the compilation cache
# (tests/conftest.py).
pytestmark = pytest.mark.no_compilation_cache


def test_every_page_the_readme_links_to_exists():
  links = re.findall(r"\]\(([^)\s#]+)", README)
  missing = [link for link in links if "://" not in link and not (ROOT / link).exists()]
  assert not missing, missing


def test_the_readme_example_is_nnx_optimizer_on_one_worker_and_learns():
  (code,) = python_blocks()
  assert "nnx.Optimizer(model, lordo_jax.lordo(" in code
  # The same example opens the getting-started page and the Flax guide.
  assert code == python_blocks(page_text("docs/getting_started.md"))[0]
  assert code == python_blocks(page_text("docs/guides/flax.md"))[0]
  losses = [float(x) for x in re.findall(r"step \d+: loss ([0-9.]+)", run(code))]
  assert len(losses) == 2 and losses[1] < 0.7 * losses[0]


def test_nnx_shard_map_example_runs_and_learns():
  (code,) = python_blocks(section("NNX, several workers", page="docs/guides/flax.md"))
  assert "nnx.Optimizer(model, tx" in code
  output = run(code)
  losses = [float(x) for x in re.findall(r"loss ([0-9.]+)", output)]
  sent = [int(x.replace(",", "")) for x in re.findall(r"sent ([0-9,]+) bytes", output)]
  assert len(losses) == 5 and losses[-1] < 0.7 * losses[0]
  # 32x128 and 128x32 kernels: the first gradient (2 x 4096 floats) at step 0, then per
  # sync (every 16 steps) the pseudo-gradient of all 8352 params and the moments:
  # 2 * 8 * 32 per kernel (rank 8, small side 32) + 2 * (128 + 32) for the biases.
  first, per_sync = 2 * 4096 * 4, (8352 + 2 * (2 * 8 * 32) + 2 * 160) * 4
  assert sent == [first + k * per_sync for k in (0, 1, 2, 3, 4)]
  page = " ".join(page_text("docs/guides/flax.md").split())  # What the text says of them.
  assert f"sent {first:,} bytes per worker`" in page
  assert f"Each sync then adds {per_sync:,} bytes" in page


SHARDED = "docs/guides/sharded_models.md"


def test_sharded_models_example_runs_on_four_workers_times_two_way_fsdp():
  code = python_blocks(section("Sharded models", page=SHARDED))[0]
  output = run(code)
  pattern = r"sharded run: loss ([0-9.]+) -> ([0-9.]+), up sharded as (.*), sent ([0-9,]+) bytes"
  line = re.search(pattern, output)
  assert float(line.group(2)) < 0.8 * float(line.group(1)), output
  assert line.group(3) == "P('workers', 'fsdp', None)"
  # The first gradient, then 4 syncs of the pseudo-gradient and both moments (rank 4,
  # small side 32, two matrices): the same as unsharded.
  params, moments = 2 * 32 * 64, 2 * 2 * 4 * 32
  assert int(line.group(4).replace(",", "")) == (params + 4 * (params + moments)) * 4


def test_offload_example_continues_the_sharded_one():
  sharded = python_blocks(section("Sharded models", page=SHARDED))[0]
  (offload,) = python_blocks(section("The anchor in host memory", page=SHARDED))
  kind, sizes = run(sharded + offload).strip().splitlines()[-2:]
  assert kind == "pinned_host"
  sizes = eval(sizes)  # noqa: S307 - the dict state_bytes printed
  anchor = 4 * 2 * 32 * 64 * 4  # four workers' anchors of the two matrices, float32
  assert sizes["host"] == sizes["offloadable"] == anchor


def test_ci_runs_the_readme_test_command():
  command = re.search(r"# the tests\n(.*)\n", README).group(1)
  assert command in (ROOT / ".ci" / "run").read_text()


def test_the_readme_builds_the_site_as_ci_does():
  command = re.search(r"# the documentation site.*\n(.*)\n", README).group(1)
  assert command == 'pip install -e ".[docs]" && sphinx-build -W -b html docs docs/_build/html'
  project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
  assert "docs" in project["optional-dependencies"]
  assert "sphinx-build -W -q -b html docs docs/_build/html" in (ROOT / ".ci" / "run").read_text()


def test_every_public_name_is_in_the_api_table():
  import lordo_jax

  table = section("Public API", page="docs/api/index.md")
  missing = [name for name in lordo_jax.__all__ if f"`{name}" not in table]
  assert not missing, f"not in the Public API table of docs/api/index.md: {missing}"
