"""The guides tell the truth: each guide's Python example runs and says so.

The guides (``docs/guides/``, once sections of the README) "Checkpoints and restarts",
"Surviving a failed worker" (two) and "bfloat16" carry complete programs; each runs
in its own interpreter (the second sets up its own simulated devices) and must print
what the text around it promises. The multi-host guide names the launcher's real
options, and the overlap guide's step with a static phase learns.
"""

import re

import pytest

from tests.helpers.readme_examples import ROOT
from tests.helpers.readme_examples import page_text
from tests.helpers.readme_examples import python_blocks
from tests.helpers.readme_examples import run
from tests.helpers.readme_examples import section

pytestmark = pytest.mark.timeout(180, method="thread")


def guide_code(guide: str) -> str:
  """The first Python block of ``docs/guides/<guide>.md``."""
  return python_blocks(page_text(f"docs/guides/{guide}.md"))[0]


def test_checkpoint_example_resumes_bit_identically():
  assert "resumed at step 6: bit-identical True" in run(guide_code("checkpoints"))


def test_nnx_checkpoint_example_resumes_from_fresh_and_abstract_targets():
  code = python_blocks(page_text("docs/guides/checkpoints.md"))[1]
  assert "nnx.Optimizer" in code
  assert run(code).count("NNX resumed at step 6: bit-identical True") == 2


def test_failed_worker_example_prints_what_the_text_says():
  stdout = run(guide_code("failed_workers"))
  assert "finite: True, workers agree: True" in stdout
  assert "left out: 2, syncs with nobody: 0" in stdout
  assert (
    "It prints `finite: True, workers agree: True` and `left out: 2, syncs with nobody: 0`"
    in page_text("docs/guides/failed_workers.md")
  )


def test_leave_and_join_example_prints_what_the_text_says():
  """The second example of the failed-workers guide: worker 3 away for rounds 2 and 3."""
  page = "docs/guides/failed_workers.md"
  (code,) = python_blocks(section("Workers that leave and come back", page=page))
  stdout = run(code)
  for step, here in ((4, 4), (8, 3), (12, 3), (16, 4)):
    assert f"step {step}: {here} present, every slot the same state: True" in stdout
  assert "left out: 2" in stdout
  assert (
    "It prints `every slot the same state: True` at each of the four boundaries (`3 present` "
    "at steps 8 and 12) and `left out: 2`" in " ".join(page_text(page).split())
  )


def test_bfloat16_example_keeps_params_bf16_and_bases_f32():
  stdout = run(guide_code("bfloat16"))
  assert "params: {'bfloat16'}" in stdout
  assert "bases: {'float32'}" in stdout


def test_multi_host_section_names_the_launcher_and_its_options():
  body = section("Multi-host: GPU clusters and TPU pods", page="docs/guides/multi_host.md")
  command = re.search(r"python examples/launch_multiprocess.py (.*)\n", body).group(1)
  launcher = (ROOT / "examples" / "launch_multiprocess.py").read_text()
  for option in re.findall(r"--[a-z-]+", command):
    assert f'"{option}"' in launcher, option
  for option in ("--coordinator", "--num-processes", "--process-id"):
    assert (
      option in body and f'"{option}"' in (ROOT / "examples" / "multiprocess_job.py").read_text()
    )
  assert "docs/guides/multi_host.md" in launcher  # the launcher's docstring points here


_OVERLAP_SETUP = """
import jax, jax.numpy as jnp, optax, lordo_jax
from flax import nnx

model = nnx.Linear(8, 4, rngs=nnx.Rngs(0))
optimizer = nnx.Optimizer(
  model, lordo_jax.lordo(3e-2, rank=2, sync_every=16, overlap=2), wrt=nnx.Param
)
target = jax.random.normal(jax.random.key(1), (8, 4))
xs = jax.random.normal(jax.random.key(2), (40, 16, 8))
batches = [(x, x @ target) for x in xs]

def loss_fn(model, batch):
  x, y = batch
  return jnp.mean((model(x) - y) ** 2)

first = float(loss_fn(model, batches[0]))
phases, phase_of = [], lordo_jax.overlap_phase
lordo_jax.overlap_phase = lambda *a, **k: phases.append(phase_of(*a, **k)) or phases[-1]
"""


def test_overlap_phase_example_learns_with_its_phases():
  code = python_blocks(page_text("docs/guides/overlap.md"))[1]
  check = "\nprint(phases.count('send'), float(loss_fn(model, batches[0])) < first / 2)\n"
  # 40 steps, K = 16, tau = 2: the steps numbered 16, 17, 32 and 33 send a chunk.
  assert run(_OVERLAP_SETUP + code + check).split()[-2:] == ["4", "True"]


def test_scanned_layers_example_gives_each_layer_its_basis():
  """The Flax guide's stacked leaf (``MatrixAxes(batch=0, ...)``) trains and prints
  one basis per layer, as its text says."""
  (code,) = [b for b in python_blocks(page_text("docs/guides/flax.md")) if "batch=0" in b]
  assert "bases: (4, 32, 4)" in run(code)
  assert "It prints `bases: (4, 32, 4)`" in page_text("docs/guides/flax.md")


def test_attention_example_labels_flax_kernels_low_rank_without_a_warning():
  """The Flax guide's ``nnx.MultiHeadAttention`` recipe: every kernel gets a basis, no
  warning comes, and without its labels the warning the guide quotes does."""
  page = page_text("docs/guides/flax.md")
  (code,) = [b for b in python_blocks(page) if "MultiHeadAttention" in b]
  strict = "import warnings\nwarnings.simplefilter('error', UserWarning)\n"
  assert "bases: query (32, 4), out (32, 4)" in run(strict + code)
  assert "It prints `bases: query (32, 4), out (32, 4)`" in page
  shown = "import warnings\nwarnings.showwarning = lambda m, *a, **k: print('WARNING', m)\n"
  unlabelled = code.split("bases = ")[0].replace(", low_rank_labels=low_rank_labels", "")
  assert "low_rank_labels=" not in unlabelled
  printed = " ".join(run(shown + unlabelled).split())
  quoted = section("Attention kernels as matrices", page="docs/guides/flax.md")
  quoted = re.search(r"```text\nUserWarning: (.*?); \.\.\.\n```", quoted, re.S).group(1)
  assert " ".join(quoted.split()) in printed


def test_overlap_phase_example_under_shard_map_sends_what_the_text_says():
  """The overlap guide's step with a static phase inside ``jax.shard_map`` on 4 workers,
  bfloat16 parameters: one program per phase (and the first step's, whose
  ``nnx.Optimizer`` state changes its structure), the loss falls, and it sends the bytes
  it quotes."""
  page = page_text("docs/guides/overlap.md")
  (code,) = [b for b in python_blocks(page) if "jax.shard_map" in b]
  check = "\nprint('programs', train_step._cache_size())\n"
  lines = run(code + check).splitlines()
  first, last = (re.search(r"loss ([\d.]+), sent ([\d,]+) bytes", x) for x in lines[:2])
  assert float(last.group(1)) < float(first.group(1)) / 4 and lines[2] == "programs 3"
  assert (first.group(2), last.group(2)) == ("256", "1,648")  # 256 + 3 x (2 x 136 + 4 x 48)
  assert "`step 31: loss 0.377, sent 1,648 bytes per worker`" in page


def test_accelerators_example_compiles_its_local_steps_without_the_round():
  stdout = run(guide_code("accelerators"))
  assert "local steps: 27 of 32, loss 0.406" in stdout
  assert "It prints `local steps: 27 of 32, loss 0.406`" in page_text("docs/guides/accelerators.md")


def test_resume_on_another_number_of_workers_example_synchronises_the_new_workers():
  code = python_blocks(page_text("docs/guides/checkpoints.md"))[2]
  assert "remap_workers(params8, state8, 4, sync_every=K)" in code
  assert "on 4 workers at step 12: agree True" in run(code)
  assert "It prints `on 4 workers at step 12: agree True`" in page_text(
    "docs/guides/checkpoints.md"
  )
