"""The console's live feed: a bounded ring of recent events and the pages reading it.

The fronts' run tracking (`tracking.py`) publishes one small event per finished turn; the
middleware publishes the error answers it sees. `publish` never waits: it encodes the event
once, keeps it in a ring of the last `console.ring_size` events (what a page opening the
feed gets first), and offers it to every subscriber. A subscriber is one open feed (one
console page); each holds at most `console.subscriber_queue` events its page has not taken
yet. One past that is a page too slow to keep up: it is dropped at once (its queue freed, its
socket closed; the page reconnects and starts again from the ring), so a page that stops
reading can never hold up a turn or grow the proxy's memory. At most
`console.max_subscribers` pages read at once.

The snapshot every page gets each `console.state_interval` (`state`) is computed once per
interval, on a clock every page shares, and the same bytes go to them all: eight pages cost
what one does.

Nothing here reads payload text unless `console.show_content` is true: events carry ids,
counts, byte sizes, timings, outcomes and error codes. Response ids are shown whole only
with `console.show_content` too: an id is what `GET /v1/responses/{id}/input_items` and
`DELETE /v1/responses/{id}` take, so with content hidden the feed carries `short_id`'s form
(`resp_0123abcd…`), enough to tell turns apart and link a conversation's, never to name one.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from ..config import ConsoleSettings
from ..core import wire

# characters of text kept per turn side (input, output) and per error message, with
# console.show_content: enough to recognise a turn, bounded so an event stays small
TEXT_LIMIT = 2000
RECENT_ERRORS = 50  # errors the snapshot keeps after they left the ring
ID_SHOWN = 8  # characters of an id's random part the console shows with content hidden


def short_id(value: str | None) -> str | None:
    """`resp_0123456789abcdef…` -> `resp_01234567…`: its prefix, the first `ID_SHOWN`
    characters of the rest (a quarter of it at most) and an ellipsis."""
    if value is None:
        return None
    prefix, sep, rest = value.partition("_")
    if not sep:
        prefix, rest = "", value
    return f"{prefix}{sep}{rest[: min(ID_SHOWN, len(rest) // 4)]}…"


class Subscriber:
    """One open feed: the events its page has not taken yet, at most `limit`."""

    def __init__(self, limit: int, on_drop: Callable[[], None]) -> None:
        self.limit = limit
        self.pending: deque[bytes] = deque()
        self.ready = asyncio.Event()
        self.dropped = False
        self._on_drop = on_drop

    def offer(self, frame: bytes) -> bool:
        """Queue `frame`; False (and dropped) when the page is `limit` events behind."""
        if self.dropped:
            return False
        if len(self.pending) >= self.limit:
            self.drop()
            return False
        self.pending.append(frame)
        self.ready.set()
        return True

    def drop(self) -> None:
        if self.dropped:
            return
        self.dropped = True
        self.pending.clear()
        self.ready.set()  # the writer wakes, sees `dropped`, and ends the feed
        self._on_drop()

    def take(self) -> list[bytes]:
        """Every queued frame, oldest first; the queue is empty after."""
        out = list(self.pending)
        self.pending.clear()
        self.ready.clear()
        return out


class ConsoleFeed:
    def __init__(self, settings: ConsoleSettings, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.show_content = settings.show_content
        self.clock = clock
        self.ring: deque[bytes] = deque(maxlen=settings.ring_size)
        self.errors: deque[dict[str, Any]] = deque(maxlen=RECENT_ERRORS)
        self.subscribers: set[Subscriber] = set()
        self.published = 0
        self.dropped = 0  # subscribers dropped for being too slow
        # the snapshot's source (proxy/console/state.py, set when the routes are added), and
        # the last one computed: its interval's number and its bytes
        self.source: Callable[[], dict[str, Any]] | None = None
        self.snapshots = 0  # snapshots computed
        self._state: tuple[int, bytes] | None = None

    # ---- pages
    def subscribe(self, on_drop: Callable[[], None]) -> tuple[Subscriber, list[bytes]] | None:
        """A new subscriber and the ring's events to send it first; None when
        `max_subscribers` pages already read (the caller answers 503)."""
        if len(self.subscribers) >= self.settings.max_subscribers:
            return None
        sub = Subscriber(self.settings.subscriber_queue, on_drop)
        self.subscribers.add(sub)
        return sub, list(self.ring)

    def unsubscribe(self, sub: Subscriber) -> None:
        self.subscribers.discard(sub)

    def drop(self, sub: Subscriber) -> None:
        """Drop a page that takes nothing (its writer waited too long on it)."""
        if sub in self.subscribers:
            self.subscribers.discard(sub)
            self.dropped += 1
        sub.drop()

    def shown_id(self, value: str | None) -> str | None:
        """A response id as the feed may carry it: whole only with `show_content`."""
        return value if self.show_content else short_id(value)

    # ---- snapshots
    def tick(self, now: float) -> int:
        """The number of the state interval `now` (monotonic seconds) falls in."""
        return math.floor(now / self.settings.state_interval)

    def state(self, now: float) -> tuple[int, bytes]:
        """This interval's snapshot, encoded, and the interval's number: computed by the
        first page to ask in an interval, the same bytes for the others."""
        tick = self.tick(now)
        if self._state is None or self._state[0] != tick:
            assert self.source is not None
            self.snapshots += 1
            self._state = (tick, orjson.dumps(self.source()))
        return self._state

    # ---- events
    def publish(self, event: dict[str, Any]) -> None:
        """Keep `event` in the ring and offer it to every page. Never waits."""
        event.setdefault("time", self.clock())
        # once per turn, beside the data path; kept in the ring, so at its own size (as
        # core/wire.py `dumps_kept`, inlined: the walk counts each call into core/)
        frame = bytes(memoryview(orjson.dumps(event)))
        self.ring.append(frame)
        self.published += 1
        for sub in list(self.subscribers):
            if not sub.offer(frame):
                self.subscribers.discard(sub)
                self.dropped += 1

    def error(self, where: str, status: int | None, code: str | None, message: str | None) -> None:
        """An error answered to a client (a turn's `error` event, a refused request)."""
        event: dict[str, Any] = {
            "type": "error",
            "time": self.clock(),
            "where": where,
            "status": status,
            "code": code,
        }
        if self.show_content and message:
            event["message"] = message[:TEXT_LIMIT]
        self.errors.append(event)
        self.publish(dict(event))

    def http_error(self, method: str, route: str, status: int, body: bytes | None) -> None:
        """An HTTP answer of 400 or more, with the code of its JSON error body if it has
        one (every error the proxy writes does)."""
        code: str | None = None
        message: str | None = None
        if body is not None and len(body) <= 65536:
            err = _error_object(body)
            if err is not None:
                code, message = _str(err.get("code")), _str(err.get("message"))
        self.error(f"{method} {route}", status, code, message)


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _error_object(body: bytes) -> dict[str, Any] | None:
    try:
        doc = wire.loads(body)
    except ValueError:
        return None
    err = doc.get("error") if isinstance(doc, dict) else None
    return err if isinstance(err, dict) else None


def texts(items: Iterable[Any], limit: int = TEXT_LIMIT) -> str:
    """The readable text of Responses items (messages, tool calls and their outputs), at
    most `limit` characters: what `console.show_content` shows of a turn."""
    out: list[str] = []
    size = 0

    def add(text: str) -> None:
        nonlocal size
        if size < limit and text:
            out.append(text[: limit - size])
            size += len(out[-1])

    def walk(value: Any, depth: int) -> None:
        if size >= limit or depth > 6:
            return
        if isinstance(value, dict):
            for key in ("content", "text", "arguments", "output", "summary"):
                part = value.get(key)
                if isinstance(part, str):
                    add(part)
                elif isinstance(part, list):
                    walk(part, depth + 1)
        elif isinstance(value, list):
            for part in value:
                walk(part, depth + 1)

    walk(list(items), 0)
    return "\n".join(out)


def output_texts(response: dict[str, Any] | None) -> str:
    """The output text of a turn's final response object."""
    output = response.get("output") if response else None
    return texts(output) if isinstance(output, list) else ""


def input_texts(items: Iterable[bytes]) -> str:
    parsed: list[Any] = []
    for raw in items:
        try:
            parsed.append(wire.loads(raw))
        except ValueError:
            continue
    return texts(parsed)
