"""What a new user sees when `wsmode serve`, `sidecar` and `sim` start (and stop): real
processes on real ports, their stderr read as the user reads it."""

from __future__ import annotations

import asyncio
import json
import logging
import select
import signal
import socket
import subprocess
import sys

import pytest
from wsmode.build import build_context
from wsmode.config import load_settings
from wsmode.core.context.sealing import decode_key
from wsmode.serve import shared_compaction_key

from tests.support.helpers import free_port, running, seconds, wait_healthy

COMMANDS = {
    "serve": ["serve"],
    "sidecar": ["sidecar", "--upstream", "http://127.0.0.1:9/v1"],
    "sim": ["sim"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_port_in_use_is_one_clear_line(command: str) -> None:
    """The port is taken: one line naming the address and the reason, exit 1, no traceback,
    and no "listening" line before it (nothing listens)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "wsmode", *COMMANDS[command], "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=seconds(60),
        )
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr
    errors = [line for line in out.stderr.splitlines() if "cannot listen" in line]
    assert errors == [f"Error: cannot listen on 127.0.0.1:{port}: address already in use"]
    assert "listening on" not in out.stderr and " on http://" not in out.stderr


async def test_start_up_under_json_logs_is_json_and_names_a_usable_url() -> None:
    """`--log-format json`: every line is JSON, the listening line included (written once
    the socket is bound); on 0.0.0.0 without auth there is a warning, and the base URL it
    prints is one a client can use. The drain line says a second signal cuts it short."""
    port = free_port()
    args = ["serve", "--host", "0.0.0.0", "--port", str(port), "--log-format", "json"]
    with running(args, {"WSMODE_SIM_TTFT_MS": "0"}) as proc:
        await wait_healthy(f"http://127.0.0.1:{port}")
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.to_thread(proc.communicate, timeout=seconds(20))
    assert proc.returncode == 0, err
    docs = [json.loads(line) for line in err.splitlines()]  # each line parses
    messages = [d["message"] for d in docs]
    listening = [m for m in messages if "listening on ws://" in m]
    assert listening == [
        f"wsmode {_version()} listening on ws://127.0.0.1:{port}/v1/responses "
        f"(clients use base URL http://127.0.0.1:{port}/v1)"
    ]
    assert f"0.0.0.0:{port}/v1" not in err
    assert not any("/console" in m for m in messages)  # off on every address by default
    warnings = [d["message"] for d in docs if d["level"] == "WARNING"]
    assert any("without proxy auth" in m and "auth.api_keys" in m for m in warnings)
    # the compaction key is not a warning on a single process: an INFO saying what it costs
    assert not any("compaction.key" in m for m in warnings)
    assert any("compaction.key is not set" in m and "restart" in m for m in messages)
    drain = next(m for m in messages if m.startswith("draining:"))
    assert "a second Ctrl-C or SIGTERM cuts it short" in drain


async def test_loopback_with_auth_gives_no_exposure_warning() -> None:
    port = free_port()
    env = {"WSMODE_AUTH_API_KEYS": "sk-start-up-key", "WSMODE_SIM_TTFT_MS": "0"}
    with running(["serve", "--port", str(port)], env) as proc:
        await wait_healthy(f"http://127.0.0.1:{port}")
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.to_thread(proc.communicate, timeout=seconds(20))
    assert "without proxy auth" not in err
    assert f"listening on ws://127.0.0.1:{port}/v1/responses" in err
    # on loopback the console is on, and the start-up says where
    assert f"console (open it in a browser): http://127.0.0.1:{port}/console" in err


def test_compaction_key_warns_only_with_several_workers(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "wsmode")
    build_context(load_settings(None, {}, {}))
    several = load_settings(None, {}, {"server.workers": "2"})
    shared = shared_compaction_key(several)  # the supervisor's, before it starts the workers
    levels = [(r.levelname, "workers share a key" in r.getMessage()) for r in caplog.records]
    assert levels == [("INFO", False), ("WARNING", True)]
    assert decode_key(shared.compaction.key) and several.compaction.key == ""
    assert shared_compaction_key(shared) is shared  # a key set is kept as it is
    assert shared.compaction.key not in caplog.text


def _version() -> str:
    from wsmode import __version__

    return __version__


def test_sim_announces_after_binding() -> None:
    """`wsmode sim` prints its URL once it listens: a client can connect at once."""
    port = free_port()
    with running(["sim", "--port", str(port)]) as proc:
        assert proc.stderr is not None
        readable, _, _ = select.select([proc.stderr], [], [], seconds(10))
        assert readable, "wsmode sim printed nothing"
        line = proc.stderr.readline()
        assert line.strip() == f"simulated model on http://127.0.0.1:{port}/v1"
        with socket.create_connection(("127.0.0.1", port), timeout=seconds(5)):
            pass
        proc.terminate()
        proc.wait(timeout=seconds(10))
    assert proc.returncode in (0, -signal.SIGTERM)
