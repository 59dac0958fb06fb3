"""``benchmarks/elastic/elastic.py --quick``: every row trained once, its report from its runs.

The tiny LM at 16 steps (2 rounds): uninterrupted on 8, 4 and 16 workers, killed after
round 1 on 8 and resumed on 4 and on 16 for round 2, and a quarter of the workers away
for round 1 and back for round 2.
The report's means and differences are recomputed from the cached runs, and a second
run with ``--cached`` trains nothing and reports the same.
"""

import json
import math
import time

import pytest
from test_benchmarks_quality import BENCHMARKS
from test_benchmarks_quality import run

pytestmark = pytest.mark.timeout(600)

ROWS = [
  "8 workers", "4 workers", "16 workers", "8 -> 4 after round 1", "8 -> 16 after round 1",
  "8, a quarter away rounds 1-1",
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
  assert "| 8 -> 16 after round 1 | 1 |" in (out / "elastic.md").read_text()


def test_cached_trains_nothing(out):
  before = (out / "elastic.json").read_text()
  tic = time.perf_counter()
  run(
    str(BENCHMARKS / "elastic" / "elastic.py"),
    "--quick",
    "--cached",
    "--out",
    str(out),
    timeout=120,
  )
  assert time.perf_counter() - tic < 60
  after = json.loads((out / "elastic.json").read_text())
  assert after["rows"] == json.loads(before)["rows"]
