"""``benchmarks/elastic/elastic.py --quick``: every row trained once, its report from its runs.

The tiny LM at 16 steps (2 rounds) on 8 simulated devices: uninterrupted on 8 workers,
and killed after round 1 on 8 and resumed on 4 for round 2. The full study's other rows
(uninterrupted on 4 and 16, resumed on 16) take the same code paths and are left out of
the quick mode (the full study's rows are checked from ``rows``). The row with a quarter
of the workers away is checked for what it asks of ``train`` (its spec, the absent
workers and rounds) and for its cached run, with ``train`` replaced: the training with
workers away, a program of its own, and a resume on more workers than were saved are
checked in ``tests/integration/test_lm_elastic.py``.
The report's means and differences are recomputed from the cached runs, and a second
run with ``--cached`` (in this process) trains nothing and reports the same.
"""

import json
import math
import types

import pytest
from test_benchmarks_quality import BENCHMARKS
from test_benchmarks_quality import run

pytestmark = pytest.mark.timeout(600)

ROWS = ["8 workers", "8 -> 4 after round 1"]
FULL_ROWS = [
  "8 workers", "4 workers", "16 workers", "8 -> 4 after round 32", "8 -> 16 after round 32",
  "8, a quarter away rounds 25-32",
]  # fmt: skip


@pytest.fixture(scope="module")
def out(tmp_path_factory):
  out = tmp_path_factory.mktemp("elastic")
  run(str(BENCHMARKS / "elastic" / "elastic.py"), "--quick", "--out", str(out), timeout=540)
  return out


def test_every_row_trained_and_its_report_is_its_runs(out):
  report = json.loads((out / "elastic.json").read_text())
  rows = {r["row"]: r for r in report["rows"]}
  assert list(rows) == ROWS
  cached = {}
  for path in (out / "runs" / "elastic").glob("*.json"):
    record = json.loads(path.read_text())
    cached[record["row"]] = record["final_val_loss"]
  assert set(cached) == set(ROWS)
  for name, row in rows.items():
    assert row["seeds"] == 1 and row["losses"] == [cached[name]]
    assert math.isfinite(row["mean"]) and row["mean"] < math.log(256)
    assert row["vs_8_workers"] == pytest.approx(row["mean"] / rows["8 workers"]["mean"] - 1)
  # A resumed run's loss is its own, not the 8 workers' it started from.
  assert rows["8 -> 4 after round 1"]["mean"] != rows["8 workers"]["mean"]
  assert "| 8 -> 4 after round 1 | 1 |" in (out / "elastic.md").read_text()
  assert "8 simulated CPU devices" in (out / "elastic.md").read_text()


def test_the_full_study_keeps_every_row():
  """The quick mode leaves out four rows; the full study (64 rounds) has them."""
  from benchmarks.elastic import elastic

  full = elastic.rows(elastic.STEPS // 16)
  assert [row.name for row in full] == FULL_ROWS
  assert [row.workers for row in full] == [8, 4, 16, 4, 16, 8]
  assert [row.name for row in elastic.rows(2, quick=True)] == ROWS


def test_the_away_row_asks_train_for_its_workers_away(tmp_path, monkeypatch):
  """Workers 6 and 7 of 8 away for round 1 of 2, the rest as the other rows; its loss
  cached under the row's name. ``train`` replaced: it records what it is asked."""
  from benchmarks.elastic import elastic
  from benchmarks.quality import quality

  asked = []

  def train(run, **changes):
    asked.append((run, changes))
    return types.SimpleNamespace(final_val_loss=2.5)

  monkeypatch.setattr(elastic, "train", train)
  (away,) = [row for row in elastic.rows(2) if row.away]
  assert away.name == "8, a quarter away rounds 1-1"
  args = (quality.QUICK, elastic.QUICK_STEPS, 1e-2, 0, tmp_path)
  assert elastic.trained(away, *args, killed=tmp_path / "killed") == 2.5
  ((run, changes),) = asked
  assert changes == {"absent": ((6, 1, 1), (7, 1, 1))}
  assert run == elastic.spec(quality.QUICK, elastic.QUICK_STEPS, 1e-2, 0, 8)
  assert run.num_workers == 8 and run.steps == 16 and run.variant.name == "lordo"
  (cached,) = (tmp_path / "runs" / "elastic").glob("*.json")
  assert json.loads(cached.read_text())["row"] == away.name
  assert elastic.trained(away, *args, killed=None) == 2.5  # read back, not trained
  assert len(asked) == 1


def test_cached_trains_nothing(out, monkeypatch):
  """``--cached`` in this process (``main``), its ``train`` replaced by a refusal."""
  from benchmarks.elastic import elastic

  def train(*args, **changes):
    raise AssertionError("--cached trained a run")

  before = (out / "elastic.json").read_text()
  monkeypatch.setattr(elastic, "train", train)
  assert elastic.main(["--quick", "--cached", "--out", str(out)]) == 0
  after = json.loads((out / "elastic.json").read_text())
  assert after["rows"] == json.loads(before)["rows"]
