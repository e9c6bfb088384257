"""One connection's share of the event loop: how fast its messages are read.

Every message a client sends costs the event loop the same whatever the client's intent: a
client sending tens of thousands of small frames a second otherwise takes the loop from
everyone else (another client's turn latency went from 11 ms to 1.3 s). So each WebSocket
connection has two token buckets, messages and bytes per second, each allowing a burst of
one second's worth (and at least one largest message). A message past them is not refused:
the connection's reader waits until the bucket has refilled. While it waits, aiohttp's
bounded read queue fills and the socket stops being read, so TCP pushes back on the client:
a flooding client slows itself, and nothing it sent is lost or reordered.
"""

from __future__ import annotations


class Bucket:
    """A token bucket that may go into debt: `take` always succeeds and says how long the
    taker should wait to stay within `rate` per second (0 when it is within it)."""

    __slots__ = ("burst", "last", "rate", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.last = now

    def take(self, amount: float, now: float) -> float:
        if self.rate <= 0:
            return 0.0
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        self.tokens -= amount
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


class ReadRate:
    """The two bounds of one connection: `server.max_frames_per_second` and
    `server.max_bytes_per_second` (0 turns one off)."""

    __slots__ = ("bytes", "frames")

    def __init__(
        self, frames_per_second: float, bytes_per_second: float, max_message: int, now: float
    ) -> None:
        self.frames = Bucket(frames_per_second, max(frames_per_second, 1.0), now)
        self.bytes = Bucket(bytes_per_second, max(bytes_per_second, float(max_message)), now)

    def wait(self, size: int, now: float) -> float:
        """Seconds to wait before handling a message of `size` bytes received at `now`."""
        return max(self.frames.take(1, now), self.bytes.take(size, now))
