"""`wsmode bench` says how far it is, on stderr, as it goes: which scenario, how many cells
are left (a full run takes minutes). stdout stays the report."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helpers import seconds


@pytest.mark.timeout(seconds(240))  # about 9 s here; its own bound on the bench is 180 s
def test_bench_prints_progress_per_scenario_on_stderr(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "wsmode", "bench", "--smoke", "--link", "shim"]
    proc = subprocess.run(
        [*cmd, "overhead", "scale", "--json", "", "--png", ""],
        capture_output=True,
        text=True,
        timeout=seconds(180),
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    progress = [
        re.sub(r"\d+ s\b", "N s", line)
        for line in proc.stderr.splitlines()
        if line.startswith("wsmode bench: ")
    ]
    # the smoke plan: overhead measures four history sizes, scale one connection count
    assert progress == [
        "wsmode bench: scenario 1/2 overhead (4 cells; 5 cells left in the run, N s so far)",
        "wsmode bench: overhead done in N s; 1 cell left",
        "wsmode bench: scenario 2/2 scale (1 cell; 1 cell left in the run, N s so far)",
        "wsmode bench: scale done in N s; 0 cells left",
    ]
    assert "wsmode bench: " not in proc.stdout
