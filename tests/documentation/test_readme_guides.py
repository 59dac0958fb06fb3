"""The README's guides tell the truth: each section's Python example runs and says so.

The sections "Checkpoints and restarts", "Surviving a failed worker" and "bfloat16"
each carry one complete program; each runs in its own interpreter (the second sets
up its own simulated devices) and must print what the text around it promises.
"""

import re

import pytest
from readme_examples import README
from readme_examples import ROOT
from readme_examples import python_blocks
from readme_examples import run
from readme_examples import section

pytestmark = pytest.mark.timeout(180, method="thread")


def section_code(title: str) -> str:
  """The first Python block of the README section ``## title``."""
  return python_blocks(section(f"{title}\n"))[0]


def test_checkpoint_example_resumes_bit_identically():
  assert "resumed at step 6: bit-identical True" in run(section_code("Checkpoints and restarts"))


def test_failed_worker_example_prints_what_the_text_says():
  stdout = run(section_code("Surviving a failed worker"))
  assert "finite: True, workers agree: True" in stdout
  assert "left out: 2, syncs with nobody: 0" in stdout
  assert (
    "It prints `finite: True, workers agree: True` and `left out: 2, syncs with nobody: 0`"
    in (README)
  )


def test_bfloat16_example_keeps_params_bf16_and_bases_f32():
  stdout = run(section_code("bfloat16"))
  assert "params: {'bfloat16'}" in stdout
  assert "bases: {'float32'}" in stdout


def test_multi_host_section_names_the_launcher_and_its_options():
  body = section("Multi-host: GPU clusters and TPU pods\n")
  command = re.search(r"python examples/launch_multiprocess.py (.*)\n", body).group(1)
  launcher = (ROOT / "examples" / "launch_multiprocess.py").read_text()
  for option in re.findall(r"--[a-z-]+", command):
    assert f'"{option}"' in launcher, option
  for option in ("--coordinator", "--num-processes", "--process-id"):
    assert (
      option in body and f'"{option}"' in (ROOT / "examples" / "multiprocess_job.py").read_text()
    )
  assert "Multi-host" in launcher  # the launcher's docstring points here
