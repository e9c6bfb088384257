"""The soak, short: a real proxy process, faults injected, the summary line checked."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.support.helpers import seconds


@pytest.mark.timeout(seconds(240))  # about 9 s here; its own bound on the soak is 180 s
def test_short_soak_passes() -> None:
    connections = 6
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "wsmode",
            "soak",
            "--connections",
            str(connections),
            "--turns",
            "6",
            "--duration",
            str(seconds(60)),
            "--fault-rate",
            "0.2",
            "--upstream-kills",
            "1",
        ],
        env=os.environ.copy(),
        capture_output=True,
        text=True,
        timeout=seconds(180),
    )
    lines = out.stdout.strip().splitlines()
    assert out.returncode == 0, out.stdout + out.stderr
    # one line per conversation, then state, memory, drain: all passed
    assert re.fullmatch(r"(\d+) passed, 0 failed", lines[-1]), lines[-5:]
    assert int(lines[-1].split()[0]) == connections + 3
    summary = next(line for line in lines if "upstream kills" in line)
    assert "1 upstream kills" in summary  # the fault really happened mid-run
    assert re.search(r"[1-9]\d* failed by injected faults", summary)
