"""Every page's code runs as written, and prints what its text says.

Each page's Python blocks run in page order, each after the ones before it, in one
interpreter per page (a new one where a block sets the simulated device count, which
must come before JAX starts): ``tests/helpers/readme_examples.py``. A block that cannot
run here is marked ``<!-- not run: why -->`` in the Markdown; it still compiles, and the
marked blocks are listed here, so none is skipped silently. The tests after the first
read what a page's blocks printed, from the same runs, and what the test's own code run
beside a block in its interpreter printed (:data:`PROBES`): the phases the overlap
guide's steps are given and the programs they compile, the Flax guide's attention recipe
under warnings that are errors.
"""

import re

import pytest

from tests.helpers.readme_examples import NOT_RUN
from tests.helpers.readme_examples import PAGES
from tests.helpers.readme_examples import page_blocks
from tests.helpers.readme_examples import page_outputs as run_page
from tests.helpers.readme_examples import page_text
from tests.helpers.readme_examples import probe_outputs
from tests.helpers.readme_examples import python_blocks

# The sharded-models guide holds state in host memory: without the compilation cache
# (tests/conftest.py). A page's interpreters run one after another, a few minutes at most.
pytestmark = [pytest.mark.no_compilation_cache, pytest.mark.timeout(900, method="thread")]

RUN = [page for page in PAGES if any(why is None for _, why in page_blocks(page))]
# Every block marked not run: (page, block number from 1).
NOT_RUN_BLOCKS = {
  ("docs/guides/overlap.md", 5),  # compile_overlapped on your own step
  ("docs/guides/overlap.md", 6),  # a GPU compiler's options
  ("docs/guides/sharded_models.md", 3),  # a mesh over several hosts
}


OVERLAP, FLAX = "docs/guides/overlap.md", "docs/guides/flax.md"


def number_of(page: str, contains: str) -> int:
  """The number (from 1) of the one block of ``page`` whose code holds ``contains``."""
  (number,) = [n for n, (code, _) in enumerate(page_blocks(page), 1) if contains in code]
  return number


# Counts the phases the overlap guide's one-worker step is given.
COUNT_PHASES = """
import lordo_jax

phases, phase_of = [], lordo_jax.overlap_phase
lordo_jax.overlap_phase = lambda *a, **k: phases.append(phase_of(*a, **k)) or phases[-1]
"""
PROBES = {
  OVERLAP: {
    number_of(OVERLAP, python_blocks(page_text(OVERLAP))[1]): (
      COUNT_PHASES,
      "print(phases.count('send'), float(loss_fn(model, batches[0])) < first / 2)",
    ),
    number_of(OVERLAP, "jax.shard_map"): ("", "print('programs', train_step._cache_size())"),
  },
  FLAX: {
    number_of(FLAX, "MultiHeadAttention"): (
      "import warnings\nwarnings.simplefilter('error', UserWarning)",
      "",
    ),
  },
}


def page_outputs(page: str) -> dict[int, str]:
  """What each block of ``page`` printed, run beside the page's :data:`PROBES`."""
  return run_page(page, PROBES.get(page))


def output(page: str, contains: str) -> str:
  """What the one block of ``page`` whose code holds ``contains`` printed."""
  return page_outputs(page)[number_of(page, contains)]


def flat(page: str) -> str:
  return " ".join(page_text(page).split())


@pytest.mark.parametrize("page", RUN)
def test_every_python_block_of_the_page_runs_in_page_order(page):
  blocks = page_blocks(page)
  ran = {n for n, (_, why) in enumerate(blocks, 1) if why is None}
  assert set(page_outputs(page)) == ran


def test_the_blocks_not_run_are_marked_each_with_a_reason_and_compile():
  marked = set()
  for page in PAGES:
    blocks = page_blocks(page)
    notes = NOT_RUN.findall(page_text(page))
    assert len(notes) == sum(why is not None for _, why in blocks), f"{page}: a stray marker"
    for number, (code, why) in enumerate(blocks, 1):
      if why is not None:
        compile(code, f"{page}, block {number}", "exec")
        marked.add((page, number))
  assert marked == NOT_RUN_BLOCKS


def test_the_readme_example_is_nnx_optimizer_on_one_worker_and_learns():
  (code, _), *_ = page_blocks("README.md")
  assert "nnx.Optimizer(model, lordo_jax.lordo(" in code
  # The same example opens the getting-started page and the Flax guide.
  assert code == page_blocks("docs/getting_started.md")[0][0]
  assert code == page_blocks("docs/guides/flax.md")[0][0]
  losses = [float(x) for x in re.findall(r"step \d+: loss ([0-9.]+)", page_outputs("README.md")[1])]
  assert len(losses) == 2 and losses[1] < 0.7 * losses[0]


def test_nnx_shard_map_example_learns_and_sends_what_the_text_says():
  page = "docs/guides/flax.md"
  printed = output(page, "per_worker(state)")
  losses = [float(x) for x in re.findall(r"loss ([0-9.]+)", printed)]
  sent = [int(x.replace(",", "")) for x in re.findall(r"sent ([0-9,]+) bytes", printed)]
  assert len(losses) == 5 and losses[-1] < 0.7 * losses[0]
  # 32x128 and 128x32 kernels: the first gradient (2 x 4096 floats) at step 0, then per
  # sync (every 16 steps) the pseudo-gradient of all 8352 params and the moments:
  # 2 * 8 * 32 per kernel (rank 8, small side 32) + 2 * (128 + 32) for the biases.
  first, per_sync = 2 * 4096 * 4, (8352 + 2 * (2 * 8 * 32) + 2 * 160) * 4
  assert sent == [first + k * per_sync for k in (0, 1, 2, 3, 4)]
  assert f"sent {first:,} bytes per worker`" in flat(page)
  assert f"Each sync then adds {per_sync:,} bytes" in flat(page)


def test_scanned_layers_example_gives_each_layer_its_basis():
  """The Flax guide's stacked leaf (``MatrixAxes(batch=0, ...)``): one basis per layer."""
  assert "bases: (4, 32, 4)" in output("docs/guides/flax.md", "batch=0")
  assert "It prints `bases: (4, 32, 4)`" in page_text("docs/guides/flax.md")


SHARDED = "docs/guides/sharded_models.md"


def test_sharded_models_example_runs_on_four_workers_times_two_way_fsdp():
  pattern = r"sharded run: loss ([0-9.]+) -> ([0-9.]+), up sharded as (.*), sent ([0-9,]+) bytes"
  line = re.search(pattern, page_outputs(SHARDED)[1])
  assert float(line.group(2)) < 0.8 * float(line.group(1))
  assert line.group(3) == "P('workers', 'fsdp', None)"
  # The first gradient, then 4 syncs of the pseudo-gradient and both moments (rank 4,
  # small side 32, two matrices): the same as unsharded.
  params, moments = 2 * 32 * 64, 2 * 2 * 4 * 32
  assert int(line.group(4).replace(",", "")) == (params + 4 * (params + moments)) * 4


def test_offload_example_continues_the_sharded_one():
  kind, sizes = output(SHARDED, "offload=True").strip().splitlines()[-2:]
  assert kind == "pinned_host"
  sizes = eval(sizes)  # noqa: S307 - the dict state_bytes printed
  anchor = 4 * 2 * 32 * 64 * 4  # four workers' anchors of the two matrices, float32
  assert sizes["host"] == sizes["offloadable"] == anchor


CHECKPOINTS = "docs/guides/checkpoints.md"


def test_checkpoint_example_resumes_bit_identically():
  assert "resumed at step 6: bit-identical True" in page_outputs(CHECKPOINTS)[1]


def test_nnx_checkpoint_example_resumes_from_fresh_and_abstract_targets():
  printed = output(CHECKPOINTS, "nnx.Optimizer")
  assert printed.count("NNX resumed at step 6: bit-identical True") == 2


def test_resume_on_another_number_of_workers_example_synchronises_the_new_workers():
  printed = output(CHECKPOINTS, "remap_workers(params8, state8, 4, sync_every=K)")
  assert "on 4 workers at step 12: agree True" in printed
  assert "It prints `on 4 workers at step 12: agree True`" in page_text(CHECKPOINTS)


FAILED = "docs/guides/failed_workers.md"


def test_failed_worker_example_prints_what_the_text_says():
  printed = page_outputs(FAILED)[1]
  assert "finite: True, workers agree: True" in printed
  assert "left out: 2, syncs with nobody: 0" in printed
  assert (
    "It prints `finite: True, workers agree: True` and `left out: 2, syncs with nobody: 0`"
    in page_text(FAILED)
  )


def test_leave_and_join_example_prints_what_the_text_says():
  """The second example of the failed-workers guide: worker 3 away for rounds 2 and 3."""
  printed = page_outputs(FAILED)[2]
  for step, here in ((4, 4), (8, 3), (12, 3), (16, 4)):
    assert f"step {step}: {here} present, every slot the same state: True" in printed
  assert "left out: 2" in printed
  assert (
    "It prints `every slot the same state: True` at each of the four boundaries (`3 present` "
    "at steps 8 and 12) and `left out: 2`" in flat(FAILED)
  )


def test_bfloat16_example_keeps_params_bf16_and_bases_f32():
  printed = page_outputs("docs/guides/bfloat16.md")[1]
  assert "params: {'bfloat16'}" in printed and "bases: {'float32'}" in printed


def test_accelerators_example_compiles_its_local_steps_without_the_round():
  page = "docs/guides/accelerators.md"
  assert "local steps: 27 of 32, loss 0.406" in page_outputs(page)[1]
  assert "It prints `local steps: 27 of 32, loss 0.406`" in page_text(page)


def test_the_overlap_guides_one_worker_step_learns_as_its_text_says():
  page = OVERLAP
  printed = output(page, "overlap=2)\noptimizer = nnx.Optimizer")
  assert (
    printed.strip() == "loss 5.991 -> 1.631"
    and "It prints `loss 5.991 -> 1.631`" in page_text(page)
  )


def test_the_overlap_guides_one_worker_step_is_given_its_phases():
  """40 steps, K = 16, tau = 2: the steps numbered 16, 17, 32 and 33 send a chunk (a
  wrong phase costs bytes, never numbers: only the count shows it); the loss halves."""
  number = number_of(OVERLAP, python_blocks(page_text(OVERLAP))[1])
  assert probe_outputs(OVERLAP, PROBES[OVERLAP])[number].split() == ["4", "True"]


def test_the_overlap_guides_shard_map_step_sends_what_the_text_says():
  """The step with a static phase inside ``jax.shard_map`` on 4 workers, bfloat16
  parameters: one program per phase (the state stacked as the step returns it), the
  loss falls, and it sends the bytes it quotes."""
  number = number_of(OVERLAP, "jax.shard_map")
  lines = page_outputs(OVERLAP)[number].splitlines()
  first, last = (re.search(r"loss ([\d.]+), sent ([\d,]+) bytes", x) for x in lines)
  assert float(last.group(1)) < float(first.group(1)) / 4
  assert (first.group(2), last.group(2)) == ("256", "1,648")  # 256 + 3 x (2 x 136 + 4 x 48)
  assert "`step 31: loss 0.377, sent 1,648 bytes per worker`" in page_text(OVERLAP)
  assert probe_outputs(OVERLAP, PROBES[OVERLAP])[number].split() == ["programs", "2"]


def test_the_flax_attention_recipe_labels_every_kernel_without_a_warning():
  """Run with warnings as errors (its probe): every kernel gets a basis, no warning."""
  assert "bases: query (32, 4), out (32, 4)" in output(FLAX, "MultiHeadAttention")
  assert "It prints `bases: query (32, 4), out (32, 4)`" in page_text(FLAX)
