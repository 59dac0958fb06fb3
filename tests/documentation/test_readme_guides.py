"""What the guides' examples do beyond what they print (``test_doc_pages.py`` runs every
page and reads its output): the overlap guide's steps are given the phases the text says
and compile one program per phase, the attention recipe warns as quoted without its
labels and not with them, and the multi-host guide names the launcher's real options.
"""

import re

import pytest

from tests.helpers.readme_examples import ROOT
from tests.helpers.readme_examples import page_text
from tests.helpers.readme_examples import python_blocks
from tests.helpers.readme_examples import run
from tests.helpers.readme_examples import section

pytestmark = pytest.mark.timeout(180, method="thread")


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


# Counts the phases the overlap guide's one-worker step is given.
_COUNT_PHASES = """
import lordo_jax

phases, phase_of = [], lordo_jax.overlap_phase
lordo_jax.overlap_phase = lambda *a, **k: phases.append(phase_of(*a, **k)) or phases[-1]
"""


def test_overlap_phase_example_learns_with_its_phases():
  code = python_blocks(page_text("docs/guides/overlap.md"))[1]
  check = "\nprint(phases.count('send'), float(loss_fn(model, batches[0])) < first / 2)\n"
  # 40 steps, K = 16, tau = 2: the steps numbered 16, 17, 32 and 33 send a chunk.
  assert run(_COUNT_PHASES + code + check).split()[-2:] == ["4", "True"]


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
  bfloat16 parameters: one program per phase (the state stacked as the step returns it),
  the loss falls, and it sends the bytes it quotes."""
  page = page_text("docs/guides/overlap.md")
  (code,) = [b for b in python_blocks(page) if "jax.shard_map" in b]
  check = "\nprint('programs', train_step._cache_size())\n"
  lines = run(code + check).splitlines()
  first, last = (re.search(r"loss ([\d.]+), sent ([\d,]+) bytes", x) for x in lines[:2])
  assert float(last.group(1)) < float(first.group(1)) / 4 and lines[2] == "programs 2"
  assert (first.group(2), last.group(2)) == ("256", "1,648")  # 256 + 3 x (2 x 136 + 4 x 48)
  assert "`step 31: loss 0.377, sent 1,648 bytes per worker`" in page
