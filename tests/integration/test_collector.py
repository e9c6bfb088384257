"""The collector tuning every server process applies once its app is built (proxy/serve.py).
Checked in a child process: freezing the test runner's own heap would leak its garbage."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import gc, json
from wsmode.serve import GC_GEN0_THRESHOLD, tune_collector
before = gc.get_threshold()
tune_collector()
print(json.dumps({"before": before, "after": gc.get_threshold(),
                  "frozen": gc.get_freeze_count(), "gen0": GC_GEN0_THRESHOLD}))
"""


def test_a_server_freezes_its_start_up_heap_and_collects_the_young_less_often() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    got = json.loads(out)
    assert got["before"][0] == 700  # Python's default, so the change below is ours
    assert got["after"] == [got["gen0"], *got["before"][1:]]
    assert got["gen0"] > got["before"][0]
    assert got["frozen"] > 1000  # the modules and objects of start-up left the generations
