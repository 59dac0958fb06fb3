"""benchmarks/communication/accelerator_model.py: FLOPs, ledger bytes, utilisation, validation.

The FLOP formula against a hand count of every matmul of a tiny transformer; the
counters-only ledger against real optimizer steps (bytes and all-reduce calls) and
against MATH.md §7 on GPT-2 small; the model against the Streaming DiLoCo paper's
table 4; utilisation rising with bandwidth; the 90% / 95% bandwidths solving
``U(W) = u``; overlapped synchronisation (MATH.md §9): its profile's bytes, a whole
round in flight hidden where one sync step is not, and the overlapped rows of the
Streaming DiLoCo and eager-updates papers; the quick report, run as a user runs it,
and the table it writes for ``examples/main.py`` against the one shipped there.
"""

import json
import math
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lordo_jax

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import run_all  # noqa: E402
from benchmarks.communication import accelerator_model as am  # noqa: E402
from benchmarks.communication import communication_table  # noqa: E402

FLOAT32 = 4
TINY = am.Config("tiny", n_layer=2, d_model=8, n_head=2, vocab=11, context=5)

pytestmark = pytest.mark.timeout(1800)


def test_flops_per_token_is_a_hand_count_of_every_matmul():
  L, d, V, T = TINY.n_layer, TINY.d_model, TINY.vocab, TINY.context
  # Forward, per token: y = x W costs 2 x (rows of W) x (columns of W).
  per_layer = {
    "c_attn": 2 * d * 3 * d,
    "attn.c_proj": 2 * d * d,
    "mlp.c_fc": 2 * d * 4 * d,
    "mlp.c_proj": 2 * 4 * d * d,
    "q k^T": 2 * T * d,  # T scores of d/heads products per head, all heads.
    "a v": 2 * T * d,
  }
  forward = L * sum(per_layer.values()) + 2 * d * V  # + the tied output layer.
  weights = L * (3 * d * d + d * d + 4 * d * d + 4 * d * d) + V * d
  assert am.flops_per_token(weights, L, T, d) == 3 * forward  # backward = 2 x forward.
  # N of the report: every parameter but the position embeddings; the rest of the
  # difference from the weight matrices is biases and norms.
  biases_norms = L * (3 * d + d + 4 * d + d + 4 * d) + 2 * d
  assert am.n_params(TINY) == weights + T * d + biases_norms
  assert am.matmul_params(TINY) == weights + biases_norms


def test_gpt2_sizes_and_step_time():
  assert am.param_shapes(am.GPT2_SMALL) == communication_table.gpt2_small_shapes()
  assert [am.n_params(c) for c in am.CONFIGS] == [124_439_808, 354_823_168, 774_030_080]
  n = am.matmul_params(am.GPT2_SMALL)
  expected = 64 * 1024 * (6 * n + 12 * 12 * 1024 * 768) / (989e12 * 0.4)
  assert math.isclose(am.step_seconds(am.GPT2_SMALL), expected, rel_tol=1e-12)
  assert am.step_seconds(am.GPT2_SMALL, mfu=0.2) == pytest.approx(2 * expected)
  assert am.WORKERS * am.TOKENS_PER_STEP == 2**19  # GPT-3's 0.5M-token batch.


def _random_grads(params, steps):
  """Random gradients shaped like ``params``, one tree per step (step ``t`` from key ``t``)."""
  found = []
  for t in range(steps):
    keys = jax.random.split(jax.random.key(t), len(jax.tree.leaves(params)))
    found.append(
      jax.tree.unflatten(
        jax.tree.structure(params),
        [jax.random.normal(k, x.shape) for k, x in zip(keys, jax.tree.leaves(params), strict=True)],
      )
    )
  return found


def _full_steps(tx, params, grads):
  """(bytes, all-reduce calls) after each real step on each of ``grads``."""

  def body(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  step = communication_table.one_worker_program(body)
  state, sent = tx.init(params), []
  for g in grads:
    params, state = jax.block_until_ready(step(params, state, g))
    sent.append((lordo_jax.communicated_bytes(state), lordo_jax.all_reduce_count(state)))
  return sent


def test_counters_only_ledger_equals_real_steps():
  """Bytes and calls of every method, every step, as real updates record them (DES-LOC's
  moment averages included: they follow the sync counter, an integer leaf)."""
  shapes = {"w": (24, 12), "v": (12, 20), "b": (12,)}
  params = {k: jnp.ones(s) * 0.1 for k, s in shapes.items()}
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
  found = am.methods(rank=4, labels=None)
  # DES-LOC: both moment averages; the others: two syncs.
  grads = _random_grads(params, max(period for period, _ in found.values()) + am.K + 1)
  for name, (period, tx) in found.items():
    steps = period + am.K + 1
    full = _full_steps(tx, params, grads[:steps])
    assert am.ledger_steps(tx, abstract, steps) == full, name
    assert full[-1][0] > 0, name
  desloc = am.ledger_profile(am.methods(4, None)["desloc"][1], abstract, 6 * am.K)
  size = FLOAT32 * sum(math.prod(s) for s in shapes.values())
  assert sum(desloc["bytes"]) == (6 + 2 + 1) * size  # params x6, first moment x2, second x1.


# One method for each way a ledger depends on the shapes: low-rank coordinates and the
# whole matrices at refreshes, the first gradient then a period of syncs, and moments
# sent on periods of their own.
EXTRAPOLATED = ("low_rank_ddp_projected", "lordo", "desloc")


def test_profiles_from_small_probes_equal_the_whole_model():
  """Every step of each method's second period: the 3-layer model's ledger with a
  vocabulary of 200, and the ledger extrapolated from its 1- and 2-layer versions with
  the probe vocabularies (64, 128)."""
  config = am.Config("small", n_layer=3, d_model=16, n_head=2, vocab=200, context=8)
  assert config.vocab not in am.PROBE_VOCABS
  direct = am.direct_profiles(config, rank=4, only=EXTRAPOLATED)
  assert am.profiles(config, rank=4, only=EXTRAPOLATED) == direct
  assert set(direct) == set(EXTRAPOLATED) and all(sum(p["bytes"]) > 0 for p in direct.values())


def test_gpt2_small_profiles_follow_spec_section_7():
  n = am.n_params(am.GPT2_SMALL) * FLOAT32
  # Each method's profile as bandwidth_for_utilisation measures (and caches) it.
  found = {m: am._gpt2_small_profile(m, 192) for m in ("ddp", "diloco", "local_adam", "desloc")}
  assert found["ddp"] == {"period": 1, "bytes": [n], "all_reduces": [1]}
  assert found["diloco"]["bytes"] == [0] * 15 + [n]
  assert found["local_adam"]["bytes"] == [0] * 15 + [3 * n]
  desloc = found["desloc"]["bytes"]
  assert [i + 1 for i, b in enumerate(desloc) if b] == [16, 32, 48, 64, 80, 96]
  assert sum(desloc) == 9 * n and desloc[47] == 2 * n and desloc[95] == 3 * n


def test_streaming_diloco_table_4_within_25_percent():
  check = am.streaming_diloco_check()
  assert abs(check["data_parallel_error"]) < 0.25 and abs(check["diloco_error"]) < 0.25
  # The closed form: 16 Gbit in (2/3) 0.1 s + the 5.26% of compute left to wait.
  slack = 0.1 * (1 / 0.95 - 1)
  assert check["data_parallel_gbit"] == pytest.approx(16 / (0.1 * 2 / 3 + slack), rel=1e-9)
  assert check["diloco_gbit"] == pytest.approx(16 / (0.1 * 2 / 3 + 100 * slack), rel=1e-9)


PROFILES = {
  "every step": am.sync_every_profile(4e8, 1),
  "every 16": am.sync_every_profile(5e8, 16),
  "mixed": {"period": 4, "bytes": [1e8, 0, 3e8, 2e7], "all_reduces": [1, 0, 2, 1]},
}


@pytest.mark.parametrize("name", PROFILES)
def test_utilisation_rises_with_bandwidth_to_one(name):
  profile, c = PROFILES[name], 0.14
  u = [am.utilisation(profile, c, g) for g in np.geomspace(0.01, 1e4, 60)]
  assert all(0 < x <= 1 for x in u)
  assert all(b >= a for a, b in zip(u, u[1:], strict=False)) and u[-1] > u[0]
  assert u[-1] == 1.0  # All communication hides under the backward pass.
  assert am.utilisation(profile, c, 1e4, overlap=0.0) < 1.0


@pytest.mark.parametrize("name", PROFILES)
@pytest.mark.parametrize("target", [0.5, 0.9, 0.95])
def test_bandwidth_for_solves_the_equation(name, target):
  profile, c = PROFILES[name], 0.14
  for network in ({}, {"overlap": 0.0}, {"workers": 2, "alpha": 0.0}):
    w = am.bandwidth_for(target, profile, c, **network)
    assert am.utilisation(profile, c, w, **network) == pytest.approx(target, rel=1e-9)
    assert am.utilisation(profile, c, w * (1 - 1e-6), **network) < target


OVERLAPPED = {
  "tau 1": am.overlapped_profile(5e8, 16, 1),
  "tau 4, lead f": am.overlapped_profile(5e8, 16, 4, lead=am.OVERLAP),
  "whole round": am.overlapped_profile(5e8, 16, 16),
  "fragments": am.overlapped_profile(5e8, 16, 2, lead=0.5, fragments=3),
  "fragments, no overlap": am.overlapped_profile(5e8, 16, 0, fragments=4),
}


@pytest.mark.parametrize(
  ("tau", "lead", "fragments"),
  [(0, 0.0, 1), (1, 0.0, 1), (5, 0.0, 1), (16, 0.0, 1), (3, 2 / 3, 1), (16, 2 / 3, 1)]
  + [(0, 0.0, 4), (1, 2 / 3, 8), (16, 0.0, 8), (7, 0.3, 5)],
)
def test_overlapped_profile_sends_the_synchronous_bytes_per_period(tau, lead, fragments):
  """The same bytes per period as the synchronous schedule, in a collective per chunk
  (and per lead share), each hidden under its whole step (the lead share under lead)."""
  nbytes, period = 3e8, 16
  profile = am.overlapped_profile(nbytes, period, tau, lead, fragments)
  synchronous = am.sync_every_profile(nbytes, period)
  assert profile["period"] == period and len(profile["bytes"]) == period
  assert sum(profile["bytes"]) == pytest.approx(sum(synchronous["bytes"]), rel=1e-12)
  assert sum(profile["all_reduces"]) == fragments * (max(tau, 1) + (lead > 0))
  busy = [h for h, a in zip(profile["hide"], profile["all_reduces"], strict=True) if a]
  if tau == 0:
    assert busy == [None] * fragments  # The network's f.
  else:
    assert set(busy) <= {1.0, lead}
  if fragments == 1 and tau == 0:
    assert {k: profile[k] for k in synchronous} == synchronous
  if fragments == 1 and tau == period and not lead:
    assert profile["bytes"] == [nbytes / period] * period  # A whole round in flight.
    assert profile["hide"] == [1.0] * period


def test_overlapped_profile_rejects_impossible_schedules():
  for args in [(1e8, 16, 17), (1e8, 16, -1), (1e8, 16, 0, 0.5), (1e8, 4, 1, 0.0, 5)]:
    with pytest.raises(ValueError):
      am.overlapped_profile(*args)


def test_a_whole_round_in_flight_hides_where_one_sync_step_does_not():
  """tau = H: each step's B / H hides under the whole step above W* (where U = 1, f = 0
  included); B in one sync step at W* takes H (C - alpha) + alpha, and waits all but f C
  of it, up to H / f times W*."""
  nbytes, period, c = 5e8, 16, 0.14
  overlapped = am.overlapped_profile(nbytes, period, period)
  synchronous = am.sync_every_profile(nbytes, period)
  threshold = am.ring_factor(am.WORKERS) * 8 * nbytes / period / (c - am.ALPHA_S) / 1e9
  assert am.bandwidth_for(1.0, overlapped, c) == pytest.approx(threshold, rel=1e-9)
  for gbit in (threshold * (1 + 1e-9), 2 * threshold, 10 * threshold):
    assert am.utilisation(overlapped, c, gbit) == 1.0
    assert am.utilisation(overlapped, c, gbit, overlap=0.0) == 1.0
    assert am.utilisation(synchronous, c, gbit) < 1.0
  assert am.utilisation(overlapped, c, 0.99 * threshold) < 1.0
  wait = am.period_seconds(synchronous, c, threshold) - period * c
  expected = period * (c - am.ALPHA_S) + am.ALPHA_S - am.OVERLAP * c
  assert wait == pytest.approx(expected, rel=1e-9)
  # The same bytes sent synchronously need H / f times the bandwidth (up to latency).
  ratio = am.bandwidth_for(1.0, synchronous, c) / threshold
  assert ratio == pytest.approx(period * (c - am.ALPHA_S) / (am.OVERLAP * c - am.ALPHA_S))


def test_profiles_without_hide_keep_the_overlap_f():
  """Every existing profile: no ``"hide"`` is h_s = f; the synchronous overlapped
  profile is the sync-every profile, to the last bit."""
  c = 0.14
  for name, profile in PROFILES.items():
    explicit = dict(profile, hide=[None] * len(profile["bytes"]))
    for gbit in (0.3, 3, 30, 300):
      for network in ({}, {"overlap": 0.0}, {"workers": 2, "alpha": 0.0}):
        found = am.period_seconds(profile, c, gbit, **network)
        assert am.period_seconds(explicit, c, gbit, **network) == found, name
  synchronous = am.overlapped_profile(5e8, 16, 0)
  for gbit in (0.3, 3, 30, 300):
    assert am.utilisation(synchronous, c, gbit) == am.utilisation(PROFILES["every 16"], c, gbit)


@pytest.mark.parametrize("name", OVERLAPPED)
def test_overlapped_utilisation_rises_with_bandwidth_to_one(name):
  profile, c = OVERLAPPED[name], 0.14
  u = [am.utilisation(profile, c, g) for g in np.geomspace(0.01, 1e4, 60)]
  assert all(0 < x <= 1 for x in u)
  assert all(b >= a for a, b in zip(u, u[1:], strict=False)) and u[-1] > u[0]
  assert u[-1] == 1.0
  for target in (0.5, 0.9, 0.95):
    w = am.bandwidth_for(target, profile, c)
    assert am.utilisation(profile, c, w) == pytest.approx(target, rel=1e-9)
    assert am.utilisation(profile, c, w * (1 - 1e-6)) < target


def test_overlapped_needs_less_bandwidth_the_longer_in_flight():
  """For each utilisation, tau = 1 .. H needs no more than the synchronous schedule, and
  less the larger tau (and with a lead)."""
  nbytes, period, c = 5e8, 16, 0.14
  for target in (0.5, 0.9, 0.95, 0.99):
    found = [am.bandwidth_for(target, am.sync_every_profile(nbytes, period), c)]
    found += [
      am.bandwidth_for(target, am.overlapped_profile(nbytes, period, tau), c)
      for tau in (1, 2, 4, 8, 16)
    ]
    assert all(b < a for a, b in zip(found, found[1:], strict=False)), target
    led = am.overlapped_profile(nbytes, period, 1, lead=am.OVERLAP)
    assert am.bandwidth_for(target, led, c) < found[1]


def test_streaming_diloco_overlapped_rows_within_25_percent():
  """Table 4's Streaming DiLoCo rows (tau = 0, tau = 1 bf16 and FP4) at every
  utilisation and table 1's slowdowns at 1 Gbit/s, within 25%; the eager paper's other
  rows recorded, compared, and off by more (their bytes do not fit any link at W)."""
  check = am.streaming_diloco_overlap_check()
  levels = am.PAPER_OVERLAP["utilisations"]
  assert check["utilisations"] == list(levels) == [0.5, 0.8, 0.9, 0.95, 0.99]
  assert set(check["rows"]) == set(am.PAPER_OVERLAP["table_4"])
  for name, row in check["rows"].items():
    assert row["paper_gbit"] == list(am.PAPER_OVERLAP["table_4"][name][1])
    assert all(abs(e) < 0.25 for e in row["errors"]), (name, row["errors"])
  for name, slowdown in check["slowdowns"].items():
    assert abs(slowdown["error"]) < 0.25, (name, slowdown)
  assert check["max_abs_error"] < 0.25
  # The published numbers, as recorded.
  assert check["rows"]["overlapped"]["paper_gbit"] == [1.4, 4.3, 6.2, 9.1, 11.0]
  assert check["rows"]["overlapped_fp4"]["paper_gbit"] == [0.4, 0.9, 1.7, 2.0, 3.0]
  assert am.PAPER_OVERLAP["eager_table_5"]["inner_fp4_h100"][1] == (0.4, 0.9, 1.7, 2.0, 3.0)
  # The closed form of tau = 1: a fragment of 2 Gbit (1B / 8 in bf16, M = 2) waits what
  # passes (f + 1) C, and 8 fragments per 100 steps leave 12.5 C (1 / u - 1) each.
  step, f = 0.1, am.OVERLAP
  for u, w in zip(levels, check["rows"]["overlapped"]["gbit"], strict=True):
    assert w == pytest.approx(2 / ((f + 1) * step + 12.5 * step * (1 / u - 1)), rel=1e-9)
  # The library's message, frozen at the boundary (lead 0), needs more.
  for name in ("overlapped", "overlapped_fp4"):
    row = check["rows"][name]
    assert all(a > b for a, b in zip(row["library_gbit"], row["gbit"], strict=True))
  # A whole round in flight (eager, tau = H = 100, FP4) is hidden at 1 Gbit/s, as published.
  assert check["slowdowns"]["outer_step_fp4"]["model"] == 1.0
  assert check["slowdowns"]["outer_step_fp4"]["paper"] == 1.0
  # Not reproduced: off by more than 25%, and the tau = H = 100 row below the rate any
  # schedule needs to move 8 x 0.5 Gbit per 100 steps of 0.1 s.
  off = check["not_reproduced"]
  assert set(off) == {"inner_fp4_h30", "outer_fp4_h30", "outer_fp4_h100"}
  assert all(abs(e) > 0.25 for row in off.values() for e in row["errors"])
  floor = 8 * 0.5 / (100 * step)
  assert max(off["outer_fp4_h100"]["paper_gbit"]) < floor
  # The model: U = W / floor below it (each step's chunks wait what passes C).
  assert [w / floor for w in off["outer_fp4_h100"]["gbit"]] == pytest.approx(levels, rel=1e-9)
  # The first validation is untouched.
  assert am.PAPER == {"data_parallel_gbit": 222.0, "diloco_gbit": 23.0, "utilisation": 0.95}


def test_bandwidth_for_utilisation_of_ddp_is_the_closed_form():
  c = am.step_seconds(am.GPT2_SMALL)
  nbits = 8 * am.ring_factor(8) * am.n_params(am.GPT2_SMALL) * FLOAT32
  wait = 2 / 3 * c + c * (1 / 0.9 - 1) - am.ALPHA_S
  assert am.bandwidth_for_utilisation("ddp") == pytest.approx(nbits / wait / 1e9, rel=1e-9)
  # Each method its own profile: DiLoCo's one sync per round (GPT-2 small's low-rank
  # ledgers run their float work on the real shapes, 15-30 s of CPU each).
  assert am.bandwidth_for_utilisation("diloco") < am.bandwidth_for_utilisation("ddp")


def test_faster_than_ddp_finds_the_crossing():
  """Twice DDP's steps at a sixteenth of its bytes: ahead below some bandwidth, where the
  two times are equal; a run that is never ahead, and one always ahead."""
  c, ddp = 0.14, (1000, am.sync_every_profile(5e8, 1))
  local = (2000, am.sync_every_profile(5e8, 16))
  found = am.faster_than(local, ddp, c)
  assert found["when"] == "below" and 0.1 < found["gbit"] < 1e3
  times = [am.time_to_target(*run, c, found["gbit"]) for run in (local, ddp)]
  assert times[0] == pytest.approx(times[1], rel=1e-9)
  assert am.time_to_target(*local, c, found["gbit"] / 2) < am.time_to_target(
    *ddp, c, found["gbit"] / 2
  )
  assert am.faster_than((3000, ddp[1]), ddp, c) == {"when": "never", "gbit": None}
  assert am.faster_than((500, local[1]), ddp, c) == {"when": "always", "gbit": None}


def test_run_all_runs_it_quickly(tmp_path):
  assert "accelerator_model" in run_all.STUDIES
  line = run_all.command("accelerator_model", True, tmp_path, default_out=False)
  assert line[-3:] == ["--quick", "--out", str(tmp_path)]


def test_quick_report(tmp_path):
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
  done = subprocess.run(
    [
      sys.executable,
      str(ROOT / "benchmarks" / "communication" / "accelerator_model.py"),
      "--quick",
      "--out",
      str(tmp_path),
      "--examples-table",
      str(tmp_path / "table.json"),
    ],
    capture_output=True,
    text=True,
    env=env,
    cwd=ROOT,
    timeout=600,
  )
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
  record = json.loads((tmp_path / "accelerator_model.json").read_text())
  markdown = (tmp_path / "accelerator_model.md").read_text()
  assert (tmp_path / "accelerator_model.png").stat().st_size > 0
  assert record["quick"] and record["command"] in markdown
  (size,) = record["sizes"]
  assert size["config"]["name"] == "GPT-2 124M" and size["rank"] == 192
  assert [m["method"] for m in size["methods"]] == list(am.QUICK_METHODS)
  v = record["validation"]
  assert f"{v['data_parallel_gbit']:.1f} Gbit/s" in markdown
  ratios = am.steps_ratios()
  c = size["step_s"]
  for m in size["methods"]:
    u = [m["utilisation"][str(g)] for g in am.BANDWIDTHS_GBIT]
    assert u == sorted(u)
    b90, b95 = m["gbit_for"]["0.9"], m["gbit_for"]["0.95"]
    assert b90 < b95 <= m["gbit_for_no_overlap"]["0.95"]
    assert am.utilisation(m["profile"], c, b90) == pytest.approx(0.9, rel=1e-9)
    for target, reached in zip(ratios, m["time_to_target_s"], strict=True):
      ratio = target["ratios"][m["method"]]
      if ratio is None:
        assert reached["steps"] is None
        continue
      assert reached["steps"] == pytest.approx(ratio * size["ddp_steps"])
      for g, seconds in reached["seconds"].items():
        u = am.utilisation(m["profile"], c, float(g))
        assert seconds == pytest.approx(reached["steps"] * c / u, rel=1e-9)
  ddp = next(m for m in size["methods"] if m["method"] == "ddp")
  assert ddp["bytes_per_step"] == FLOAT32 * size["params"]
  # The table examples/main.py prints: these numbers, and the shipped file (written by
  # the full run: every method) regenerated, for the methods of the quick run.
  table = json.loads((tmp_path / "table.json").read_text())
  assert list(table["gbit_for"]) == list(am.QUICK_METHODS)
  assert table["gbit_for"] == {m["method"]: m["gbit_for"] for m in size["methods"]}
  shipped = json.loads(am.EXAMPLES_TABLE.read_text())
  assert list(shipped["gbit_for"]) == list(am.methods(4, None))
  assert table == dict(shipped, gbit_for={m: shipped["gbit_for"][m] for m in am.QUICK_METHODS})
