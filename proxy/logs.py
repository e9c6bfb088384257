"""Logging set-up for the command line. Library code only ever calls `logging.getLogger`.

Two formats: `text` (one line per record) and `json` (one JSON object per line, for log
shippers). Every record carries the request id of the HTTP request or WebSocket connection it
belongs to (`request_id_var`, set by the ops middleware and inherited by every task a handler
starts). Payloads are never logged, only event types and sizes; credentials are never logged
either, and as a second line of defence a filter masks anything shaped like a bearer token or
an API key before a record is written.

A fault that repeats (a process out of descriptors, an upstream that is down) must not fill
the disk: a WARNING or worse line is written at most `server.log_repeat_limit` times per
10 seconds per message template (`RepeatFilter`); the next one written after that says how
many were left out.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass

from .core import wire

request_id_var: ContextVar[str | None] = ContextVar("wsmode_request_id", default=None)

# `Bearer <token>`, `Basic <token>`, key-looking strings (sk-..., any long token after
# "key") and the password of a URL (`http://user:PASSWORD@host`) or its lone user name
# (`http://TOKEN@host`), and the value of a URL's credential-bearing query parameter
# (`?password=...`, `&token=...`), as core/urls.py shows them.
# Conservative: a false positive costs a masked word in a log line.
_SECRET = re.compile(
    r"(?i)\b(bearer|basic)\s+[^\s,;\"']+"
    r"|\b(sk|rk|pk)-[A-Za-z0-9_\-]{8,}"
    r"|(api[_-]?key|authorization|token|secret)([\"']?\s*[:=]\s*[\"']?)"
    r"(?:(?:bearer|basic)\s+)?[^\s,;\"'}]+"
    r"|\b([a-z][a-z0-9+.-]*://[^/\s:@]*:)[^/\s@]+@"
    r"|\b([a-z][a-z0-9+.-]*://)[^/\s:@]+@"
    r"|([?&;][^\s&;=?#\"']*(?:pass|pwd|token|key|secret|auth|sig|credential|session)"
    r"[^\s&;=?#\"']*=)[^\s&;#\"']+"
)


def redact(text: str) -> str:
    def mask(m: re.Match[str]) -> str:
        if m.group(1):
            return f"{m.group(1)} <redacted>"
        if m.group(3):
            return f"{m.group(3)}{m.group(4)}<redacted>"
        if m.group(5):
            return f"{m.group(5)}<redacted>@"
        if m.group(6):
            return f"{m.group(6)}<redacted>@"
        if m.group(7):
            return f"{m.group(7)}<redacted>"
        return "<redacted>"

    return _SECRET.sub(mask, text)


class ContextFilter(logging.Filter):
    """Adds `request_id` to every record and masks secrets in its rendered message."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = request_id_var.get()
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


@dataclass(slots=True)
class _Window:
    start: float
    written: int = 1
    dropped: int = 0


class RepeatFilter(logging.Filter):
    """At most `limit` records of WARNING or above per message template (logger, level,
    unformatted message) in each `window` seconds; the others are dropped and counted, and
    the first record let through afterwards carries the count. Below WARNING nothing is
    dropped: one line per connection or response is bounded by the work itself."""

    MAX_KEYS = 1024  # templates tracked (they are few; a flood of distinct ones is a bug)

    def __init__(
        self, limit: int, window: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.limit = limit
        self.window = window
        self.clock = clock
        self._seen: dict[tuple[str, int, str], _Window] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if self.limit <= 0 or record.levelno < logging.WARNING:
            return True
        key = (record.name, record.levelno, str(record.msg))
        now = self.clock()
        seen = self._seen.get(key)
        if seen is not None and now - seen.start < self.window:
            if seen.written < self.limit:
                seen.written += 1
                return True
            seen.dropped += 1
            return False
        if seen is None and len(self._seen) >= self.MAX_KEYS:
            del self._seen[next(iter(self._seen))]  # the oldest template
        self._seen[key] = _Window(now)
        if seen is not None and seen.dropped:
            record.msg = (
                f"{record.getMessage()} [{seen.dropped} more like this left out of the log "
                f"in the last {self.window:g} s]"
            )
            record.args = None
        return True


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        rid = getattr(record, "request_id", None)
        if rid:
            line = f"{line} [request_id={rid}]"
        return redact(line) if record.exc_info else line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,  # which worker logged it (server.workers)
        }
        rid = getattr(record, "request_id", None)
        if rid:
            doc["request_id"] = rid
        if record.exc_info:
            doc["exception"] = redact(self.formatException(record.exc_info))
        return wire.dumps(doc).decode()


def configure(level: str = "INFO", fmt: str = "text", repeat_limit: int = 20) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(RepeatFilter(repeat_limit))
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
