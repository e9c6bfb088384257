"""Every action the sans-I/O core returns, in one module.

The core (`Session`, and the `ContextManager` through it) never does I/O: each input returns
a list of these, and an adapter (the WebSocket connection, the HTTP exchange) executes them in
order. Every executor ends in an exhaustive `match` over `Action`, so a new action that some
adapter forgets is a type error, not a silently dropped step.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .context.manager import TokenJob
    from .store import StoredResponse


class Outcome(enum.StrEnum):
    """How a run ended: the closed set `Finished` reports. The values are what metrics
    labels (`wsmode_responses_total{outcome=...}`) and usage records carry."""

    COMPLETED = "completed"  # response.completed
    INCOMPLETE = "incomplete"  # response.incomplete from the upstream (max tokens, ...)
    FAILED = "failed"  # response.failed, or an upstream failure the proxy reported
    REJECTED = "rejected"  # refused before the upstream was asked (a client error)
    CANCELLED = "cancelled"  # response.cancel (docs/protocol.md "response.cancel")
    WARMUP = "warmup"  # generate: false (docs/protocol.md "response.create"): no upstream call
    # ended incomplete at an item boundary for a steer (docs/protocol.md "response.steer")
    STEERED = "steered"


@dataclass(slots=True)  # not frozen: one is made per event, and frozen init costs twice
class Send:
    frame: bytes  # one JSON object, sent as one text frame


@dataclass(frozen=True, slots=True)
class RunCreated:
    """A run exists from now on: a create was queued, or a steer's automatic successor.
    Adapters start tracing it here (the client's message size is known to them)."""

    run_id: int
    # what the console shows of the turn (proxy/console): its lane, the response it
    # continues, and its new input items (their text is read only with console.show_content);
    # descriptive only, so not part of equality
    lane: str | None = field(default=None, compare=False)
    previous_response_id: str | None = field(default=None, compare=False)
    input: tuple[bytes, ...] = field(default=(), compare=False)


@dataclass(frozen=True, slots=True)
class Route:
    """Where a run's request should go, for the upstream pool to decide (upstream/pool.py):
    the replica that served the run's parent (None: a new chain, or one never served), and
    the key of the run's chain (core/routing.py), which also goes upstream as its session
    key. The adapter tells the session which replica it chose (`Session.routed`)."""

    replica: str | None
    chain: str


@dataclass(frozen=True, slots=True)
class StartUpstream:
    run_id: int
    body: list[bytes]  # pieces of the JSON body, concatenated by the adapter
    path: str  # appended to the upstream base URL
    # the new input's text, to moderate before the request goes out (core/guards.py); the
    # runner answers a refusal with `Session.input_refused`
    moderate: tuple[str, ...] | None = None
    route: Route | None = None  # where the request should go (upstream/pool.py)


@dataclass(frozen=True, slots=True)
class CancelUpstream:
    """Stop reading the run's upstream request and close it (no draining: generation must
    stop there). The executor is the only place this is acted on."""

    run_id: int


@dataclass(frozen=True, slots=True)
class Close:
    code: int
    reason: str


@dataclass(frozen=True, slots=True)
class Finished:
    """A run ended; for logs, metrics and usage accounting."""

    run_id: int
    response_id: str | None
    outcome: Outcome
    usage: dict[str, Any] | None = None
    # the input checks refused the run's new input: the error's code ("no_tool_call" for a
    # tool output that answers no call); `wsmode_input_refusals_total{reason}` counts them
    refused: str | None = None
    replica: str | None = None  # the upstream replica that served the run (upstream/pool.py)
    cached_tokens: int | None = None  # prompt tokens the upstream reported served from its cache
    # the items the response ended with (the console shows the count; not part of equality)
    output_items: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class LoadStored:
    """Read the stored response `response_id` of `owner` from a remote store (Redis), then
    hand the answer to `Session.stored_loaded` (found, not found, or the store unavailable).
    The run waits in LOADING meanwhile (proxy/core/runs.py)."""

    run_id: int
    response_id: str
    owner: str


@dataclass(frozen=True, slots=True)
class SaveStored:
    """Write a finished response to a remote store before the next action (its terminal
    event) is executed, so that a client continuing elsewhere right after it finds it. The
    write is bounded by the store's timeout; a failed write is dropped and counted."""

    run_id: int
    stored: StoredResponse
    owner: str


@dataclass(frozen=True, slots=True)
class CountTokens:
    """Tokenize these items in the background, then call `ContextManager.record_counts`."""

    jobs: tuple[TokenJob, ...]


@dataclass(frozen=True, slots=True)
class Summarise:
    """Send this summarising request upstream and feed the outcome back
    (`Session.summary_done` / `Session.summary_failed`). Nothing of it reaches the client."""

    run_id: int
    body: list[bytes]
    path: str


Action = (
    Send
    | RunCreated
    | StartUpstream
    | CancelUpstream
    | Close
    | Finished
    | Summarise
    | CountTokens
    | LoadStored
    | SaveStored
)

__all__ = [
    "Action",
    "CancelUpstream",
    "Close",
    "CountTokens",
    "Finished",
    "LoadStored",
    "Outcome",
    "Route",
    "RunCreated",
    "SaveStored",
    "Send",
    "StartUpstream",
    "Summarise",
]
