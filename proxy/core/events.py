"""Every event the sans-I/O session takes, in one module: what happened, typed.

The fronts (the WebSocket connection, the HTTP exchange) are the only callers of the session:
they turn what happened into one of these and hand it to `Session.handle`, which returns the
actions to execute (proxy/core/actions.py). Three kinds:

- **from the client**: a WebSocket text frame (`ClientMessage`), a plain HTTP create
  (`HttpCreate`), the client gone or no longer reading (`ClientGone`, `ClientStalled`);
- **from the server's life**: the drain beginning and its grace ending, the connection's
  lifetime over (`DrainBegun`, `DrainOver`, `LifetimeOver`);
- **from the upstream request of a run** (proxy/upstream/runner.py reports them): the replica
  it went to, each raw chunk of its body, its end, its failure, its input refused by the
  moderation hook (`Routed`, `UpstreamChunk`, `UpstreamEnded`, `UpstreamFailed`,
  `InputRefused`);
- **replies to the session's own requests**, each naming the action it answers:
  `StoredLoaded` (a `LoadStored`), `StoredSaved` (a `SaveStored`), `SummaryDone` and
  `SummaryFailed` (a `Summarise`), `TokensCounted` (one job of a `CountTokens`).

A reply for a run that has ended meanwhile (cancelled, the client gone) is ignored.
"""

from __future__ import annotations

from typing import Any

from .actions import CountTokens, LoadStored, SaveStored, StartUpstream, Summarise
from .context.manager import SummaryResult
from .context.tokens import TokenJob
from .errors import ProxyError, UpstreamError
from .records import record
from .store import StoredResponse, WriteResult

# ---- the client


@record()
class ClientMessage:
    """One WebSocket text frame from the client, as received."""

    data: str | bytes


@record()
class HttpCreate:
    """One plain HTTP `POST /v1/responses`: its body (a JSON object) and its size."""

    body: dict[str, Any]
    nbytes: int


@record()
class ClientStalled:
    """A write of `run_id`'s events stayed blocked for `timeout` seconds."""

    run_id: int
    timeout: float


@record()
class ClientGone:
    """The socket closed, or the HTTP client left."""


# ---- the server's life


@record()
class DrainBegun:
    """The server drains: later creates are refused, the runs there finish."""


@record()
class DrainOver:
    """The drain's grace is over: whatever still runs is cut."""


@record()
class LifetimeOver:
    """The connection's lifetime is up (docs/protocol.md "Limits")."""


# ---- the upstream request of a run


@record()
class Routed:
    """The request of `start` went to `replica` (upstream/pool.py)."""

    start: StartUpstream
    replica: str


@record()
class PromptTokenized:
    """The token path: the server tokenised the text of the run's prompt that is not kept
    (core/tokens/dialect.py), one list of `ids` per gap; the prompt sent is the kept ids
    and these, in place."""

    run_id: int
    ids: list[list[int]]


@record()
class UpstreamChunk:
    """One raw chunk of the upstream's event stream, as read."""

    run_id: int
    data: bytes


@record()
class UpstreamEnded:
    """The upstream's body ended."""

    run_id: int


@record()
class UpstreamFailed:
    """The upstream request failed: an error status, a connect error, a stall, a cut."""

    run_id: int
    error: UpstreamError


@record()
class InputRefused:
    """The moderation hook refused the new input of `start` (a `ClientError`), or could not
    answer and fails closed; no model request was made."""

    start: StartUpstream
    error: ProxyError


# ---- replies to the session's own requests


@record()
class StoredLoaded:
    """The answer to `request`: the stored parent, None when it is not stored for the
    credential, `unavailable` when the store could not answer."""

    request: LoadStored
    stored: StoredResponse | None
    unavailable: bool = False


@record()
class StoredSaved:
    """The answer to `request`: stored, the id already stored (never overwritten), or the
    write dropped (the store unavailable)."""

    request: SaveStored
    result: WriteResult


@record()
class SummaryDone:
    """The summarising request `request` of a compaction finished."""

    request: Summarise
    result: SummaryResult


@record()
class SummaryFailed:
    request: Summarise
    error: UpstreamError


@record()
class TokensCounted:
    """The upstream's tokenizer counted the items of `job`, one of `request`'s, exactly."""

    request: CountTokens
    job: TokenJob
    counts: tuple[int, ...]


Event = (
    ClientMessage
    | HttpCreate
    | ClientStalled
    | ClientGone
    | DrainBegun
    | DrainOver
    | LifetimeOver
    | Routed
    | PromptTokenized
    | UpstreamChunk
    | UpstreamEnded
    | UpstreamFailed
    | InputRefused
    | StoredLoaded
    | StoredSaved
    | SummaryDone
    | SummaryFailed
    | TokensCounted
)

__all__ = [
    "ClientGone",
    "ClientMessage",
    "ClientStalled",
    "DrainBegun",
    "DrainOver",
    "Event",
    "HttpCreate",
    "InputRefused",
    "LifetimeOver",
    "PromptTokenized",
    "Routed",
    "StoredLoaded",
    "StoredSaved",
    "SummaryDone",
    "SummaryFailed",
    "TokensCounted",
    "UpstreamChunk",
    "UpstreamEnded",
    "UpstreamFailed",
]
