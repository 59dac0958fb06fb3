"""What the guides' examples do beyond what they print (``test_doc_pages.py`` runs every
page and reads its output): the attention recipe warns as quoted without its labels, and
the multi-host guide names the launcher's real options.
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


def test_the_attention_recipe_without_its_labels_warns_as_quoted():
  """The Flax guide's ``nnx.MultiHeadAttention`` recipe without its labels: the warning
  the guide quotes comes when the optimizer is built (with them, none comes:
  ``test_doc_pages.py``)."""
  page = page_text("docs/guides/flax.md")
  (code,) = [b for b in python_blocks(page) if "MultiHeadAttention" in b]
  shown = "import warnings\nwarnings.showwarning = lambda m, *a, **k: print('WARNING', m)\n"
  unlabelled = code.split("for t in range")[0].replace(", low_rank_labels=low_rank_labels", "")
  assert "low_rank_labels=" not in unlabelled and "nnx.Optimizer(" in unlabelled
  printed = " ".join(run(shown + unlabelled).split())
  quoted = section("Attention kernels as matrices", page="docs/guides/flax.md")
  quoted = re.search(r"```text\nUserWarning: (.*?); \.\.\.\n```", quoted, re.S).group(1)
  assert " ".join(quoted.split()) in printed
