"""Codex CLI, unmodified, over WebSocket mode (docs/clients.md "Codex CLI").

Codex is a 400 MB npm package, so this runs only where it is installed: set CODEX_BIN
to its `codex` binary (e.g. after `npm install @openai/codex@0.169.0`, node_modules/.bin/codex).

Two set-ups: a custom provider (`model_providers.local`, `supports_websockets = true`), and
Codex's built-in OpenAI provider redirected with `openai_base_url`, which is the one that
uses remote compaction (a `compaction_trigger` input item, docs/compaction.md).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from pathlib import Path
from typing import Any

import pytest
from wsmode.core.context.compaction import SUMMARY_INSTRUCTIONS, SUMMARY_PREFIX

from tests.support.helpers import seconds

CODEX = os.environ.get("CODEX_BIN", "")
pytestmark = [
    pytest.mark.skipif(not CODEX, reason="set CODEX_BIN to run Codex CLI"),
    pytest.mark.timeout(seconds(240)),  # `codex exec` has 120 s (below), the proxy's start aside
]


async def _codex_exec(
    tmp_path: Path, config: str, env: dict[str, str], *args: str
) -> tuple[str, list[dict[str, Any]]]:
    """Run `codex exec ... --json <args>` with `config` as its config.toml; check that it
    exited 0 over WebSocket mode; its whole output and its JSON events."""
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(config)
    proc = await asyncio.create_subprocess_exec(
        CODEX,
        "exec",
        "--skip-git-repo-check",
        "--ephemeral",
        "-s",
        "read-only",
        "--json",
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "CODEX_HOME": str(home), **env},
        cwd=tmp_path,
    )
    out, err = await asyncio.wait_for(proc.communicate(), seconds(120))
    text = out.decode() + err.decode()
    assert proc.returncode == 0, text
    assert "Falling back from WebSockets" not in text
    return text, [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]


async def test_codex_exec_uses_websocket_mode(
    tmp_path: Path, sim_factory: Any, proxy_factory: Any
) -> None:
    sim = await sim_factory(output_tokens=12)
    proxy = await proxy_factory(sim.url)
    config = f"""model = "fake-model"
model_provider = "local"

[model_providers.local]
name = "wsmode"
base_url = "{proxy.http}"
wire_api = "responses"
env_key = "LOCAL_API_KEY"
supports_websockets = true
request_max_retries = 0
stream_max_retries = 0
stream_idle_timeout_ms = 15000
"""
    last = tmp_path / "last.txt"
    _, events = await _codex_exec(
        tmp_path, config, {"LOCAL_API_KEY": "sk-test"}, "-o", str(last), "say hi"
    )
    messages = [
        e["item"]["text"] for e in events if e.get("item", {}).get("type") == "agent_message"
    ]
    assert messages and last.read_text().strip() == messages[-1].strip()
    assert any(e["type"] == "turn.completed" for e in events)
    bodies = sim.bodies()
    # the prewarm never reached the model; every later turn carried the whole history
    assert bodies and all("previous_response_id" not in b for b in bodies)
    assert bodies[0]["input"][0]["role"] == "developer"
    for earlier, later in itertools.pairwise(bodies):
        assert later["input"][: len(earlier["input"])] == earlier["input"]


async def test_codex_remote_compaction_through_the_builtin_openai_provider(
    tmp_path: Path, sim_factory: Any, proxy_factory: Any
) -> None:
    """Codex compacts remotely when its token count passes `model_auto_compact_token_limit`:
    after the simulated model's tool call it sends `compaction_trigger` on the socket and
    needs exactly one compaction item back; the turn then goes on from the compacted
    history, which wsmode expands for the model."""
    sim = await sim_factory(output_tokens=12)
    proxy = await proxy_factory(sim.url)
    config = f"""model = "fake-model"
openai_base_url = "{proxy.http}"
model_auto_compact_token_limit = 200
"""
    text, events = await _codex_exec(tmp_path, config, {"CODEX_API_KEY": "sk-test"}, "say hi")
    assert "remote compact" not in text, text
    assert any(e["type"] == "turn.completed" for e in events), text
    assert any(e.get("item", {}).get("type") == "agent_message" for e in events), text
    bodies = sim.bodies()
    summaries = [b for b in bodies if b.get("instructions") == SUMMARY_INSTRUCTIONS]
    assert len(summaries) == 1, [b.get("instructions") for b in bodies]
    assert not any(b"compaction_trigger" in json.dumps(b).encode() for b in bodies)
    after = bodies[bodies.index(summaries[0]) + 1 :]
    texts = [
        part.get("text", "")
        for b in after
        for item in b["input"]
        if isinstance(item.get("content"), list)
        for part in item["content"]
    ]
    assert any(t.startswith(SUMMARY_PREFIX) for t in texts)  # the item, expanded
