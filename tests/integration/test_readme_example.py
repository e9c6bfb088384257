"""The README's openai SDK example, run as a user runs it: its code taken from README.md
(between the `sdk-example` markers), as a script, against `wsmode serve` and the simulated
model in processes of their own. Whatever the first turn's ending, it ends with a message;
it never waits forever."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.helpers import free_port, running, seconds, wait_healthy

README = Path(__file__).resolve().parents[2] / "README.md"
DEFAULT_BASE = "http://127.0.0.1:8080/v1"


def _example() -> str:
    text = README.read_text()
    marked = r"<!-- sdk-example -->\n```python\n(.*?)```\n<!-- /sdk-example -->"
    match = re.search(marked, text, re.S)
    assert match, "README.md has the SDK example between <!-- sdk-example --> markers"
    code = match.group(1)
    assert code.count(DEFAULT_BASE) == 1
    return code


def _run(code: str, port: int, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "example.py"
    script.write_text(code.replace(DEFAULT_BASE, f"http://127.0.0.1:{port}/v1"))
    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=seconds(120),  # a hang fails here
        cwd=tmp_path,
    )


@pytest.fixture
async def sim_port() -> AsyncIterator[int]:
    port = free_port()
    with running(["sim", "--port", str(port), "--ttft-ms", "0", "--output-tokens", "12"]):
        await wait_healthy(f"http://127.0.0.1:{port}")
        yield port


async def test_the_example_runs_two_turns(sim_port: int, tmp_path: Path) -> None:
    port = free_port()
    with running(["serve", "--port", str(port), "--upstream", f"http://127.0.0.1:{sim_port}/v1"]):
        await wait_healthy(f"http://127.0.0.1:{port}")
        out = _run(_example(), port, tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 2 and all(line.strip() for line in lines)


async def test_the_example_says_the_upstream_is_down(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    port = free_port()
    with running(["serve", "--port", str(port), "--upstream", dead]):
        await wait_healthy(f"http://127.0.0.1:{port}")
        out = _run(_example(), port, tmp_path)
    assert out.returncode == 1
    assert out.stdout == ""
    message = f"error 502: cannot reach the upstream at {dead} (connection refused)"
    assert out.stderr.strip() == message


async def test_the_example_says_the_answer_was_cut_by_a_token_limit(
    sim_port: int, tmp_path: Path
) -> None:
    """A local model's token limit (here the request's own `max_output_tokens`, the one
    change made to the example): `response.incomplete` ends the script with its reason."""
    code = _example().replace(
        'input="Say hi", store=False)', 'input="Say hi", store=False, max_output_tokens=4)'
    )
    assert "max_output_tokens=4" in code
    port = free_port()
    with running(["serve", "--port", str(port), "--upstream", f"http://127.0.0.1:{sim_port}/v1"]):
        await wait_healthy(f"http://127.0.0.1:{port}")
        out = _run(code, port, tmp_path)
    assert out.returncode == 1
    assert out.stderr.strip() == "incomplete: max_output_tokens"
