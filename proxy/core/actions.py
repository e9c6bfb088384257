"""Every action the sans-I/O core returns, in one module.

The core (`Session`, and the `ContextManager` through it) never does I/O: each event it is
handed (proxy/core/events.py) returns a list of these, and the one executor
(proxy/executor.py) carries them out in order, with each front's hooks. The executor
ends in an exhaustive `match` over `Action`, so a new action it forgets is a type error, not a
silently dropped step. Actions that ask for something the core cannot do itself
(`LoadStored`, `SaveStored`, `Summarise`) are answered by an event that names them
(`StoredLoaded`, `StoredSaved`, `SummaryDone`); observers (metrics, usage, the console) read
`RunCreated` and `Finished`, never frames.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .records import record

if TYPE_CHECKING:
    from .context.tokens import TokenJob
    from .errors import ProxyError
    from .store import StoredResponse
    from .tokens.chain import TokenUse
    from .tokens.dialect import TokenPrompt


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
    """One event for the client: `frame` is its JSON, sent as one WebSocket text frame or
    one SSE event. What an HTTP answer needs of it is typed beside it, never parsed back:
    `error` (and its `seq`), the failure an `error` event renders; `final`, a run's terminal
    response object, on its terminal event."""

    frame: bytes
    error: ProxyError | None = field(default=None, compare=False)
    seq: int | None = field(default=None, compare=False)
    final: dict[str, Any] | None = field(default=None, compare=False)


@record()
class Relay:
    """Frames for the client with nothing typed beside them: the ordinary events of one
    upstream chunk (deltas, item events) as the dialect's translator returned them (from a
    Responses upstream, its own bytes), in one action instead of one `Send` each."""

    frames: list[bytes]


def frames_of(actions: Iterable[Action]) -> list[bytes]:
    """The client's frames among `actions`, in order."""
    out: list[bytes] = []
    for action in actions:
        if isinstance(action, Send):
            out.append(action.frame)
        elif isinstance(action, Relay):
            out += action.frames
    return out


@record()
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
    model: str | None = field(default=None, compare=False)  # the request's (for tracing)
    # the create's `client_metadata` (the client's own, never sent upstream): where a client
    # puts its trace context per message (docs/telemetry.md)
    client_metadata: dict[str, Any] | None = field(default=None, compare=False)


@record()
class Route:
    """Where a run's request should go, for the upstream pool to decide (upstream/pool.py):
    the replica that served the run's parent (None: a new chain, or one never served), and
    the key of the run's chain (core/routing.py), which also goes upstream as its session
    key. The runner reports the replica it chose (`Routed`)."""

    replica: str | None
    chain: str


@record()
class StartUpstream:
    run_id: int
    body: list[bytes]  # pieces of the JSON body, concatenated by the adapter
    path: str  # appended to the upstream base URL
    # the new input's text, to moderate before the request goes out (core/guards.py); the
    # runner reports a refusal (`InputRefused`) instead of making the request
    moderate: tuple[str, ...] | None = None
    route: Route | None = None  # where the request should go (upstream/pool.py)
    # the token path (core/tokens/dialect.py): the runner tokenises the prompt's gaps (the
    # text not kept), reports their ids (`PromptTokenized`) and sends `tokens.body(ids)`
    # instead of `body`
    tokens: TokenPrompt | None = None


@record()
class CancelUpstream:
    """Stop reading the run's upstream request and close it (no draining: generation must
    stop there). The executor is the only place this is acted on."""

    run_id: int


@record()
class Close:
    code: int
    reason: str


@record()
class Finished:
    """A run ended: everything logs, metrics, usage records and the console need of it, so
    that no observer reads frames back."""

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
    model: str | None = field(default=None, compare=False)  # the response's, else the request's
    # a failed or rejected run: the error the client got (its status, code and message)
    error: ProxyError | None = field(default=None, compare=False)
    # the final response object (None when the run never had one: refused before it began)
    response: dict[str, Any] | None = field(default=None, compare=False)
    # the token path: the prompt's ids reused from the cache and tokenised anew, and why a
    # continuation could not reuse all of its parent's (core/tokens/chain.py DIVERGENCES)
    tokens: TokenUse | None = field(default=None, compare=False)


@record()
class LoadStored:
    """Read the stored response `response_id` of `owner` from the response store (in this
    process, or Redis), then answer with `StoredLoaded` (found, not found, or the store
    unavailable). The run waits in LOADING meanwhile (proxy/core/runs.py)."""

    run_id: int
    response_id: str
    owner: str


@record()
class SaveStored:
    """Write a finished response to the response store, then answer with `StoredSaved`. The
    run waits in SAVING meanwhile and its terminal event goes out after the answer, so that a
    client continuing elsewhere right after it finds it. The write is bounded by the store's
    timeout; a failed write is dropped and counted; an id already stored is never
    overwritten."""

    run_id: int
    stored: StoredResponse
    owner: str


@record()
class CountTokens:
    """Tokenize these items in the background, then call `ContextManager.record_counts`."""

    jobs: tuple[TokenJob, ...]


@record()
class Summarise:
    """Send this summarising request upstream and answer with `SummaryDone` or
    `SummaryFailed`. Nothing of it reaches the client. `route`: the run's chain's, so the
    summary goes to the replica whose prompt cache holds the history it summarises."""

    run_id: int
    body: list[bytes]
    path: str
    route: Route | None = None


Action = (
    Send
    | Relay
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
    "Relay",
    "Route",
    "RunCreated",
    "SaveStored",
    "Send",
    "StartUpstream",
    "Summarise",
    "frames_of",
]
