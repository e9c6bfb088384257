"""The programs under test, as separate processes, and what /proc says about them.

Each server is started with the same interpreter (`python -m wsmode ...`), waited for
until its port accepts connections, and stopped with SIGTERM (then SIGKILL). CPU time is read
from `/proc/PID/task/*/schedstat` (nanoseconds on the CPU, every thread), falling back to the
tick counts of `/proc/PID/stat`; memory is `VmRSS` from `/proc/PID/status`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

STARTUP_TIMEOUT = 20.0  # seconds a server may take to accept connections
# The simulated model's tokenising cost, CPU microseconds per token, in every scenario that
# charges one (tokens, agent-loop): real llama.cpp here tokenises a 16,845-token history in
# about 178 ms with Gemma 3's 262,144-token vocabulary, about 10 us per token
TOKENIZE_US_PER_TOKEN = 10.0


class BenchError(RuntimeError):
    """A benchmark could not run as planned (a server did not start, a request failed)."""


def raise_nofile_limit() -> int:
    """Raise the open-file soft limit to the hard limit (children inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def wsmode_command(args: Sequence[str], loop: str = "asyncio") -> list[str]:
    """The `wsmode` CLI with this interpreter; `loop="uvloop"` installs uvloop first."""
    if loop == "uvloop":
        boot = "import sys, uvloop; uvloop.install(); from wsmode.cli import main; main()"
        return [sys.executable, "-c", boot, *args]
    return [sys.executable, "-m", "wsmode", *args]


def cpu_ns(pid: int) -> int:
    """CPU time used so far by every thread of `pid`, in nanoseconds."""
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                total += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
    except OSError:
        pass
    if total:
        return total
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime + stime
    return ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise BenchError(f"no VmRSS for pid {pid}")


def open_files(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    host: str
    port: int
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def base(self) -> str:
        return f"http://{self.host}:{self.port}"

    def cpu_ns(self) -> int:
        return cpu_ns(self.pid)

    def rss_bytes(self) -> int:
        return rss_bytes(self.pid)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.reap()

    def reap(self) -> None:
        """Wait for the process to exit after SIGTERM, then SIGKILL it after 5 s."""
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


@dataclass
class Servers:
    """Every process a scenario started; `stop_all` on the way out, whatever happened."""

    started: list[Server] = field(default_factory=list)
    logdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="wsmode-bench-")))

    async def start(
        self,
        name: str,
        cmd: Sequence[str],
        host: str,
        port: int,
        env: Mapping[str, str] | None = None,
    ) -> Server:
        log_path = self.logdir / f"{name}-{len(self.started)}.log"
        full_env = {**os.environ, **(env or {})}
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                list(cmd), stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=os.getcwd()
            )
        server = Server(name, proc, host, port, log_path)
        self.started.append(server)
        await wait_listening(server)
        return server

    def stop_all(self) -> None:
        """SIGTERM to every process at once, then wait for each (SIGKILL after 5 s)."""
        for server in reversed(self.started):
            if server.proc.poll() is None:
                server.proc.send_signal(signal.SIGTERM)
        for server in reversed(self.started):
            server.reap()
        self.started.clear()


async def together(*starts: Awaitable[Server]) -> list[Server]:
    """Start several servers at once (each `start_*` spawns its process before its first
    wait): the interpreters start up side by side instead of one after another. Every start
    is awaited, so a failure is raised only once none is still waiting."""
    done = await asyncio.gather(*starts, return_exceptions=True)
    for result in done:
        if isinstance(result, BaseException):
            raise result
    return [r for r in done if isinstance(r, Server)]


async def wait_listening(server: Server, timeout: float = STARTUP_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise BenchError(
                f"{server.name} exited with {server.proc.returncode}:\n{server.log_tail()}"
            )
        try:
            _, writer = await asyncio.open_connection(server.host, server.port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return
    raise BenchError(f"{server.name} did not listen on {server.port} within {timeout:g}s")


def sim_env(
    *,
    ttft_ms: float,
    tokens_per_second: float,
    output_tokens: int,
    tool_calls_per_turn: int = 1,
    seed: int = 7,
    tokenize_us_per_token: float = 0.0,
    context_window: int = 0,
) -> dict[str, str]:
    return {
        "WSMODE_SIM_TTFT_MS": str(ttft_ms),
        "WSMODE_SIM_TOKENS_PER_SECOND": str(tokens_per_second),
        "WSMODE_SIM_OUTPUT_TOKENS": str(output_tokens),
        "WSMODE_SIM_TOOL_CALLS_PER_TURN": str(tool_calls_per_turn),
        "WSMODE_SIM_SEED": str(seed),
        "WSMODE_SIM_TOKENIZE_US_PER_TOKEN": str(tokenize_us_per_token),
        "WSMODE_SIM_CONTEXT_WINDOW": str(context_window),
        "WSMODE_SERVER_LOG_LEVEL": "WARNING",
    }


async def start_sim(
    servers: Servers, env: Mapping[str, str], host: str = "127.0.0.1", port: int = 0
) -> Server:
    port = port or free_port(host)
    cmd = wsmode_command(["sim", "--host", host, "--port", str(port)])
    return await servers.start("sim", cmd, host, port, env)


async def start_proxy(
    servers: Servers,
    upstream: str,
    *,
    host: str = "127.0.0.1",
    env: Mapping[str, str] | None = None,
    loop: str = "asyncio",
    port: int = 0,
) -> Server:
    port = port or free_port(host)
    cmd = wsmode_command(
        ["serve", "--host", host, "--port", str(port), "--upstream", upstream], loop
    )
    return await servers.start("wsmode", cmd, host, port, env)


async def start_bare(
    servers: Servers, upstream: str, host: str = "127.0.0.1", port: int = 0
) -> Server:
    """The bare relay (proxy/bench/bare.py): the baseline wsmode's ratios are taken to."""
    port = port or free_port(host)
    cmd = [sys.executable, "-m", "wsmode.bench.bare", "--host", host, "--port", str(port)]
    return await servers.start("bare", [*cmd, "--upstream", upstream], host, port)


async def start_sidecar(
    servers: Servers, upstream: str, host: str = "127.0.0.1", port: int = 0
) -> Server:
    """`wsmode sidecar --upstream URL`, on a host and port of ours."""
    port = port or free_port(host)
    args = ["sidecar", "--upstream", upstream, "--host", host, "--port", str(port)]
    return await servers.start("sidecar", wsmode_command(args), host, port)
