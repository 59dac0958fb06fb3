"""benchmarks/speed/device_speed.py in quick mode, in a subprocess, on two CPU devices.

The script runs as a user runs it (``python benchmarks/speed/device_speed.py --quick``, with
``--out`` a temporary folder), with two devices present (it uses the first). The checks
read its JSON and markdown: every expected row is there (AdamW, GaLore and LoRDO in both
dtypes; DDP, low-rank DDP and LoRDO on the LM, the refresh of both quick projections and
LoRDO's round-phase rows in float32), every time is positive and finite, the amortised
times and the ratios are what the JSON's own medians give, LoRDO synced once per round,
the offloaded anchor left the device for the host, and the bfloat16 states differ from
the float32 ones by exactly the parameters' copies (the LM's read from their shapes);
and run_all.py runs it. No timing threshold: a benchmark on a shared machine is not a
timed test.
"""

import json
import math
import os
import pathlib
import subprocess
import sys

import jax
import pytest

from lordo_jax.methods import lordo as lordo_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import run_all  # noqa: E402
from benchmarks.speed import device_speed  # noqa: E402

FLOAT32, BFLOAT16 = 4, 2
DTYPES = ("float32", "bfloat16")
SECTIONS = ("optimizer", "lm")
# The offloaded row is LoRDO at its default (one-sided) projection.
DEFAULT = lordo_lib.with_projection({})["projection"]

pytestmark = [pytest.mark.timeout(600), pytest.mark.no_compilation_cache]


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> tuple[dict, str]:
  """(JSON, markdown) of one quick run."""
  out = tmp_path_factory.mktemp("device_speed")
  env = dict(
    os.environ,
    PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    JAX_NUM_CPU_DEVICES="2",
  )
  done = subprocess.run(
    [
      sys.executable,
      str(ROOT / "benchmarks" / "speed" / "device_speed.py"),
      "--quick",
      "--out",
      str(out),
    ],
    capture_output=True,
    text=True,
    env=env,
    cwd=ROOT,
    timeout=500,
  )
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
  markdown = (out / "device_speed_cpu.md").read_text()
  assert done.stdout.strip().endswith(markdown.strip().splitlines()[-1])
  return json.loads((out / "device_speed_cpu.json").read_text()), markdown


def close(a: float, b: float) -> bool:
  return math.isclose(a, b, rel_tol=1e-9)


def by_key(record: dict) -> dict[tuple, dict]:
  """(section, dtype, method, projection, offload) -> row."""
  rows = record["rows"]
  keys = [(r["section"], r["dtype"], r["method"], r["projection"], r["offload"]) for r in rows]
  assert len(set(keys)) == len(keys)
  return dict(zip(keys, rows, strict=True))


def test_every_row_is_there(result):
  record, _ = result
  projections = list(device_speed.QUICK_PROJECTIONS)  # Quick mode's; every one in full.
  assert record["settings"]["projections"] == projections
  lordo = record["settings"]["lordo_projections"]  # Quick mode's LoRDO rows: the first.
  assert lordo == projections[:1] == [DEFAULT]
  assert record["device"]["visible"] == 2 and "pinned_host" in record["device"]["memories"]
  expected = set()
  for dtype in DTYPES:
    expected |= {("optimizer", dtype, "adamw", None, False)}
    expected |= {("optimizer", dtype, "galore", None, False)}
    expected |= {("optimizer", dtype, "lordo", p, False) for p in lordo}
    expected |= {("optimizer", dtype, "lordo", DEFAULT, True)}
  # The refresh and the LM in the first dtype only, in quick mode.
  first = DTYPES[0]
  expected |= {("refresh", first, "refresh", p, False) for p in projections}
  expected |= {("lm", first, "ddp", None, False), ("lm", first, "low_rank_ddp", None, False)}
  expected |= {("lm", first, "lordo", p, False) for p in lordo}
  # The round-phase rows in the first dtype only, in quick mode.
  expected |= {(section, DTYPES[0], device_speed.PHASED, DEFAULT, False) for section in SECTIONS}
  assert set(by_key(record)) == expected


def test_times_amortised_and_ratios(result):
  record, _ = result
  rows = by_key(record)
  k, repeats = record["settings"]["sync_every"], record["settings"]["repeats"]
  for (section, dtype, method, _, _), row in rows.items():
    ms = row["ms"]
    assert all(math.isfinite(v) and v > 0 for v in ms.values()), row
    assert close(ms["amortised"], ((k - 1) * ms["local"] + ms["sync"]) / k)
    assert close(row["sync_over_local"], ms["sync"] / ms["local"])
    if section == "refresh":  # One refresh per round, against the first projection's.
      first = rows[section, dtype, "refresh", device_speed.QUICK_PROJECTIONS[0], False]
      assert close(row["vs_baseline"]["local"], ms["local"] / first["ms"]["local"])
      assert row["samples"] == {"local": repeats} and row["syncs"] is None and row["finite"]
      continue
    baseline = rows[section, dtype, row["baseline"], None, False]
    assert row["baseline"] == {"optimizer": "adamw", "lm": "ddp"}[section]
    assert close(row["baseline_ms"], baseline["ms"]["local"])
    assert all(close(row["vs_baseline"][key], ms[key] / row["baseline_ms"]) for key in ms)
    if method in ("adamw", "ddp"):
      assert row["samples"] == {"local": k * repeats} and ms["sync"] == ms["local"]
    else:  # One sync (or refresh) step per timed round.
      assert row["samples"] == {"local": (k - 1) * repeats, "sync": repeats}
    # LoRDO's state counted a sync at the end of every round, the warm-up's included.
    lordo = method in ("lordo", device_speed.PHASED)
    assert row["syncs"] == (repeats + 1 if lordo else None)
    assert row["finite"], row


def test_the_refresh_factorizes_every_shape_group_at_once(result):
  """Read from each compiled refresh: subspace iteration's 2 iterations x 4 Cholesky-QR
  passes are 8 Cholesky calls (and 8 solves) for all the shape groups together, its
  Householder fallback one QR per group and iteration; the SVD one call per group."""
  record, markdown = result
  rows = by_key(record)
  shapes = device_speed.block_matrices(device_speed.QUICK["shapes"]).values()
  groups = len({tuple(x.shape) for x in shapes})
  assert groups == 4  # GPT-2's four matrix shapes, at the quick size.
  # The CPU of jaxlib before 0.12 loops over a batch's matrices: there each group keeps
  # its own call per pass.
  looped = jax.__version_info__ < (0, 12)
  calls = 8 * (groups if looped else 1)
  for dtype in DTYPES[:1]:  # Quick mode's refresh: in the first dtype.
    iterated = rows["refresh", dtype, "refresh", "subspace_iteration", False]["solver_calls"]
    assert iterated == {
      "cholesky": calls,
      "triangular_solve": calls,
      "qr": 2 * groups,
      "svd": 0,
      "eigh": 0,
    }
    exact = rows["refresh", dtype, "refresh", "svd", False]["solver_calls"]
    assert exact == {"cholesky": 0, "triangular_solve": 0, "qr": 0, "svd": groups, "eigh": 0}
  assert f"{calls} cholesky, {calls} triangular_solve, {2 * groups} qr" in markdown
  assert all(row["solver_calls"] is None for row in record["rows"] if row["section"] != "refresh")


def test_offload_moves_the_anchor_to_the_host(result):
  record, _ = result
  rows = by_key(record)
  for dtype in DTYPES:
    offloaded = rows["optimizer", dtype, "lordo", DEFAULT, True]["state_bytes"]
    kept = rows["optimizer", dtype, "lordo", DEFAULT, False]["state_bytes"]
    assert offloaded["host"] > 0 and offloaded["device"] < kept["device"] and kept["host"] == 0
    assert offloaded["device"] + offloaded["host"] == kept["device"]


def test_bfloat16_halves_the_parameters_copies_only(result):
  """lordo_jax keeps moments and bases in float32 whatever the parameters' dtype, and
  its anchor in the parameters' dtype; optax.adamw keeps its moments in the latter. The
  LM's optimizers (quick mode measures the LM in float32 only) from their states' shapes,
  built as its steps build them."""
  record, _ = result
  rows = by_key(record)
  params, lm_params = record["settings"]["optimizer_params"], record["settings"]["lm_params"]

  def state(section, method, projection=None, offload=False) -> list[dict]:
    """The float32 and the bfloat16 row's state bytes."""
    return [rows[section, d, method, projection, offload]["state_bytes"] for d in DTYPES]

  f32, bf16 = state("optimizer", "lordo", DEFAULT, offload=True)
  assert (f32["host"], bf16["host"]) == (FLOAT32 * params, BFLOAT16 * params)  # The anchor.
  assert f32["device"] == bf16["device"]  # Moments and bases in float32, int32 counters.
  for projection in record["settings"]["lordo_projections"]:
    f32, bf16 = state("optimizer", "lordo", projection)
    assert f32["device"] - bf16["device"] == (FLOAT32 - BFLOAT16) * params
  f32, bf16 = state("optimizer", "adamw")  # Two moments in the parameters' dtype, a count.
  assert 0 < f32["device"] - 2 * FLOAT32 * params < 100
  assert 0 < bf16["device"] - 2 * BFLOAT16 * params < 100
  config = device_speed.lm_config(record["settings"]["lm"])
  period = record["settings"]["sync_every"]
  for method in ("ddp", "low_rank_ddp", "lordo"):
    tx = device_speed.lm_optimizer(method, None, config, period)
    f32, bf16 = (lm_state_bytes(tx, config, dtype) for dtype in DTYPES)
    assert f32 - bf16 == ((FLOAT32 - BFLOAT16) * lm_params if method == "lordo" else 0)


def lm_state_bytes(tx, config, dtype: str) -> int:
  """The bytes of ``tx``'s state for the LM's parameters in ``dtype`` (shapes only)."""
  model = device_speed.model  # examples/lm's, as the benchmark imports it
  params = jax.eval_shape(lambda: model.cast(model.init(config, seed=0)[1], dtype))
  state = jax.eval_shape(tx.init, params)
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state))


def test_compiled_memory(result):
  record, _ = result
  for row in record["rows"]:
    memory = row["compiled_memory"]
    assert memory is not None, row  # jaxlib's CPU client analyses its programs.
    expected = memory["argument"] + memory["output"] + memory["temp"] - memory["alias"]
    assert memory["peak"] == expected > 0
  assert all(block["process_peak_bytes"] is None for block in record["blocks"])  # CPU


def test_markdown_names_the_device_and_every_row(result):
  record, markdown = result
  device = record["device"]
  assert record["study"] == "device_speed_cpu" and record["quick"] is True and record["complete"]
  assert record["command"].startswith("python benchmarks/speed/device_speed.py --quick ")
  assert f"`{record['command']}`" in markdown
  assert f"Device: **{device['kind']}** ({device['platform']};" in markdown
  assert f"jax {record['machine']['jax']}" in markdown and record["measured_on"] in markdown
  assert all(note in markdown for note in record["notes"])
  table = [line for line in markdown.splitlines() if line.startswith("|")]
  assert len(table) == len(record["rows"]) + 2 * len(record["settings"]["sections"])
  for row in record["rows"]:
    name = row["method"] + (f" {row['projection']}" if row["projection"] else "")
    name += " + offload" if row["offload"] else ""
    name = row["projection"] if row["section"] == "refresh" else name
    assert f"| {row['dtype']} | {name} | " in markdown


def test_run_all_runs_it_quickly(tmp_path):
  assert "device_speed" in run_all.STUDIES
  line = run_all.command("device_speed", True, tmp_path, default_out=False)
  assert line[-3:] == ["--quick", "--out", str(tmp_path)]
