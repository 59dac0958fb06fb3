"""The step-speed, step-overhead and memory studies, in quick mode, in a subprocess.

Each script runs as a user runs it (``python benchmarks/<topic>/<name>.py --quick``, with
``--out`` a temporary folder so the committed results stay as they are). The checks
read its JSON and markdown: every time and size is positive, every ratio and every
amortised time is what the JSON's own medians give, every goal flag agrees with its
ratio, and the memory study's numbers match MATH.md §8. No timing threshold: a
benchmark on a shared machine is not a timed test.
"""

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FLOAT32 = 4

pytestmark = pytest.mark.timeout(900)


def quick_run(name: str, out: pathlib.Path) -> dict:
  """Runs ``benchmarks/<topic>/<name>.py --quick --out out``: its JSON; checks its markdown."""
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
  (script,) = (ROOT / "benchmarks").glob(f"*/{name}.py")
  done = subprocess.run(
    [sys.executable, str(script), "--quick", "--out", str(out)],
    capture_output=True,
    text=True,
    env=env,
    cwd=ROOT,
    timeout=600,
  )
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
  record = json.loads((out / f"{name}.json").read_text())
  markdown = (out / f"{name}.md").read_text()
  assert record["study"] == name and record["quick"] is True
  assert f"python {script.relative_to(ROOT)} --quick --out " in record["command"]
  assert f"`{record['command']}`" in markdown and record["machine"]["cpu"] in markdown
  assert record["machine"]["cores"] >= 1 and record["machine"]["jax"] in markdown
  assert record["date"][:10] in markdown
  table = [line for line in markdown.splitlines() if line.startswith("|")]
  assert len(table) >= 3 and set(table[1]) <= set("|-: ")
  assert all(line.count("|") == table[0].count("|") for line in table[:3])
  assert all(note in markdown for note in record["notes"])
  assert done.stdout.strip().endswith(markdown.strip().splitlines()[-1])
  return record


def close(a: float, b: float) -> bool:
  return math.isclose(a, b, rel_tol=1e-9)


def amortised(local: float, sync: float, period: int) -> float:
  return ((period - 1) * local + sync) / period


def test_step_speed(tmp_path):
  record = quick_run("step_speed", tmp_path)
  k = record["settings"]["sync_every"]
  rows = record["rows"]
  assert len(rows) == len(record["settings"]["methods"]) >= 3
  for row in rows:
    ms, ratios = row["ms"], row["ratios"]
    assert all(v > 0 for v in ms.values()), row
    assert close(ms["floor"], ms["adamw"] + ms["products"])
    assert close(ms["lordo_amortised"], amortised(ms["lordo_local"], ms["lordo_sync"], k))
    assert close(ms["galore_amortised"], amortised(ms["galore_local"], ms["galore_refresh"], k))
    assert close(ratios["amortised_vs_floor"], ms["lordo_amortised"] / ms["floor"])
    assert close(ratios["amortised_vs_galore"], ms["lordo_amortised"] / ms["galore_amortised"])
    assert close(ratios["local_vs_floor"], ms["lordo_local"] / ms["floor"])
    assert close(ratios["local_vs_galore_local"], ms["lordo_local"] / ms["galore_local"])
    assert close(ratios["amortised_vs_adamw"], ms["lordo_amortised"] / ms["adamw"])
    goal = record["settings"]["goal_floor_ratio"]
    assert row["goals"]["within_1.2x_of_floor"] == (ratios["amortised_vs_floor"] <= goal)
    assert row["goals"]["no_slower_than_galore"] == (ratios["amortised_vs_galore"] <= 1)
    repeats = record["settings"]["repeats"]
    assert row["samples"] == {"lordo_local": (k - 1) * repeats, "lordo_sync": repeats}


def test_step_overhead(tmp_path):
  record = quick_run("step_overhead", tmp_path)
  k = record["settings"]["sync_every"]
  rows = record["rows"]
  assert {r["method"] for r in rows} == set(record["settings"]["methods"]) >= {"ddp", "lordo"}
  for row in rows:
    ms = row["ms"]
    assert all(v > 0 for v in ms.values()) and row["ddp_ms"] > 0
    assert close(ms["amortised"], amortised(ms["local"], ms["sync"], k))
    assert all(close(row["vs_ddp"][key], ms[key] / row["ddp_ms"]) for key in ms)
  (ddp,) = [r for r in rows if r["method"] == "ddp"]
  assert close(ddp["ms"]["local"], ddp["ddp_ms"]) and close(ddp["vs_ddp"]["amortised"], 1.0)
  (lordo,) = [r for r in rows if r["method"] == "lordo"]
  assert lordo["samples"] == {"local": (k - 1) * record["settings"]["repeats"]} | {
    "sync": record["settings"]["repeats"]
  }


def test_memory(tmp_path):
  record = quick_run("memory", tmp_path)
  rows = {r["method"]: r for r in record["rows"]}
  adamw = rows["DDP (AdamW)"]
  parameters = 124_439_808  # GPT-2 small, float32.
  assert adamw["whole"]["host"] == 0
  assert 0 <= adamw["whole"]["device"] - 2 * FLOAT32 * parameters < 1000
  lordo = rows["**LoRDO**"]
  assert lordo["whole"]["host"] == FLOAT32 * parameters  # the anchor
  assert lordo["whole"]["device"] < adamw["whole"]["device"] / 2
  assert rows["LoRDO, dct"]["whole"]["device"] < lordo["whole"]["device"]
  assert rows["DiLoCo"]["whole"]["host"] == 2 * FLOAT32 * parameters  # anchor + momentum
  for check in record["formula_checks"] + record["ranks"]:
    measured, formula = check["measured"], check["formula"]
    assert measured["host"] == formula["host"]
    assert 0 <= measured["device"] - formula["device"] < 1000
  for row in record["rows"]:
    for part in ("whole", "blocks"):
      assert row[part]["device"] > 0 and row[part]["host"] >= 0
