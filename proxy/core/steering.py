"""Mid-turn steering, emulated for stateless upstreams (docs/protocol.md "response.steer").

No stateless model server can take new input into a running generation, so the proxy does
what the steering contract allows: it accepts the input at once (`response.steer.accepted`),
lets the running response reach the end of its current output item, stops the upstream
there, ends the response `incomplete` with reason `steered` (finished items kept, cached),
and starts the successor itself: the queued input, chained with `previous_response_id`,
with the steered response's settings. If the response instead stops for client-owned tool
output (it emitted a function call), the steer waits: `response.steer.pending` lists the
`required_input` stubs, and the queued input goes into the client's next create on that
parent and lane, after the tool outputs that open it (so the outputs stay next to their
calls) and before the rest.

This module validates steer events, writes the steer events and keeps the steering state
(`Steering`, one per session): the steers accepted on each run (`Run.steers`), the steers a
run carries the input of (`Run.applies`), and the steers waiting for the client's create
after `response.steer.pending`. The session decides when a run ends; `Steering` says what
its steers become then. Each steer event written into a running response's stream shifts
the upstream's later sequence numbers by one (`Run.seq_offset`, applied by `Run.lane_frame`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import replace
from typing import Any

from . import wire
from .actions import Action, Send
from .conversation import ResponseCache
from .request import parse_create
from .runs import Run, Steer, SteerRequest

ALLOWED_FIELDS = frozenset({"type", "previous_response_id", "input"})
_PART_TYPES = frozenset({"input_text", "input_image", "input_file"})


class SteerRejected(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def parse_steer(msg: dict[str, Any]) -> SteerRequest:
    """Validate a `response.steer`: exactly `type`, `previous_response_id`, `input`, where
    input is a string or a non-empty list of user messages (docs/protocol.md "response.steer")."""
    extra = sorted(set(msg) - ALLOWED_FIELDS)
    if extra:
        raise SteerRejected("invalid_input", f"Unexpected field '{extra[0]}' in response.steer.")
    target = msg.get("previous_response_id")
    if not isinstance(target, str) or not target:
        raise SteerRejected("invalid_input", "'previous_response_id' must be a response id.")
    raw = msg.get("input")
    if isinstance(raw, str):
        if not raw:
            raise SteerRejected("invalid_input", "'input' must not be empty.")
        items = [{"type": "message", "role": "user", "content": raw}]
    elif isinstance(raw, list) and raw:
        items = [_user_message(m, i) for i, m in enumerate(raw)]
    else:
        raise SteerRejected("invalid_input", "'input' must be a string or a non-empty array.")
    try:  # the steer's own level and its input array hold the items: 2 levels
        kept = tuple(wire.dumps_within(i, wire.MAX_DEPTH - 2) for i in items)
    except wire.TooDeep:
        raise SteerRejected(
            "invalid_input", f"'input' nests more than {wire.MAX_DEPTH} levels deep."
        ) from None
    return SteerRequest(target, kept, raw)


class Steering:
    """The steering state of one connection (docs/protocol.md "response.steer"). Queued steer input
    exists only on this connection (step 5): `clear` forgets it when the socket goes."""

    def __init__(
        self,
        cache: ResponseCache,
        *,
        enabled: bool,
        max_pending: int,
        new_id: Callable[[str], str],
        next_run_id: Callable[[], int],
    ) -> None:
        self.cache = cache
        self.enabled = enabled
        self.max_pending = max_pending  # per run; eight times that across the connection
        self.new_id = new_id
        self.next_run_id = next_run_id
        # response id -> steers awaiting the client's create (read by the session, which
        # asks `apply_waiting` only when there are any)
        self.waiting: dict[str, list[Steer]] = {}

    def steer(
        self, msg: dict[str, Any], run: Run | None, runs: Collection[Run]
    ) -> tuple[list[Action], bool]:
        """A `response.steer` for `run` (the STREAMING run it names, None if there is none;
        `runs`: every run not yet done). Returns the event to send and whether the steer was
        accepted (then it is on `run.steers`)."""
        target = msg.get("previous_response_id")
        try:
            req = parse_steer(msg)
            if run is None:
                known = self.cache.peek(req.target) is not None or req.target in self.waiting
                if known:
                    raise SteerRejected(
                        "response_already_completed", f"Response '{req.target}' has finished."
                    )
                if any(r.stream and r.stream.response_id == req.target for r in runs):
                    raise SteerRejected(
                        "response_not_active",
                        f"Response '{req.target}' no longer accepts steering.",
                    )
                raise SteerRejected(
                    "response_not_found",
                    f"Response '{req.target}' is not running on this connection.",
                )
            settings = run.req.settings
            if (
                not self.enabled
                or settings.get("context_management")
                or settings.get("conversation")
            ):
                raise SteerRejected(
                    "steering_not_supported",
                    "This response cannot be steered (steering is off, or it uses compaction "
                    "or a conversation).",
                )
            waiting = sum(len(v) for v in self.waiting.values())
            cap = self.max_pending
            if len(run.steers) >= cap or waiting >= cap * 8:
                raise SteerRejected("too_many_pending_steers", "Too much steering input is queued.")
        except SteerRejected as err:
            ev = failed_event(
                err.code,
                err.message,
                target=target,
                raw_input=msg.get("input"),
                lane=self._target_lane(target, run, runs),
                seq=run.next_seq() if run is not None else 0,
            )
            if run is not None:
                run.seq_offset += 1
            return [Send(wire.dumps(ev))], False
        steer = Steer(self.new_id("steer"), req, run.req.lane)
        run.steers.append(steer)
        seq = run.next_seq()
        run.seq_offset += 1
        return [Send(wire.dumps(accepted_event(steer, seq)))], True

    def _target_lane(self, target: Any, run: Run | None, runs: Collection[Run]) -> str | None:
        """The lane of the steered response, when it is known here (docs/protocol.md
        "response.steer": a failed steer carries `stream_id` when its target is known and had a
        named lane): running, finished and cached, waiting with steers, or ended by a run still in
        flight."""
        if run is not None:
            return run.req.lane
        if not isinstance(target, str):
            return None
        entry = self.cache.peek(target)
        if entry is not None:
            return entry.lane
        if waiting := self.waiting.get(target):
            return waiting[0].lane
        for r in runs:
            if r.stream is not None and r.stream.response_id == target:
                return r.req.lane
        return None

    def after_end(
        self, run: Run, rid: str, queue: Iterable[Run]
    ) -> tuple[list[Action], Run | None]:
        """`run` (with steers) ended `rid` before a boundary. Client tool output needed: the
        steers wait (`response.steer.pending`, unless the client's create is already among
        the `queue`d runs); otherwise the automatic successor is returned, to be queued."""
        assert run.stream is not None
        steers, run.steers = run.steers, []
        stubs = required_input(run.stream.output)
        if not stubs:
            return [], self.successor(run, rid, steers)
        self.waiting.setdefault(rid, []).extend(steers)
        lane = run.req.lane
        if any(q.req.previous_response_id == rid and q.req.lane == lane for q in queue):
            return [], None
        out: list[Action] = []
        for steer in steers:
            out.append(Send(wire.dumps(pending_event(steer, stubs, run.next_seq()))))
            run.seq_offset += 1
        return out, None

    def successor(self, run: Run, rid: str, steers: list[Steer]) -> Run:
        """The automatic successor of `run` (ended as `rid`) carrying `steers`' input: it
        inherits the parent's settings (docs/protocol.md "response.steer" step 3); the session
        queues it first in its lane."""
        body = {**run.req.body, "previous_response_id": rid, "input": []}
        body.pop("generate", None)
        req = parse_create(body)
        items = tuple(item for steer in steers for item in steer.request.items)
        kept = replace(req, input_items=items, settings_bytes=run.req.settings_bytes)
        successor = Run(self.next_run_id(), kept, applies=list(steers))
        if self.cache.pin(rid):
            successor.pinned = rid
        return successor

    def apply_waiting(self, run: Run) -> None:
        """The client's explicit create after `response.steer.pending`: the queued steer
        input goes in, in submission order, right after the tool outputs that open the
        request's input (the answers to the parent's calls stay next to those calls, as
        every dialect needs: a Chat upstream gets assistant(tool_calls), tool, then user)
        and before the rest; the request keeps its own settings. The conversation holds
        the items in this order, the order they went upstream."""
        rid = run.req.previous_response_id
        steers = self.waiting.get(rid or "")
        if not steers or steers[0].lane != run.req.lane:
            return
        del self.waiting[rid or ""]
        items = tuple(item for steer in steers for item in steer.request.items)
        own = run.req.input_items
        n = _leading_tool_outputs(own)
        run.req = replace(run.req, input_items=own[:n] + items + own[n:])
        run.applies = steers

    def settle(self, run: Run, delivered: bool) -> list[Action]:
        """`run` is ending: the `response.steer.failed` owed to its steers. Steers whose
        input it carries fail with `successor_creation_failed` when it ended undelivered
        before the client saw its `response.created`; steers still pending on it fail with
        `response_not_active` (the ones it handed on were taken off `run.steers`)."""
        out: list[Action] = []
        if run.applies and not delivered and not run.announced:
            out += steers_failed(run.applies, "successor_creation_failed")
        if run.steers:
            out += steers_failed(run.steers, "response_not_active")
        return out

    def clear(self) -> None:
        self.waiting.clear()


# The calls a response leaves to the client, as the upstreams wsmode fronts make them
# (docs/protocol.md "response.steer" step 4, `required_input`): each maps to the type of the item
# that answers it and the fields of the call its stub names.
CLIENT_CALLS: dict[str, tuple[str, tuple[str, ...]]] = {
    "function_call": ("function_call_output", ("call_id", "name")),
    "custom_tool_call": ("custom_tool_call_output", ("call_id",)),
}
# every item that answers a call or an approval request (docs/protocol.md "response.steer" step 4)
_ANSWERS = frozenset(
    {
        "function_call_output",
        "custom_tool_call_output",
        "computer_call_output",
        "local_shell_call_output",
        "shell_call_output",
        "apply_patch_call_output",
        "tool_search_output",
        "mcp_approval_response",
    }
)


def _is_tool_output(kind: str | None) -> bool:
    """An item that answers a call of the previous response: a tool's output or an
    approval."""
    return kind in _ANSWERS


def _leading_tool_outputs(items: tuple[bytes, ...]) -> int:
    """How many items at the start of `items` are tool outputs (only the new input is read)."""
    n = 0
    while n < len(items) and _is_tool_output(wire.event_type(items[n])):
        n += 1
    return n


def at_boundary(run: Run) -> bool:
    """Between output items, and no call for the client emitted (then the response must end
    for the client's tool output, and the steer waits: docs/protocol.md "response.steer" step 4)."""
    stream = run.stream
    if stream is None or stream.response is None or stream.open_items:
        return False
    return not any(
        isinstance(i, dict) and i.get("type") in CLIENT_CALLS for i in stream.finished_items()
    )


def steered_response(response: dict[str, Any], items: list[Any]) -> dict[str, Any]:
    """The response a steer interrupted: `incomplete` with reason `steered`, keeping the
    finished output items (docs/protocol.md "response.steer" step 2)."""
    return {
        **response,
        "status": "incomplete",
        "incomplete_details": {"reason": "steered"},
        "output": items,
        "usage": None,
    }


_FAILED_MESSAGES = {
    "successor_creation_failed": "Could not start the follow-up response; resend this "
    "input with response.create.",
    "response_not_active": "The response ended before the steering input was applied; "
    "resend it with response.create.",
}


def steers_failed(steers: list[Steer], code: str) -> list[Action]:
    """`response.steer.failed` for accepted steers (their ids are reused: docs/protocol.md
    "response.steer")."""
    return [
        Send(
            wire.dumps(
                failed_event(
                    code,
                    _FAILED_MESSAGES[code],
                    target=s.request.target,
                    raw_input=s.request.raw_input,
                    steer_id=s.id,
                    lane=s.lane,
                )
            )
        )
        for s in steers
    ]


def _user_message(item: Any, index: int) -> dict[str, Any]:
    where = f"input[{index}]"
    if not isinstance(item, dict) or set(item) - {"type", "role", "content"}:
        raise SteerRejected("invalid_input", f"{where} must be a user message.")
    if item.get("type", "message") != "message" or item.get("role") != "user":
        raise SteerRejected("invalid_input", f"{where}: only user messages can steer.")
    content = item.get("content")
    if isinstance(content, list):
        ok = content and all(isinstance(p, dict) and p.get("type") in _PART_TYPES for p in content)
        if not ok:
            raise SteerRejected(
                "invalid_input",
                f"{where}: content parts must be input_text, input_image or input_file.",
            )
    elif not isinstance(content, str):
        raise SteerRejected("invalid_input", f"{where}: content must be a string or parts.")
    return {"type": "message", "role": "user", "content": content}


def _with_lane(ev: dict[str, Any], lane: str | None) -> dict[str, Any]:
    if lane is not None:
        ev["stream_id"] = lane
    return ev


def accepted_event(steer: Steer, seq: int) -> dict[str, Any]:
    return _with_lane(
        {
            "type": "response.steer.accepted",
            "sequence_number": seq,
            "steer": {"id": steer.id, "previous_response_id": steer.request.target},
        },
        steer.lane,
    )


def pending_event(steer: Steer, required: list[dict[str, Any]], seq: int) -> dict[str, Any]:
    return _with_lane(
        {
            "type": "response.steer.pending",
            "sequence_number": seq,
            "steer": {"id": steer.id, "previous_response_id": steer.request.target},
            "reason": "waiting_for_required_input",
            "required_input": required,
        },
        steer.lane,
    )


def failed_event(
    code: str,
    message: str,
    *,
    target: Any,
    raw_input: Any,
    steer_id: str | None = None,
    lane: str | None = None,
    seq: int = 0,
) -> dict[str, Any]:
    steer: dict[str, Any] = {"previous_response_id": target, "input": raw_input}
    if steer_id is not None:
        steer = {"id": steer_id, **steer}
    return _with_lane(
        {
            "type": "response.steer.failed",
            "sequence_number": seq,
            "steer": steer,
            "error": {"type": "invalid_request_error", "code": code, "message": message},
        },
        lane,
    )


def required_input(output: list[Any]) -> list[dict[str, Any]]:
    """The stubs a client must fill before the steer can be applied: one per call that
    waits for client-owned output (`CLIENT_CALLS`; a function call, from most upstreams)."""
    stubs: list[dict[str, Any]] = []
    for item in output:
        kind = item.get("type") if isinstance(item, dict) else None
        if isinstance(kind, str) and kind in CLIENT_CALLS:
            answer, fields = CLIENT_CALLS[kind]
            stubs.append({"type": answer, **{f: item.get(f) for f in fields}})
    return stubs
