"""The README tells the truth, and the site holds what it used to.

The README is the landing page: its one example runs and learns, its commands are what
CI runs, and it links into the site. Every section it held before it became one has a
home page in ``docs/`` that holds that section, and the examples that moved there run
from there (here and in ``test_readme_guides.py``).
"""

import re
import tomllib

import pytest

from tests.helpers.readme_examples import README
from tests.helpers.readme_examples import ROOT
from tests.helpers.readme_examples import headings
from tests.helpers.readme_examples import page_text
from tests.helpers.readme_examples import python_blocks
from tests.helpers.readme_examples import run
from tests.helpers.readme_examples import section

# Its offload example keeps state in host memory: without the compilation cache
# (tests/conftest.py).
pytestmark = pytest.mark.no_compilation_cache

# Every heading of the README before it became a landing page: the page of the site its
# section moved to, the heading it has there, and words of the section that page holds.
MOVED = {
  "lordo_jax": ("docs/index.md", "lordo_jax", "lordo_jax.communicated_bytes(state)"),
  "Two commands": (
    "docs/getting_started.md",
    "The main command",
    "`.ci/run` runs exactly the test command",
  ),
  "Using it: Flax NNX and `jax.shard_map`": (
    "docs/guides/flax.md",
    "Flax NNX and Linen",
    "The readers take `nnx.as_pure(optimizer.opt_state)` as it is",
  ),
  "Pitfalls with several workers": (
    "docs/guides/pitfalls.md",
    "Pitfalls with several workers",
    "**A sync rule must sync.**",
  ),
  "Checkpoints and restarts": (
    "docs/guides/checkpoints.md",
    "Checkpoints and restarts",
    "`--warm-start-steps S` runs the LoRDO paper's protocol",
  ),
  "Surviving a failed worker": (
    "docs/guides/failed_workers.md",
    "Surviving a failed worker",
    "`tx.update(grads, state, params, worker_present=False)`",
  ),
  "Multi-host: GPU clusters and TPU pods": (
    "docs/guides/multi_host.md",
    "Multi-host: GPU clusters and TPU pods",
    '`jax.distributed.initialize(coordinator_address="10.0.0.1:1234", num_processes=4,',
  ),
  "Sharded models: FSDP and tensor parallelism inside each worker": (
    "docs/guides/sharded_models.md",
    "Sharded models: FSDP and tensor parallelism inside each worker",
    "Which dimension to shard: split each low-rank matrix on the dimension its moments keep",
  ),
  "The anchor in host memory: `offload=True`": (
    "docs/guides/sharded_models.md",
    "The anchor in host memory: `offload=True`",
    "It needs `jit` or `shard_map`: under `pmap` JAX keeps every output on the device",
  ),
  "Across hosts: a worker group per node or per slice": (
    "docs/guides/sharded_models.md",
    "Across hosts: a worker group per node or per slice",
    "`create_hybrid_device_mesh(inner, outer)` returns an array of shape",
  ),
  "bfloat16": (
    "docs/guides/bfloat16.md",
    "bfloat16",
    "Keep a float32 copy of the parameters (or round stochastically)",
  ),
  "Overlapped synchronisation": (
    "docs/guides/overlap.md",
    "Overlapped synchronisation",
    'A wrong phase is never a wrong number: `"send"` on a step that sends nothing',
  ),
  "Methods": ("docs/api/index.md", "Methods at a glance", "| two-sided projection (TSR-Adam) |"),
  "Public API": (
    "docs/api/index.md",
    "Public API",
    '| {func}`warm_start_state(source_state, target_state, *, moments="keep")',  # a link
  ),
  "Communication per method (GPT-2 small shapes)": (
    "docs/benchmarks.md",
    "Communication per method (GPT-2 small shapes)",
    "per matrix that ratio is rK / (n + 2r) with n the larger side",
  ),
}


def _words(text: str) -> str:
  return " ".join(text.split())


@pytest.mark.parametrize("old", list(MOVED))
def test_every_section_the_readme_held_has_a_home_in_the_site(old):
  home, heading, words = MOVED[old]
  assert (ROOT / home).is_file(), f"{old!r}: {home} does not exist"
  titles = [title for _, title in headings(page_text(home))]
  assert heading in titles, f"{old!r}: {home} has no heading {heading!r}"
  assert section(heading, page=home).strip(), f"{old!r}: {home}'s {heading!r} is empty"
  assert _words(words) in _words(page_text(home)), f"{old!r}: {home} lacks {words!r}"


def test_the_readme_links_to_every_home_page():
  links = set(re.findall(r"\]\(([^)\s#]+)", README))
  missing = sorted({home for home, _, _ in MOVED.values()} - links)
  assert not missing, f"the README does not link to {missing}"


def test_every_page_the_readme_links_to_exists():
  links = re.findall(r"\]\(([^)\s#]+)", README)
  missing = [link for link in links if "://" not in link and not (ROOT / link).exists()]
  assert not missing, missing


def test_the_readme_is_a_landing_page():
  assert len(README.splitlines()) <= 170
  assert [title for level, title in headings(README) if level == 2] == [
    "Two commands",
    "One example",
    "Headline numbers",
    "The documentation",
  ]
  (plot,) = re.findall(r"!\[[^]]*\]\(([^)]+)\)", README)
  assert (ROOT / plot).is_file()


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
