"""The one executor (proxy/executor.py) with the HTTP front's hooks, over the shared runner,
against a scripted upstream: `CancelUpstream` stops reading the request's only run and closes
its upstream request, a run that simply ends is drained, and `Close` is refused as a bug."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import make_mocked_request
from wsmode.app import create_app
from wsmode.config import load_settings
from wsmode.core.actions import Action, CancelUpstream, Close
from wsmode.core.events import ClientMessage, Event, UpstreamChunk
from wsmode.executor import Leave
from wsmode.http_front.responses import HttpExchange
from wsmode.runtime import APP_STATE

from tests.support.session import assistant, created, is_active, item_done, terminal


class ScriptedUpstream:
    """Answers every request with `chunks`; records how the runner left the stream."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.read = 0
        self.left: str | None = None  # "drained" (normal exit) or "abandoned" (exception)

    @contextlib.asynccontextmanager
    async def stream(
        self,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        on_sent: Callable[[], None] | None = None,
        **replica: Any,  # the pool's replica: base_url, gate
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        if on_sent is not None:
            on_sent()

        async def chunks() -> AsyncIterator[bytes]:
            for chunk in self.chunks:
                self.read += 1
                yield chunk

        try:
            yield chunks()
        except BaseException:
            self.left = "abandoned"
            raise
        self.left = "drained"


def _sse(ev: dict[str, Any]) -> bytes:
    return b"event: " + ev["type"].encode() + b"\ndata: " + orjson.dumps(ev) + b"\n\n"


EVENTS = [
    _sse(created("resp_1")),
    _sse(item_done(1, assistant("hi"))),
    _sse(terminal("resp_1", 2, [assistant("hi")])),
]


def _exchange(upstream: ScriptedUpstream) -> HttpExchange:
    settings = load_settings(None, {}, {"upstream.url": "http://127.0.0.1:9/v1"})
    app = create_app(settings)
    state = app[APP_STATE]
    state.upstream = state.pool.client = upstream  # type: ignore[assignment]
    request = make_mocked_request("POST", "/v1/responses", app=app)
    return HttpExchange(state, request, stream=False)


BODY = {"type": "response.create", "model": "m", "input": "hi", "store": False}


async def test_a_run_that_ends_is_drained() -> None:
    upstream = ScriptedUpstream(EVENTS)
    ex = _exchange(upstream)
    answer = await ex.run(dict(BODY))
    assert answer.status == 200
    assert upstream.left == "drained" and upstream.read == len(EVENTS)


async def test_cancel_upstream_stops_reading_the_run() -> None:
    upstream = ScriptedUpstream(EVENTS)
    ex = _exchange(upstream)
    session = ex.session
    real = session.handle

    def cancelling(event: Event) -> list[Action]:
        # the session ends the run from inside its stream, as a steer boundary would
        out = real(event)
        if isinstance(event, UpstreamChunk) and is_active(session, event.run_id):
            out += real(ClientMessage(b'{"type": "response.cancel"}'))
        return out

    session.handle = cancelling  # type: ignore[method-assign]
    await ex.run(dict(BODY))
    assert upstream.left == "abandoned"  # closed, not drained
    assert upstream.read == 1  # nothing read past the batch that cancelled
    assert not is_active(session, 1) and ex.pending == []


async def test_cancel_upstream_drops_a_start_not_yet_running() -> None:
    ex = _exchange(ScriptedUpstream([]))

    async def never() -> None:
        raise AssertionError("a cancelled start ran")

    ex.pending = [(3, never)]
    # no runner is reading run 3: nothing to leave
    assert await ex.executor.execute([CancelUpstream(3)]) is Leave.STAY
    assert ex.pending == []
    # the run whose events are being executed: its stream is left, closed
    assert await ex.executor.execute([CancelUpstream(4)], run_id=4) is Leave.CLOSE


async def test_close_is_a_bug_over_http() -> None:
    ex = _exchange(ScriptedUpstream([]))
    with pytest.raises(RuntimeError):
        await ex.executor.execute([Close(1001, "connection lifetime reached")])
