"""What a spec-complete Responses event sequence is, checked event by event.

Every event is validated against the openai SDK's own pydantic model for its `type` (an
independent schema), and the sequence against the lifecycle rules of docs/protocol.md "Stream
events" and docs/clients.md "What every client needs": numbered from 0 without gaps; created,
in_progress, ..., one terminal event; items opened before their deltas and closed after them;
`.done` payloads equal to the concatenated deltas; the terminal `output` equal to the finished
items, in order; complete response objects.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any

from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel, TypeAdapter

TERMINAL = ("response.completed", "response.incomplete", "response.failed")

# Every field the Open Responses `ResponseResource` requires (docs/clients.md "What every client
# needs").
RESPONSE_FIELDS = frozenset(
    {
        "id",
        "object",
        "created_at",
        "completed_at",
        "status",
        "incomplete_details",
        "model",
        "previous_response_id",
        "instructions",
        "output",
        "error",
        "tools",
        "tool_choice",
        "truncation",
        "parallel_tool_calls",
        "text",
        "top_p",
        "presence_penalty",
        "frequency_penalty",
        "top_logprobs",
        "temperature",
        "reasoning",
        "usage",
        "max_output_tokens",
        "max_tool_calls",
        "store",
        "background",
        "service_tier",
        "metadata",
        "safety_identifier",
        "prompt_cache_key",
    }
)


def _event_models() -> dict[str, type[BaseModel]]:
    union = typing.get_args(ResponseStreamEvent)[0]  # Annotated[Union[...], ...]
    models: dict[str, type[BaseModel]] = {}
    for model in typing.get_args(union):
        kind = typing.get_args(model.model_fields["type"].annotation)[0]
        models[kind] = model
    return models


EVENT_MODELS = _event_models()
_RESPONSE = TypeAdapter(Response)


@dataclass
class Summary:
    terminal: dict[str, Any]
    items: list[dict[str, Any]] = field(default_factory=list)  # output_item.done items

    @property
    def text(self) -> str:
        """The concatenated output text of every message item."""
        return "".join(
            p.get("text", "")
            for i in self.items
            if i["type"] == "message"
            for p in i["content"]
            if p["type"] == "output_text"
        )

    @property
    def reasoning(self) -> str:
        return "".join(
            p["text"] for i in self.items if i["type"] == "reasoning" for p in i["content"]
        )

    @property
    def calls(self) -> list[dict[str, Any]]:
        return [i for i in self.items if i["type"] == "function_call"]


def check_response_object(resp: dict[str, Any]) -> None:
    missing = RESPONSE_FIELDS - resp.keys()
    assert not missing, f"response object lacks {sorted(missing)}"
    _RESPONSE.validate_python(resp)


def check_sequence(events: list[dict[str, Any]]) -> Summary:
    assert [e.get("sequence_number") for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds[:3]
    assert kinds[-1] in TERMINAL and not any(k in TERMINAL for k in kinds[:-1]), kinds
    for ev in events:
        model = EVENT_MODELS.get(ev["type"])
        assert model is not None, f"unknown event type {ev['type']}"
        model.model_validate(ev)
        if "response" in ev:
            check_response_object(ev["response"])
    items: dict[int, dict[str, Any]] = {}  # output_index -> state
    done: list[dict[str, Any]] = []
    rid = events[0]["response"]["id"]
    for ev in events[1:]:
        kind = ev["type"]
        if "response" in ev:
            assert ev["response"]["id"] == rid
        if kind == "response.output_item.added":
            index = ev["output_index"]
            assert index == len(items), "output_index must count up from 0"
            items[index] = {
                "id": ev["item"]["id"],
                "type": ev["item"]["type"],
                "parts": {},
                "args": [],
                "open": True,
            }
            continue
        if "output_index" not in ev:
            continue
        state = items.get(ev["output_index"])
        assert state is not None and state["open"], f"{kind} for an item not open"
        if "item_id" in ev:
            assert ev["item_id"] == state["id"]
        parts = state["parts"]
        if kind == "response.content_part.added":
            assert ev["content_index"] == len(parts)
            parts[ev["content_index"]] = {"kind": ev["part"]["type"], "chunks": [], "open": True}
        elif kind.endswith(".delta") and "content_index" in ev:
            part = parts[ev["content_index"]]
            assert part["open"]
            part["chunks"].append(ev["delta"])
        elif kind in ("response.output_text.done", "response.reasoning_text.done"):
            assert ev["text"] == "".join(parts[ev["content_index"]]["chunks"])
        elif kind == "response.refusal.done":
            assert ev["refusal"] == "".join(parts[ev["content_index"]]["chunks"])
        elif kind == "response.content_part.done":
            part = parts[ev["content_index"]]
            text = ev["part"].get("text", ev["part"].get("refusal"))
            assert text == "".join(part["chunks"])
            part["open"] = False
        elif kind == "response.function_call_arguments.delta":
            state["args"].append(ev["delta"])
        elif kind == "response.function_call_arguments.done":
            assert ev["arguments"] == "".join(state["args"])
        elif kind == "response.output_item.done":
            item = ev["item"]
            assert item["id"] == state["id"] and item["type"] == state["type"]
            assert all(not p["open"] for p in parts.values()), "a part is still open"
            if item["type"] == "function_call":
                assert item["arguments"] == "".join(state["args"])
            else:
                texts = [p.get("text", p.get("refusal")) for p in item["content"]]
                assert texts == ["".join(parts[i]["chunks"]) for i in sorted(parts)]
            state["open"] = False
            state["done"] = item
    assert all(not s["open"] for s in items.values()), "an item was never closed"
    done = [items[i]["done"] for i in sorted(items)]
    terminal = events[-1]["response"]
    if events[-1]["type"] != "response.failed":
        assert terminal["output"] == done, "terminal output differs from the finished items"
    return Summary(terminal, done)
