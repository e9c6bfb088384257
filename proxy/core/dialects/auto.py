"""`upstream.api = "auto"`: Responses or Chat Completions, decided once per upstream.

Until it is decided, requests go to `/responses` (the native format; a poor stream is
repaired). The decision comes from whichever happens first: the adapter's start-up probe
(`decide`), a `/responses` request that streams (Responses), or one refused with 404 or 405
(Chat Completions, and that request is rebuilt and sent again as Chat). The decision is
logged and reported by `name` (shown in /healthz). When the probe found neither API at the
URL (`url_looks_wrong`: both answered 404), a request's 404 decides nothing either: it goes
back to the client naming the URL, and the dialect stays undecided until the URL is fixed.
"""

from __future__ import annotations

import logging
from typing import Any

from . import Dialect, StreamTranslator
from .chat import ChatDialect
from .responses import ResponsesDialect, ResponsesStream

log = logging.getLogger("wsmode.upstream")

REFUSED = frozenset({404, 405})


class AutoDialect:
    def __init__(self, responses: ResponsesDialect, chat: ChatDialect) -> None:
        self.responses = responses
        self.chat = chat
        self.choice: Dialect | None = None
        self.reason = ""
        self.url_looks_wrong = False  # the probe found neither API there (upstream/probe.py)

    @property
    def name(self) -> str:
        """`chat (auto)`, `responses (auto)`, or `auto (undecided)`."""
        return f"{self.choice.name} (auto)" if self.choice is not None else "auto (undecided)"

    @property
    def path(self) -> str:
        return self._current().path

    def decide(self, choice: Dialect, reason: str) -> None:
        if self.choice is not None:
            return
        self.choice, self.reason = choice, reason
        log.info("upstream.api=auto: using the %s dialect (%s)", choice.name, reason)

    def body(
        self, settings: dict[str, Any], extra: dict[str, Any], items: list[bytes]
    ) -> list[bytes]:
        return self._current().body(settings, extra, items)

    def translator(self, patch: dict[str, Any], request: dict[str, Any]) -> StreamTranslator:
        stream = self._current().translator(patch, request)
        if isinstance(stream, ResponsesStream) and self.choice is None:
            stream.on_first_event = self._responses_streamed
        return stream

    def retry_elsewhere(self, status: int, stream: StreamTranslator) -> bool:
        if status not in REFUSED or not isinstance(stream, ResponsesStream):
            return False
        if self.url_looks_wrong and status == 404:  # not the dialect: the URL (see above)
            return False
        self.decide(self.chat, f"the upstream answered {status} to POST /responses")
        return self.choice is self.chat

    def _current(self) -> Dialect:
        return self.choice if self.choice is not None else self.responses

    def _responses_streamed(self) -> None:
        self.decide(self.responses, "the upstream streamed a /responses request")
