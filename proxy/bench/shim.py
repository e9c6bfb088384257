"""The built-in WAN link: a TCP relay that adds delay and limits bandwidth.

Used when `tc netem` in a network namespace is not available. Each accepted connection is
relayed to its target; bytes in each direction are read in chunks of at most `CHUNK` bytes
and each chunk is delivered `rtt/2` after it has been "transmitted" over a FIFO link of the
configured rate (uplink: client to server; downlink: server to client; 0 is unlimited). So a
request body of B bytes arrives after rtt/2 + B*8/rate, as over a real link with a deep
buffer. What it does not model: TCP slow start and congestion control on the slow leg, loss,
and a rate shared between connections (each connection has its own link).

Run as `python -m wsmode.bench.shim --route LISTEN_PORT:HOST:PORT ...`; it prints one JSON line
`{"ports": [...]}` when listening (0 picks a free port). A line `{"rtt_ms": .., "up_mbit": ..,
"down_mbit": ..}` on stdin changes the link for every chunk read afterwards.

Threads, not asyncio: a sleeping writer thread wakes within tens of microseconds, while an
event loop's timers round up to whole milliseconds. Every queue is bounded (`QUEUE_CHUNKS`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import queue
import socket
import sys
import threading
import time
from dataclasses import dataclass

CHUNK = 16 * 1024
QUEUE_CHUNKS = 256  # at most 4 MiB in flight per direction; then the reader stops reading


@dataclass
class LinkParams:
    rtt_ms: float = 40.0
    up_mbit: float = 10.0  # client -> server; 0 unlimited
    down_mbit: float = 0.0  # server -> client; 0 unlimited


PARAMS = LinkParams()
_EOF = (0.0, b"")


def _pump(src: socket.socket, dst: socket.socket, upstream: bool) -> None:
    chunks: queue.Queue[tuple[float, bytes]] = queue.Queue(QUEUE_CHUNKS)

    def reader() -> None:
        busy_until = 0.0
        try:
            while True:
                data = src.recv(CHUNK)
                if not data:
                    break
                p = PARAMS
                rate = (p.up_mbit if upstream else p.down_mbit) * 1e6
                start = max(time.monotonic(), busy_until)
                busy_until = start + (len(data) * 8 / rate if rate > 0 else 0.0)
                chunks.put((busy_until + p.rtt_ms / 2000, data))
        except OSError:
            pass
        chunks.put(_EOF)

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    broken = False
    while True:
        due, data = chunks.get()
        if not data:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
            break
        if broken:
            continue  # drain until the reader sees the shutdown below and ends
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        try:
            dst.sendall(data)
        except OSError:
            broken = True
            with contextlib.suppress(OSError):
                src.shutdown(socket.SHUT_RDWR)
    t.join()


def _connection(client: socket.socket, target: tuple[str, int]) -> None:
    try:
        server = socket.create_connection(target)
    except OSError:
        client.close()
        return
    for s in (client, server):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    up = threading.Thread(target=_pump, args=(client, server, True), daemon=True)
    down = threading.Thread(target=_pump, args=(server, client, False), daemon=True)
    up.start()
    down.start()
    up.join()
    down.join()
    client.close()
    server.close()


def _serve(listener: socket.socket, target: tuple[str, int]) -> None:
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_connection, args=(client, target), daemon=True).start()


def _control() -> None:
    global PARAMS
    for line in sys.stdin:
        doc = json.loads(line)
        PARAMS = LinkParams(float(doc["rtt_ms"]), float(doc["up_mbit"]), float(doc["down_mbit"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--route", action="append", required=True, help="LISTEN_PORT:HOST:PORT")
    ap.add_argument("--rtt-ms", type=float, default=40.0)
    ap.add_argument("--up-mbit", type=float, default=10.0)
    ap.add_argument("--down-mbit", type=float, default=0.0)
    args = ap.parse_args()
    global PARAMS
    PARAMS = LinkParams(args.rtt_ms, args.up_mbit, args.down_mbit)
    sys.setswitchinterval(0.0002)  # a woken writer must not wait 5 ms for the GIL
    ports: list[int] = []
    threads: list[threading.Thread] = []
    for route in args.route:
        listen, host, port = route.split(":")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", int(listen)))
        listener.listen(128)
        ports.append(listener.getsockname()[1])
        threads.append(
            threading.Thread(target=_serve, args=(listener, (host, int(port))), daemon=True)
        )
    for t in threads:
        t.start()
    print(json.dumps({"ports": ports}), flush=True)
    _control()  # until stdin closes: then the process ends


if __name__ == "__main__":
    main()
