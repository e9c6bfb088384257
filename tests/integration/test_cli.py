"""The `wsmode` command as a user runs it: a real process, real sockets."""

from __future__ import annotations

import os
import subprocess
import sys

from websockets.asyncio.client import connect

from tests.support.helpers import (
    create,
    free_port,
    running,
    seconds,
    send,
    until_terminal,
    wait_healthy,
)


async def test_serve_without_upstream_fronts_the_simulator() -> None:
    port = free_port()
    with running(["serve", "--port", str(port)], {"WSMODE_SIM_TTFT_MS": "0"}) as proc:
        health = await wait_healthy(f"http://127.0.0.1:{port}")
        assert health["simulated_upstream"] is True
        async with connect(f"ws://127.0.0.1:{port}/v1/responses") as ws:
            await send(ws, create(input="hi", store=False))
            first = (await until_terminal(ws))[-1]["response"]
            await send(ws, create(input="again", previous_response_id=first["id"]))
            assert (await until_terminal(ws))[-1]["type"] == "response.completed"
        proc.terminate()
        _, err = proc.communicate(timeout=seconds(10))
    assert "SIMULATED model" in err


async def test_env_port_and_upstream_flag() -> None:
    sim_port, port = free_port(), free_port()
    with running(["sim", "--port", str(sim_port), "--ttft-ms", "0"]):
        await wait_healthy(f"http://127.0.0.1:{sim_port}")
        with running(
            ["serve", "--upstream", f"http://127.0.0.1:{sim_port}/v1"], {"WSMODE_PORT": str(port)}
        ) as proc:
            health = await wait_healthy(f"http://127.0.0.1:{port}")
            assert health["upstream"] == f"http://127.0.0.1:{sim_port}/v1"
            assert health["simulated_upstream"] is False
            async with connect(f"ws://127.0.0.1:{port}/v1/responses") as ws:
                await send(ws, create(input="hi"))
                assert (await until_terminal(ws))[-1]["type"] == "response.completed"
            proc.terminate()
            _, err = proc.communicate(timeout=seconds(10))
    assert "SIMULATED" not in err


def test_bad_config_is_a_usage_error(tmp_path: object) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "wsmode", "serve"],
        env={**os.environ, "WSMODE_SERVER_PORT": "eighty"},
        capture_output=True,
        text=True,
        timeout=seconds(30),
    )
    assert out.returncode == 2
    assert "server.port: expected int" in out.stderr
