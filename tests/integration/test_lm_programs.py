"""The example LM's compiled programs, shared by ``train`` calls only where none can differ.

``examples/lm/train.py`` keeps a run's programs (``make_programs``) for the next call whose
config differs only in ``RUN_ONLY_FIELDS`` (seed, evaluation, checkpoints, resuming, the
warm start's step and moments). A setting any program reads must give other programs, and
a call that takes an earlier call's programs must train exactly as one that builds its own.
"""

import dataclasses

import pytest

from tests.helpers import lm_example
from tests.helpers.lm_example import PRESET
from tests.helpers.lm_example import train

pytestmark = pytest.mark.timeout(600, method="thread")

M = 2  # Workers (4 devices each).
CONFIG = lm_example.short_run(M, steps=4, sync_every=2, eval_every=4)
# A value other than the default for each field no program reads.
RUN_ONLY = {
  "seed": 1, "eval_every": 2, "eval_windows": 4, "checkpoint_dir": "elsewhere",
  "checkpoint_every": 2, "resume": True, "stop_after": 2, "warm_start_step": 1,
  "warm_start_moments": "reset", "resume_mid_round": "restart",
}  # fmt: skip
# Settings a program reads: the schedule, the optimizer, the mesh.
PROGRAM = {"learning_rate": 3e-3, "steps": 6, "rank": 2, "sync_every": 4, "num_workers": 4}


def test_only_the_fields_no_program_reads_share_programs():
  assert set(RUN_ONLY) == set(train.RUN_ONLY_FIELDS)
  programs = train.make_programs("lordo", CONFIG, PRESET)
  for name, value in RUN_ONLY.items():
    changed = dataclasses.replace(CONFIG, **{name: value})
    assert train.make_programs("lordo", changed, PRESET) is programs, name
  for name, value in PROGRAM.items():
    changed = dataclasses.replace(CONFIG, **{name: value})
    assert train.make_programs("lordo", changed, PRESET) is not programs, name
  assert train.make_programs("diloco", CONFIG, PRESET) is not programs


def test_a_call_on_an_earlier_calls_programs_trains_as_one_that_builds_its_own():
  dataset = lm_example.dataset(M)
  first = train.train("lordo", CONFIG, PRESET, dataset, progress=False)
  other = dataclasses.replace(CONFIG, seed=1)
  programs = train.make_programs("lordo", other, PRESET)
  shared = train.train("lordo", other, PRESET, dataset, progress=False)
  assert train.make_programs("lordo", other, PRESET) is programs  # still the seed-0 run's
  train._programs.cache_clear()
  fresh = train.train("lordo", other, PRESET, dataset, progress=False)
  assert train.make_programs("lordo", other, PRESET) is not programs  # built anew
  assert shared.train_loss != first.train_loss  # the seed is the run's own
  assert shared.train_loss == fresh.train_loss
  assert shared.evals == fresh.evals
  assert shared.communicated_bytes == fresh.communicated_bytes > 0
