"""`wsmode serve` as the Kubernetes pod of deploy/ starts it: the ConfigMap's file, the
image's and the container's environment, the Secret's values. Changed only where a test
must: a loopback address and a free port, simulated model servers for the two in the file,
the proxy keys' digest file in a temporary folder, and the in-memory store (the Redis store
has its own tests). And the example Redis's arguments, on a real redis-server."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AuthenticationError

from tests.support.deploy_files import (
    container_args,
    container_env,
    deployed_toml,
    pod_env,
    redis_container,
    wsmode_container,
)
from tests.support.helpers import (
    Sim,
    free_port,
    running,
    sdk_terminal,
    seconds,
    until_sync,
    wait_healthy,
)

KEY = "sk-deploy-pod-key-0123456789"


@asynccontextmanager
async def pod(sims: list[Sim], tmp_path: Path) -> AsyncIterator[str]:
    """`wsmode serve` started as the pod starts it, in front of `sims`: its base URL."""
    config = tmp_path / "wsmode.toml"
    config.write_text(deployed_toml(tmp_path))
    hashes = tmp_path / "api-key-hashes"
    hashes.write_text(hashlib.sha256(KEY.encode()).hexdigest() + "\n")
    env = {
        **pod_env(),
        "WSMODE_CONFIG": str(config),
        "WSMODE_AUTH_API_KEY_HASHES_FILE": str(hashes),
    }
    port = free_port()
    args = ["serve", "--host", "127.0.0.1", "--port", str(port)]
    # the sims stand in for the model servers, and the memory store for the example Redis
    env["WSMODE_UPSTREAM_URLS"] = ",".join(s.url for s in sims)
    env["WSMODE_STORE_BACKEND"] = "memory"
    with running(args, env):
        base = f"http://127.0.0.1:{port}"
        await wait_healthy(base)
        yield base


async def test_the_pod_serves_conversations_behind_its_keys(
    sim_factory: Callable[..., Awaitable[Sim]],
    openai_client: Callable[..., Any],
    tmp_path: Path,
) -> None:
    async with pod([await sim_factory(), await sim_factory()], tmp_path) as base:
        async with aiohttp.ClientSession() as http:
            # the kubelet's liveness probe carries no Authorization, and auth is on
            path = wsmode_container()["livenessProbe"]["httpGet"]["path"]
            async with http.get(f"{base}{path}") as r:
                assert r.status == 200, await r.text()
            async with http.get(f"{base}/v1/models") as r:
                assert r.status == 401  # everything else wants a key
        client = openai_client(f"{base}/v1", api_key=KEY)
        async with client.responses.connect() as conn:
            await conn.response.create(model="sim", input="hello", store=False)
            done = await sdk_terminal(conn)
        assert done.type == "response.completed" and done.response.output_text
        with pytest.raises(AuthenticationError):
            await openai_client(f"{base}/v1", api_key="sk-wrong").models.list()


async def test_the_readiness_probe_needs_no_key(
    sim_factory: Callable[..., Awaitable[Sim]], tmp_path: Path
) -> None:
    path = wsmode_container()["readinessProbe"]["httpGet"]["path"]
    async with (
        pod([await sim_factory(), await sim_factory()], tmp_path) as base,
        aiohttp.ClientSession() as http,
        http.get(f"{base}{path}") as r,
    ):
        assert r.status == 200, f"{path} without a key: {r.status} {await r.text()}"


@pytest.mark.skipif(not shutil.which("redis-server"), reason="redis-server is not installed")
def test_the_example_redis_keeps_nothing_on_disk(tmp_path: Path) -> None:
    """A real redis-server with the example's arguments (on a Unix socket, no TCP port), its
    password filled in from the Secret as the kubelet does: it takes them, refuses a client
    without the password, and saves neither snapshots nor an append-only file."""
    container = redis_container()
    sock = tmp_path / "redis.sock"
    args = ["redis-server", *container_args(container), "--port", "0", "--unixsocket", str(sock)]
    password = container_env(container)["REDIS_PASSWORD"]
    with subprocess.Popen([*args, "--dir", str(tmp_path)], stdout=subprocess.DEVNULL) as proc:
        try:

            def cli(*command: str, auth: str | None = password) -> subprocess.CompletedProcess[str]:
                env = {"PATH": os.environ["PATH"], **({"REDISCLI_AUTH": auth} if auth else {})}
                return subprocess.run(
                    ["redis-cli", "-s", str(sock), *command],
                    capture_output=True,
                    text=True,
                    check=False,
                    timeout=seconds(10),
                    env=env,
                )

            def config(name: str) -> list[str]:
                done = cli("CONFIG", "GET", name)
                return done.stdout.splitlines() if done.returncode == 0 else []

            until_sync(lambda: config("save"), message="redis-server never answered")
            assert config("save") == ["save", ""]
            assert config("appendonly") == ["appendonly", "no"]
            assert config("maxmemory-policy") == ["maxmemory-policy", "noeviction"]
            # the readiness probe's command, with the container's REDISCLI_AUTH
            probe = container["readinessProbe"]["exec"]["command"]
            assert probe[0] == "redis-cli"
            assert (
                cli(*probe[1:], auth=container_env(container)["REDISCLI_AUTH"]).stdout == "PONG\n"
            )
            # no password, or a wrong one: refused
            assert "NOAUTH" in cli("PING", auth=None).stdout
            assert "PONG" not in cli("PING", auth="wrong").stdout
        finally:
            proc.terminate()
            proc.wait(timeout=seconds(10))
    assert not list(tmp_path.glob("*.rdb")) and not list(tmp_path.glob("appendonly*"))
