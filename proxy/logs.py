"""Logging set-up for the command line. Library code only ever calls `logging.getLogger`.

Two formats: `text` (one line per record) and `json` (one JSON object per line, for log
shippers). Every record carries the request id of the HTTP request or WebSocket connection it
belongs to (`request_id_var`, set by the ops middleware and inherited by every task a handler
starts). Payloads are never logged, only event types and sizes; credentials are never logged
either, and as a second line of defence a filter masks anything shaped like a bearer token or
an API key before a record is written.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from contextvars import ContextVar

from .core import wire

request_id_var: ContextVar[str | None] = ContextVar("wsmode_request_id", default=None)

# `Bearer <token>`, `Basic <token>`, key-looking strings (sk-..., any long token after
# "key") and the password of a URL (`http://user:PASSWORD@host`, as core/urls.py shows it).
# Conservative: a false positive costs a masked word in a log line.
_SECRET = re.compile(
    r"(?i)\b(bearer|basic)\s+[^\s,;\"']+"
    r"|\b(sk|rk|pk)-[A-Za-z0-9_\-]{8,}"
    r"|(api[_-]?key|authorization|token|secret)([\"']?\s*[:=]\s*[\"']?)"
    r"(?:(?:bearer|basic)\s+)?[^\s,;\"'}]+"
    r"|\b([a-z][a-z0-9+.-]*://[^/\s:@]*:)[^/\s@]+@"
)


def redact(text: str) -> str:
    def mask(m: re.Match[str]) -> str:
        if m.group(1):
            return f"{m.group(1)} <redacted>"
        if m.group(3):
            return f"{m.group(3)}{m.group(4)}<redacted>"
        if m.group(5):
            return f"{m.group(5)}<redacted>@"
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
        }
        rid = getattr(record, "request_id", None)
        if rid:
            doc["request_id"] = rid
        if record.exc_info:
            doc["exception"] = redact(self.formatException(record.exc_info))
        return wire.dumps(doc).decode()


def configure(level: str = "INFO", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
