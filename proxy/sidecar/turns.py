"""One `POST /v1/responses` through the sidecar, as its console and its traces see it.

Every such request is one turn, however it went: a continuation or the whole request on an
upstream WebSocket (the `Exchange`), or relayed over plain HTTP as it was. `Turn` is made when
the request's body has been read and finished when its answer is: it publishes the console's
turn event, makes a turn that failed after its 200 stream began one of the console's recent
errors (the middleware sees only the 200), and ends the turn's span (tracing on).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..ops.console_feed import ConsoleFeed
from ..ops.middleware import CLIENT_CLOSED
from ..ops.telemetry import sidecar_turn
from . import console
from .chains import Plan
from .exchange import Exchange

if TYPE_CHECKING:
    from ..ops.otel_sidecar import SidecarTurn

FAILED = ("failed", "error")  # the relay's outcomes of a response that did not end well


@dataclass
class Turn:
    request: web.Request
    raw: bytes  # the body the HTTP client sent
    body: dict[str, Any] | None  # that body, when it is a JSON object
    feed: ConsoleFeed | None
    number: Callable[[], int]  # the turn's number on the console, taken when it is shown
    began: float = field(default_factory=time.monotonic)
    span: SidecarTurn | None = None
    plan: Plan | None = None
    exchange: Exchange | None = None
    over_http: bool = False

    def __post_init__(self) -> None:
        model = self.body.get("model") if self.body is not None else None
        self.span = sidecar_turn(self.request, model if isinstance(model, str) else None)

    def finish(self, answer: web.StreamResponse | None, error: BaseException | None) -> None:
        """The turn is over: `answer` is what the client got, or `error` what ended it (the
        client left, or an exception the middleware answers)."""
        left = isinstance(error, (ConnectionError, asyncio.CancelledError))
        status = answer.status if answer is not None else CLIENT_CLOSED if left else 500
        ex = self.exchange
        if self.over_http or ex is None:
            via, outcome, sent = "http", "relayed" if status < 400 else "error", len(self.raw)
            response_id: str | None = None
            output: list[Any] = []
            response = failure = None
        elif ex.done is not None:
            relay = ex.relay
            via, outcome, sent = "delta" if relay.delta else "full", ex.done.outcome, ex.sent_bytes
            response_id, output, response = relay.response_id, relay.output, relay.response
            failure = relay.failure if outcome in FAILED else None
        else:  # the client left before the answer was complete, or the turn broke
            via, sent = "delta" if ex.relay.delta else "full", ex.sent_bytes
            outcome = "client_left" if left else "error"
            response_id, output, response, failure = None, [], None, None
        if self.span is not None:
            self.span.finish(
                via=via,
                outcome=outcome,
                status=status,
                client_bytes=len(self.raw),
                sent_bytes=sent,
                retries=ex.retries if ex is not None else 0,
                response=response,
                error=(failure[1] or "error") if failure is not None else None,
            )
        if self.feed is None or (ex is not None and ex.done is None and not self.over_http):
            return
        number = self.number()
        self.feed.publish(
            console.turn(
                self.feed,
                number,
                self.plan,
                via,
                len(self.raw),
                sent,
                outcome,
                response_id,
                output,
                time.monotonic() - self.began,
                self.body,
                status,
            )
        )
        if failure is not None and status < 400:  # after the 200: the middleware saw none
            where = f"sidecar {self.feed.shown_id(response_id) or f'turn {number}'}"
            self.feed.error(where, failure[0], failure[1], failure[2])
