"""Incremental Server-Sent Events decoder (WHATWG HTML, "Parsing an event stream").

`feed()` takes raw chunks exactly as the socket delivers them and returns the events they
complete. Lines end with CR, LF or CRLF, even when a CRLF pair is split across two chunks.
A `data:` value keeps its bytes, so events we only forward are never decoded or parsed.

Unlike aiohttp's line reader (which fails on lines over 128 KiB), the only bound is ours:
`max_event_bytes` caps one event's accumulated size, and exceeding it raises
`SSEEventTooLarge`: the upstream's failure (502 `upstream_event_too_large`), as the session
and the summarising requests report it.
"""

from __future__ import annotations

from .errors import UpstreamError
from .records import record


class SSEEventTooLarge(UpstreamError):
    """One event grew past the configured bound: the upstream's fault, mid-stream."""

    def __init__(self, message: str) -> None:
        super().__init__(message, started=True, code="upstream_event_too_large")


@record()
class SSEEvent:
    event: str | None  # the `event:` field, None when absent (the spec's "message")
    data: bytes  # the `data:` lines joined with b"\n"


class SSEDecoder:
    def __init__(self, max_event_bytes: int) -> None:
        self._max = max_event_bytes
        self._buf = bytearray()  # bytes of the current, unfinished line
        self._skip_lf = False  # the previous chunk ended with CR: a leading LF belongs to it
        self._event: str | None = None
        self._data: list[bytes] = []
        self._size = 0  # bytes accumulated for the current event

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if not self._skip_lf and b"\r" not in chunk:
            return self._feed_lf(chunk)
        out: list[SSEEvent] = []
        pos, n = 0, len(chunk)
        if self._skip_lf and n:
            if chunk[0] == 0x0A:
                pos = 1
            self._skip_lf = False
        while pos < n:
            lf = chunk.find(b"\n", pos)
            cr = chunk.find(b"\r", pos, lf if lf >= 0 else n)
            end = cr if cr >= 0 else lf
            if end < 0:  # no line terminator left: keep the tail for the next chunk
                self._grow(n - pos)
                self._buf += chunk[pos:]
                break
            if self._buf:
                self._grow(end - pos)
                self._buf += chunk[pos:end]
                line = bytes(self._buf)
                self._buf.clear()
            else:
                line = chunk[pos:end]
                self._grow(len(line))
            pos = end + 1
            if end == cr:
                if pos < n:
                    if chunk[pos] == 0x0A:
                        pos += 1
                else:
                    self._skip_lf = True
            ev = self._line(line)
            if ev is not None:
                out.append(ev)
        return out

    def _feed_lf(self, chunk: bytes) -> list[SSEEvent]:
        """The common case, LF line ends only: one split per chunk instead of a search per
        line, and the usual `data: ` / `event: ` lines handled inline. Same results and the
        same bound as the general path above."""
        out: list[SSEEvent] = []
        lines = chunk.split(b"\n")
        tail = lines.pop()  # after the last LF: the start of an unfinished line, or b""
        if lines and self._buf:  # the first line completes the one left by the last chunk
            self._grow(len(lines[0]))
            self._buf += lines[0]
            ev = self._line(bytes(self._buf))
            self._buf.clear()
            if ev is not None:
                out.append(ev)
            del lines[0]
        limit = self._max
        for line in lines:
            self._size += len(line)
            if self._size > limit:
                raise SSEEventTooLarge(f"SSE event larger than {limit} bytes")
            if line.startswith(b"data: "):
                self._data.append(line[6:])
            elif not line:
                if self._data:
                    out.append(SSEEvent(self._event, b"\n".join(self._data)))
                self._event, self._data, self._size = None, [], 0
            elif line.startswith(b"event: "):
                self._event = line[7:].decode("utf-8", "replace")
            else:
                self._line(line)  # never dispatches: only a blank line does
        if tail:
            self._grow(len(tail))
            self._buf += tail
        return out

    def close(self) -> list[SSEEvent]:
        """End of stream. Per the spec an unterminated last event is discarded."""
        self._buf.clear()
        self._event, self._data, self._size = None, [], 0
        return []

    def _grow(self, k: int) -> None:
        self._size += k
        if self._size > self._max:
            raise SSEEventTooLarge(f"SSE event larger than {self._max} bytes")

    def _line(self, line: bytes) -> SSEEvent | None:
        if not line:  # blank line: dispatch
            ev = None
            if self._data:
                ev = SSEEvent(self._event, b"\n".join(self._data))
            self._event, self._data, self._size = None, [], 0
            return ev
        if line[0] == 0x3A:  # ':' comment (keep-alives)
            return None
        colon = line.find(b":")
        if colon < 0:
            name, value = line, b""
        else:
            name, value = line[:colon], line[colon + 1 :]
            if value[:1] == b" ":
                value = value[1:]
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        # `id` and `retry` have no meaning for a one-shot POST stream; unknown fields are ignored
        return None
