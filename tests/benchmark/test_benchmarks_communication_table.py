"""The communication table's fast path counts what the full steps send, for every method.

``benchmarks/communication/communication_table.py`` measures the table of
docs/benchmarks.md with counters-only steps (the ledger and the counters that decide when
a round syncs); its self-check compares them with full steps on small shapes. DES-LOC's
moments are due by the count of syncs, so a counter left out of the fast path shows here.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from benchmarks.communication import communication_table  # noqa: E402


def test_counters_only_steps_send_what_full_steps_send():
  communication_table.self_check()


def test_the_sync_counters_are_counters():
  named = lambda *names: [type("Key", (), {"name": n})() for n in names]  # noqa: E731
  assert communication_table._is_counter(named("syncs"))
  assert communication_table._is_counter(named("next_sync"))
  assert not communication_table._is_counter(named("anchor", "w"))
