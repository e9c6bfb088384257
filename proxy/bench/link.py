"""The emulated WAN link between the client and the server side.

Preferred: Linux `tc netem` on the loopback device of a network namespace of our own, so
the kernel's real TCP (slow start, congestion control) runs over the delay and rate. That
needs root, `ip` and `tc`, and a kernel with the netem qdisc; `probe_netem()` tries it and
says why not. Otherwise the built-in shim (proxy/bench/shim.py) relays each connection with
the same delay and uplink rate in user space. The report prints which one ran.

In the namespace, servers that sit across the WAN listen on 127.0.0.2: packets to it take
the uplink class (delay rtt/2 plus the uplink rate), packets from it the downlink class
(delay rtt/2); 127.0.0.1 to 127.0.0.1 (wsmode to the simulated model) is not shaped.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence

from .procs import BenchError

WAN_HOST = "127.0.0.2"  # netem: the far side of the link, inside the namespace


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)


def probe_netem() -> tuple[bool, str]:
    """Can we shape loopback traffic with netem in a namespace of our own? (ok, reason)"""
    if os.geteuid() != 0:
        return False, "not root"
    if not (shutil.which("ip") and shutil.which("tc")):
        return False, "iproute2 (ip, tc) not installed"
    ns = f"wsmode-probe-{os.getpid()}"
    made = _run("ip", "netns", "add", ns)
    if made.returncode != 0:
        return False, f"ip netns add failed: {made.stderr.strip()}"
    try:
        r = _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root", "netem")
        if r.returncode != 0:
            return False, f"tc netem unavailable ({r.stderr.strip() or r.returncode})"
        return True, "tc netem in a network namespace"
    finally:
        _run("ip", "netns", "del", ns)


class NetemNamespace:
    """A namespace whose loopback carries the WAN classes; deleted by `close()`."""

    def __init__(self) -> None:
        self.name = f"wsmode-bench-{os.getpid()}"

    def create(self) -> None:
        steps = [
            ["ip", "netns", "add", self.name],
            ["ip", "-n", self.name, "link", "set", "lo", "up"],
            ["ip", "-n", self.name, "link", "set", "lo", "mtu", "1500"],  # a WAN-like MSS
        ]
        for cmd in steps:
            r = _run(*cmd)
            if r.returncode != 0:
                self.close()
                raise BenchError(f"{' '.join(cmd)}: {r.stderr.strip()}")

    def close(self) -> None:
        _run("ip", "netns", "del", self.name)

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]


def netem_setup_commands() -> list[list[str]]:
    """tc commands (run inside the namespace): three classes on `lo` and the two filters."""
    return [
        "tc qdisc add dev lo root handle 1: htb default 3".split(),
        *(
            f"tc class add dev lo parent 1: classid 1:{c} htb rate 10gbit".split()
            for c in (1, 2, 3)
        ),
        f"tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip dst {WAN_HOST}/32 "
        "flowid 1:1".split(),
        f"tc filter add dev lo parent 1: protocol ip prio 2 u32 match ip src {WAN_HOST}/32 "
        "flowid 1:2".split(),
    ]


def netem_shape_commands(rtt_ms: float, up_mbit: float, down_mbit: float) -> list[list[str]]:
    """tc commands that (re)set the uplink and downlink classes' delay and rate."""
    half = f"{rtt_ms / 2:g}ms"
    up = f" rate {up_mbit:g}mbit" if up_mbit > 0 else ""
    down = f" rate {down_mbit:g}mbit" if down_mbit > 0 else ""
    leaf = "tc qdisc replace dev lo parent 1:{} handle {}: netem delay {}{} limit 100000"
    return [leaf.format(1, 10, half, up).split(), leaf.format(2, 20, half, down).split()]


class NetemLink:
    """Inside the namespace: servers on WAN_HOST are across the link; `set` reshapes it."""

    method = "tc netem (kernel TCP over an emulated link, in a network namespace)"

    def __init__(self) -> None:
        self.rtt_ms = 0.0
        self.ready = False

    def address(self, host: str, port: int) -> tuple[str, int]:
        return host, port  # servers that are across the link already listen on WAN_HOST

    async def set(self, rtt_ms: float, up_mbit: float, down_mbit: float = 0.0) -> None:
        cmds = netem_shape_commands(rtt_ms, up_mbit, down_mbit)
        if not self.ready:
            cmds = netem_setup_commands() + cmds
            self.ready = True
        self.rtt_ms = rtt_ms
        for cmd in cmds:
            r = await asyncio.to_thread(_run, *cmd)
            if r.returncode != 0:
                raise BenchError(f"{' '.join(cmd)}: {r.stderr.strip()}")

    def close(self) -> None:
        _run("tc", "qdisc", "del", "dev", "lo", "root")


class ShimLink:
    """The user-space shim: one listening port per target, reshaped through its stdin."""

    method = (
        "built-in shim (user-space TCP relay adding rtt/2 per direction and pacing the uplink;"
        " no TCP slow start on the slow leg)"
    )

    def __init__(self, proc: subprocess.Popen[bytes], routes: dict[tuple[str, int], int]) -> None:
        self.proc = proc
        self.routes = routes
        self.rtt_ms = 0.0

    @classmethod
    async def start(cls, targets: Sequence[tuple[str, int]]) -> ShimLink:
        cmd = [sys.executable, "-m", "wsmode.bench.shim"]
        for host, port in targets:
            cmd += ["--route", f"0:{host}:{port}"]
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 20)
            ports = json.loads(line)["ports"]
        except (TimeoutError, ValueError, KeyError) as exc:
            proc.kill()
            raise BenchError(f"the WAN shim did not start: {exc!r}") from exc
        return cls(proc, dict(zip(targets, ports, strict=True)))

    def address(self, host: str, port: int) -> tuple[str, int]:
        return "127.0.0.1", self.routes[(host, port)]

    async def set(self, rtt_ms: float, up_mbit: float, down_mbit: float = 0.0) -> None:
        assert self.proc.stdin is not None
        self.rtt_ms = rtt_ms
        doc = {"rtt_ms": rtt_ms, "up_mbit": up_mbit, "down_mbit": down_mbit}
        self.proc.stdin.write(json.dumps(doc).encode() + b"\n")
        self.proc.stdin.flush()
        await asyncio.sleep(0.05)  # the control thread applies it to chunks read from now on

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
