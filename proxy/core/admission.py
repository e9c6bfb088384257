"""Admitting a `response.create`: its checks, and the bytes it holds while it waits.

A create is parsed and checked once, on arrival (docs/protocol.md "response.create"): a new
named lane must fit `max_lanes_per_connection`, the request must be valid (core/request.py,
then the context manager's checks), the queue must have room (`max_queued_per_connection`),
and its message's bytes must fit both the connection's `max_queued_bytes_per_connection` and
the process `MemoryBudget` (proxy/core/memory.py); past either it is refused with 429
`too_many_queued_requests`. An admitted create's bytes count against both until its run
starts or ends (`charge`, `discharge`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .errors import ClientError
from .memory import MemoryBudget
from .policy import SessionLimits
from .request import CreateRequest, check_stream_id, parse_create


class Admission:
    """One connection's admission rules and queued-bytes account."""

    def __init__(
        self,
        limits: SessionLimits,
        memory: MemoryBudget | None,
        check: Callable[[CreateRequest], None] | None = None,
    ) -> None:
        self.limits = limits
        self.memory = memory
        self.check = check  # the context manager's checks of a request that is not plain
        self.lanes: set[str] = set()  # named lanes ever used on this connection
        self.queued_bytes = 0
        self._waiting: dict[int, int] = {}  # run id -> bytes of its create, while queued

    def lane_of(self, body: dict[str, Any]) -> str | None:
        """The create's lane, checked first: every later refusal echoes it (an invalid one
        is never echoed: docs/protocol.md "Errors"). Raises ClientError."""
        return check_stream_id(body.get("stream_id"))

    def check_lane(self, lane: str | None) -> None:
        """A new named lane must fit `max_lanes_per_connection`. Raises ClientError."""
        if lane is not None and lane not in self.lanes:
            cap = self.limits.max_lanes_per_connection
            if len(self.lanes) >= cap:
                raise ClientError(
                    f"This connection already uses {cap} stream_ids.",
                    code="websocket_stream_limit_reached",
                    param="stream_id",
                )

    def admit(
        self,
        body: dict[str, Any],
        nbytes: int,
        queued: int,
        *,
        socket: bool = True,
    ) -> CreateRequest:
        """The create as a request, once every check passed; raises ClientError. `queued`:
        the creates already waiting; `socket`: a WebSocket message (over HTTP there are no
        lanes)."""
        req = parse_create(body, socket=socket, nbytes=nbytes)
        if self.check is not None and not req.plain:
            self.check(req)
        if queued >= self.limits.max_queued_per_connection:
            raise ClientError(
                f"Too many queued requests on this connection (limit "
                f"{self.limits.max_queued_per_connection}); wait for responses to finish.",
                code="too_many_queued_requests",
                status=429,
                type="rate_limit_error",
            )
        self._check_bytes(nbytes)
        if req.lane is not None:
            self.lanes.add(req.lane)
        return req

    def _check_bytes(self, nbytes: int) -> None:
        cap = self.limits.max_queued_bytes_per_connection
        if self.queued_bytes + nbytes > cap:
            text = f"this connection's queued requests would exceed {cap} bytes"
        elif self.memory is not None and not self.memory.can_queue(nbytes):
            self.memory.refused += 1
            text = "the server's memory budget for waiting requests is used up"
        else:
            return
        raise ClientError(
            f"Too many queued requests: {text}; wait for responses to finish.",
            code="too_many_queued_requests",
            status=429,
            type="rate_limit_error",
        )

    def charge(self, run_id: int, nbytes: int) -> None:
        """An admitted create of `nbytes` waits in the queue as run `run_id`."""
        self._waiting[run_id] = nbytes
        self.queued_bytes += nbytes
        if self.memory is not None:
            self.memory.queued += nbytes

    def discharge(self, run_id: int) -> None:
        """The run left the queue (it starts, or ends): its create's bytes no longer wait."""
        nbytes = self._waiting.pop(run_id, 0)
        if nbytes:
            self.queued_bytes -= nbytes
            if self.memory is not None:
                self.memory.queued -= nbytes


__all__ = ["Admission"]
