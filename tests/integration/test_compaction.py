"""Compaction and context windows on real sockets (docs/protocol.md "Compaction"), against the
simulated model enforcing a small context window, with the `websockets` library, aiohttp and the
openai SDK as clients."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from openai import AsyncOpenAI, BadRequestError
from websockets.asyncio.client import ClientConnection, connect
from wsmode.core.context.compaction import SUMMARY_INSTRUCTIONS, SUMMARY_PREFIX
from wsmode.sim.model import SUMMARY_LEAD, count_tokens

from tests.support.helpers import Proxy, Sim, create, seconds, send, until, until_terminal, user

WINDOW = 1600
TURNS = 40
CM = [{"type": "compaction", "compact_threshold": 1000}]
KEY = base64.b64encode(bytes(range(32))).decode()
AUTH = {"Authorization": "Bearer sk-a"}

ProxyFactory = Callable[..., Awaitable[Proxy]]
SimFactory = Callable[..., Awaitable[Sim]]
OpenAIClient = Callable[..., AsyncOpenAI]


def fact(i: int) -> str:
    return f"fact-{i} the user notes that item {i} matters " + "and more detail " * 35


async def small_window(
    sim_factory: SimFactory, proxy_factory: ProxyFactory, **overrides: Any
) -> tuple[Sim, Proxy]:
    sim = await sim_factory(context_window=WINDOW)
    proxy = await proxy_factory(sim.url, upstream__context_window=WINDOW, **overrides)
    return sim, proxy


async def turn(ws: ClientConnection, **fields: Any) -> list[dict[str, Any]]:
    await send(ws, create(store=False, **fields))
    return await until_terminal(ws)


def generation_bodies(sim: Sim) -> list[dict[str, Any]]:
    """What the upstream was asked to generate from (summarising requests left out)."""
    return [b for b in sim.bodies() if b.get("instructions") != SUMMARY_INSTRUCTIONS]


def summary_bodies(sim: Sim) -> list[dict[str, Any]]:
    return [b for b in sim.bodies() if b.get("instructions") == SUMMARY_INSTRUCTIONS]


def text_of(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or [])


async def post(
    proxy: Proxy, path: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{proxy.http}{path}", data=data, headers=headers or AUTH) as r,
    ):
        raw = await r.read()
        return r.status, orjson.loads(raw) if r.content_type == "application/json" else raw


# ------------------------------------------------------------------ context_management over WS


async def test_long_conversation_continues_on_a_small_window(
    sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    """40 chained turns of a conversation over three times the upstream's window: the proxy
    compacts whenever the conversation crosses the threshold, and every turn completes."""
    sim, proxy = await small_window(sim_factory, proxy_factory)
    compactions: list[dict[str, Any]] = []
    prev: str | None = None
    async with connect(proxy.ws) as ws:
        for i in range(TURNS):
            fields: dict[str, Any] = {"input": [user(fact(i))], "context_management": CM}
            if prev:
                fields["previous_response_id"] = prev
            events = await turn(ws, **fields)
            done = events[-1]
            assert done["type"] == "response.completed", (i, done)
            assert [e["sequence_number"] for e in events] == list(range(len(events)))
            output = done["response"]["output"]
            if output[0]["type"] == "compaction":
                compactions.append(output[0])
                assert [e["type"] for e in events[2:4]] == [
                    "response.output_item.added",
                    "response.output_item.done",
                ]
                assert events[3]["item"] == output[0]
            prev = done["response"]["id"]
    total = sum(len(fact(i)) for i in range(TURNS)) // 4
    assert total > 3 * WINDOW  # the conversation really is far larger than the window
    assert len(compactions) >= 3
    bodies = generation_bodies(sim)
    assert len(bodies) == TURNS
    assert all(count_tokens(b) <= WINDOW for b in sim.bodies())  # the sim never refused
    last = bodies[-1]["input"]
    assert text_of(last[0]).startswith(SUMMARY_PREFIX + SUMMARY_LEAD)
    assert "fact-0" in text_of(last[0])  # the first fact survived every compaction
    assert last[-1] == user(fact(TURNS - 1))
    # one summarising request per compaction, or more when its older part needed chunks
    assert len(summary_bodies(sim)) >= len(compactions)


async def test_without_compaction_the_same_conversation_hits_the_window(
    sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    sim, proxy = await small_window(sim_factory, proxy_factory)
    prev: str | None = None
    async with connect(proxy.ws) as ws:
        for i in range(30):
            fields: dict[str, Any] = {"input": [user(fact(i))]}
            if prev:
                fields["previous_response_id"] = prev
            done = (await turn(ws, **fields))[-1]
            if done["type"] == "error":
                break
            prev = done["response"]["id"]
    assert done["type"] == "error" and i < 30
    assert done["status"] == 400 and done["error"]["code"] == "context_length_exceeded"
    assert len(sim.bodies()) == i  # refused by the proxy, the upstream was not called


async def test_compaction_stream_shape_and_next_turn(
    sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    sim, proxy = await small_window(sim_factory, proxy_factory, compaction__key=KEY)
    async with connect(proxy.ws) as ws:
        history = [x for i in range(8) for x in (user(fact(i)), user("ok " * 5))]
        events = await turn(ws, input=history, context_management=CM, stream_id="lane-a")
        assert all(e["stream_id"] == "lane-a" for e in events)
        kinds = [e["type"] for e in events]
        assert kinds[:4] == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.output_item.done",
        ]
        item = events[2]["item"]
        assert set(item) == {"id", "type", "encrypted_content"} and item["type"] == "compaction"
        assert all(e.get("output_index", 1) == 1 for e in events[4:])
        done = events[-1]["response"]
        assert done["output"][0] == item and done["usage"]["total_tokens"] > 0
        gen = generation_bodies(sim)[-1]
        assert "context_management" not in gen
        assert text_of(gen["input"][0]).startswith(SUMMARY_PREFIX)
        # the next turn continues from the compacted context only
        nxt = await turn(ws, input=[user("what was fact-0?")], previous_response_id=done["id"])
        assert nxt[-1]["type"] == "response.completed"
        sent = generation_bodies(sim)[-1]["input"]
        assert sent[: len(gen["input"])] == gen["input"]
        assert sent[-1] == user("what was fact-0?")
        assert not any(x == user(fact(0)) for x in sent)


async def test_summary_failure_is_an_error_and_the_socket_goes_on(
    sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    sim, proxy = await small_window(sim_factory, proxy_factory)
    history = [user(fact(i)) for i in range(8)]
    sim.state.faults.append("status:503")  # the next upstream request: the summary
    async with connect(proxy.ws) as ws:
        events = await turn(ws, input=history, context_management=CM)
        (err,) = events
        assert err["type"] == "error" and err["status"] == 503
        assert err["error"]["message"].startswith("Compaction failed")
        again = await turn(ws, input=history, context_management=CM)
        assert again[-1]["type"] == "response.completed"


async def test_bad_context_management_is_a_400(proxy: Proxy) -> None:
    async with connect(proxy.ws) as ws:
        bad = [{"type": "compaction", "compact_threshold": 500}]
        (err,) = await turn(ws, input="hi", context_management=bad)
    assert err["status"] == 400 and err["error"]["code"] == "invalid_value"
    assert err["error"]["param"] == "context_management[0].compact_threshold"


# ------------------------------------------------------------------ truncation and the window


async def test_truncation_disabled_is_a_400_and_auto_fits(
    sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    sim, proxy = await small_window(sim_factory, proxy_factory)
    history = [x for i in range(12) for x in (user(fact(i)), user("noted"))]
    async with connect(proxy.ws) as ws:
        (err,) = await turn(ws, input=[*history, user("q")])
        assert err["status"] == 400 and err["error"]["code"] == "context_length_exceeded"
        assert err["error"]["param"] == "input"
        assert sim.bodies() == []
        done = (await turn(ws, input=[*history, user("q")], truncation="auto"))[-1]
    assert done["type"] == "response.completed"
    sent = sim.bodies()[0]["input"]
    assert sent[-1] == user("q") and len(sent) < len(history)
    assert sent[0]["role"] == "user" and count_tokens(sim.bodies()[0]) <= WINDOW - 1024


async def test_exact_counts_come_from_the_upstream_tokenizer(
    sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    sim, proxy = await small_window(sim_factory, proxy_factory)
    prev: str | None = None
    async with connect(proxy.ws) as ws:
        for i in range(3):
            fields: dict[str, Any] = {"input": [user(f"short {i}")], "truncation": "auto"}
            if prev:
                fields["previous_response_id"] = prev
            prev = (await turn(ws, **fields))[-1]["response"]["id"]
    tokenizer = proxy.state.tokenizer
    assert tokenizer is not None
    await until(lambda: tokenizer.counted >= 4)
    assert sim.state.tokenize_calls >= 4 and tokenizer.counted >= 4
    assert proxy.state.context is not None and proxy.state.context.tokenize


async def test_an_upstream_without_a_tokenizer_switches_exact_counts_off(
    sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    sim = await sim_factory()
    proxy = await proxy_factory(
        sim.url, upstream__context_window=100_000, tokens__tokenize_url=sim.url + "/nothing"
    )
    context = proxy.state.context
    assert context is not None and context.tokenize
    prev: str | None = None
    async with connect(proxy.ws) as ws:
        for i in range(3):
            fields: dict[str, Any] = {"input": [user(f"turn {i}")]}
            if prev:
                fields["previous_response_id"] = prev
            done = (await turn(ws, **fields))[-1]
            assert done["type"] == "response.completed"
            prev = done["response"]["id"]
    await until(lambda: not context.tokenize)  # the worker's one attempt answers 404
    assert context.tokenize is False
    assert proxy.state.tokenizer is not None and proxy.state.tokenizer.counted == 0


# ------------------------------------------------------------------ POST /v1/responses/compact


async def test_compact_endpoint_round_trip_with_the_sdk(
    proxy: Proxy, sim: Sim, openai_client: OpenAIClient
) -> None:
    client = openai_client(proxy.http, api_key="sk-a")
    dev = {"type": "message", "role": "developer", "content": "You are a careful agent."}
    conversation = [dev, *(user(fact(i)) for i in range(8)), user("latest question")]
    compacted = await client.responses.compact(model="sim", input=conversation)
    assert compacted.object == "response.compaction"
    first = compacted.output[0]
    assert first.type == "compaction" and first.id.startswith("cmp_")
    assert compacted.usage.total_tokens > 0
    # the SDK types output messages as assistant messages; user items come back as given
    window = [item.model_dump(exclude_none=True, warnings=False) for item in compacted.output]
    assert window[-1] == user("latest question")  # recent items come back in the clear
    assert len(window) < len(conversation)
    (summary_req,) = summary_bodies(sim)
    transcript = summary_req["input"][0]["content"][0]["text"]
    assert "fact-0" in transcript and "careful agent" not in transcript

    # a new chain: the compacted window, then the new items, over HTTP
    resp = await client.responses.create(model="sim", input=[*window, user("go on")])
    assert resp.status == "completed"
    sent = sim.bodies()[-1]["input"]
    assert sent[0] == dev  # the system/developer head is restored verbatim
    assert text_of(sent[1]).startswith(SUMMARY_PREFIX + SUMMARY_LEAD)
    assert "fact-0" in text_of(sent[1])
    assert sent[-2:] == [user("latest question"), user("go on")]

    # and over the socket
    async with connect(proxy.ws, additional_headers=AUTH) as ws:
        done = (await turn(ws, input=[*window, user("and now?")]))[-1]
    assert done["type"] == "response.completed"
    assert sim.bodies()[-1]["input"][:2] == sent[:2]


async def test_compact_from_a_stored_response(proxy: Proxy, sim: Sim) -> None:
    history = [user(fact(i)) for i in range(6)]
    status, first = await post(proxy, "/responses", {"model": "sim", "input": history})
    assert status == 200
    status, doc = await post(
        proxy, "/responses/compact", {"model": "sim", "previous_response_id": first["id"]}
    )
    assert status == 200 and doc["output"][0]["type"] == "compaction"
    status, err = await post(
        proxy,
        "/responses/compact",
        {"model": "sim", "previous_response_id": first["id"]},
        {"Authorization": "Bearer sk-b"},
    )
    assert status == 400 and err["error"]["code"] == "previous_response_not_found"


async def test_compact_without_model_is_a_400(
    proxy: Proxy, sim: Sim, openai_client: OpenAIClient
) -> None:
    status, err = await post(proxy, "/responses/compact", {"input": "hello"})
    assert status == 400
    assert err["error"]["code"] == "missing_required_parameter"
    assert err["error"]["param"] == "model"
    client = openai_client(proxy.http, api_key="sk-a")
    with pytest.raises(BadRequestError) as info:
        await client.responses.compact(model="", input="hello")
    assert info.value.status_code == 400
    status, err = await post(proxy, "/responses/compact", b"{nope")
    assert status == 400 and err["error"]["code"] == "invalid_json"
    assert sim.bodies() == []


async def test_tampered_items_are_rejected_everywhere(proxy: Proxy, sim: Sim) -> None:
    status, doc = await post(
        proxy, "/responses/compact", {"model": "sim", "input": [user(fact(i)) for i in range(6)]}
    )
    assert status == 200
    item = doc["output"][0]
    content = item["encrypted_content"]
    tampered = {
        **item,
        "encrypted_content": content[:-6] + ("A" if content[-6] != "A" else "B") + content[-5:],
    }
    requests = len(sim.bodies())
    status, err = await post(proxy, "/responses", {"model": "sim", "input": [tampered, user("x")]})
    assert status == 400
    assert (err["error"]["code"], err["error"]["param"]) == ("invalid_encrypted_content", "input")
    status, err = await post(proxy, "/responses/compact", {"model": "sim", "input": [tampered]})
    assert status == 400 and err["error"]["code"] == "invalid_encrypted_content"
    async with connect(proxy.ws, additional_headers=AUTH) as ws:
        (ev,) = await turn(ws, input=[tampered, user("x")])
        assert ev["status"] == 400 and ev["error"]["code"] == "invalid_encrypted_content"
        # another credential cannot open the untampered item either
    async with connect(proxy.ws, additional_headers={"Authorization": "Bearer sk-b"}) as ws:
        (ev,) = await turn(ws, input=[item, user("x")])
        assert ev["error"]["code"] == "invalid_encrypted_content"
    assert len(sim.bodies()) == requests  # nothing went upstream


async def test_a_configured_key_spans_proxies_a_generated_one_does_not(
    sim: Sim, proxy_factory: ProxyFactory
) -> None:
    a = await proxy_factory(sim.url, compaction__key=KEY)
    b = await proxy_factory(sim.url, compaction__key=KEY)
    c = await proxy_factory(sim.url)  # a generated key, as after a restart
    status, doc = await post(
        a, "/responses/compact", {"model": "sim", "input": [user(fact(i)) for i in range(6)]}
    )
    assert status == 200
    window = [*doc["output"], user("next")]
    status, resp = await post(b, "/responses", {"model": "sim", "input": window})
    assert status == 200 and resp["status"] == "completed"
    status, err = await post(c, "/responses", {"model": "sim", "input": window})
    assert status == 400 and err["error"]["code"] == "invalid_encrypted_content"


async def test_compaction_disabled_passes_through(sim: Sim, proxy_factory: ProxyFactory) -> None:
    proxy = await proxy_factory(sim.url, compaction__enabled=False)
    status, _ = await post(proxy, "/responses/compact", {"model": "sim", "input": "x"})
    assert status == 404  # the simulated upstream has no such route: it was passed through
    async with connect(proxy.ws) as ws:
        done = (await turn(ws, input="hi", context_management=CM))[-1]
    assert done["type"] == "response.completed"
    assert sim.bodies()[-1]["context_management"] == CM  # forwarded untouched


async def test_context_management_over_plain_http(
    sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    """The HTTP front runs the summary too: SSE carries the compaction item first, and the
    stored response continues from the compacted context."""
    sim, proxy = await small_window(sim_factory, proxy_factory)
    history = [user(fact(i)) for i in range(8)]
    body = {"model": "sim", "input": history, "context_management": CM, "stream": True}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{proxy.http}/responses", json=body, headers=AUTH) as r,
    ):
        assert r.status == 200
        raw = await r.read()
    events = [orjson.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: ")]
    assert [e["type"] for e in events[2:4]] == [
        "response.output_item.added",
        "response.output_item.done",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    done = events[-1]["response"]
    assert done["output"][0]["type"] == "compaction"
    status, nxt = await post(
        proxy,
        "/responses",
        {"model": "sim", "input": [user("more")], "previous_response_id": done["id"]},
    )
    assert status == 200 and nxt["status"] == "completed"
    sent = sim.bodies()[-1]["input"]
    assert text_of(sent[0]).startswith(SUMMARY_PREFIX) and sent[-1] == user("more")
    assert len(sent) < len(history)


# ------------------------------------------------------------------ compaction_trigger (Codex)

TRIGGER = {"type": "compaction_trigger"}


def upstream_saw_a_trigger(sim: Sim) -> bool:
    return any(b"compaction_trigger" in orjson.dumps(b) for b in sim.bodies())


async def chained_facts(ws: ClientConnection, n: int) -> str:
    prev: str | None = None
    for i in range(n):
        fields: dict[str, Any] = {"input": [user(fact(i))]}
        if prev:
            fields["previous_response_id"] = prev
        events = await turn(ws, **fields)
        assert events[-1]["type"] == "response.completed"
        prev = events[-1]["response"]["id"]
    assert prev is not None
    return prev


@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_compaction_trigger_answers_one_item_that_the_next_turn_sends_back(
    api: str, sim: Sim, proxy_factory: ProxyFactory
) -> None:
    proxy = await proxy_factory(sim.url, upstream__api=api)
    async with connect(proxy.ws, additional_headers=AUTH) as ws:
        prev = await chained_facts(ws, 6)
        asked = len(sim.bodies())
        events = await turn(ws, input=[TRIGGER], previous_response_id=prev)
        kinds = [e["type"] for e in events]
        assert kinds[:3] == ["response.created", "response.in_progress", *kinds[2:3]]
        assert "response.compaction.compacting" in kinds and kinds[-1] == "response.completed"
        items = [e["item"] for e in events if e["type"] == "response.output_item.done"]
        assert [i["type"] for i in items] == ["compaction"]  # exactly one, as Codex requires
        assert events[-1]["response"]["output"] == items
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert len(sim.bodies()) == asked + 1  # the summarising request, nothing generated
        # Codex's next request: the user messages it retained, the item, the new prompt
        nxt = await turn(ws, input=[user(fact(0)), items[0], user("what was fact-0?")])
        assert nxt[-1]["type"] == "response.completed"
        # and a client that chains from the compaction response
        more = await turn(
            ws, input=[user("and then?")], previous_response_id=nxt[-1]["response"]["id"]
        )
        assert more[-1]["type"] == "response.completed"
    assert not upstream_saw_a_trigger(sim)
    sent = orjson.dumps(sim.bodies()[-2]).decode()
    assert SUMMARY_PREFIX.split(":")[0] in sent
    if api == "responses":  # the simulated model writes a recognisable summary there only
        assert f"{SUMMARY_LEAD} fact-0" in sent
    assert fact(0) not in sent  # summarised: the retained copy before the item is dropped
    assert fact(5) in sent  # the recent tail travels verbatim inside the item


async def test_compaction_trigger_with_the_sdk_over_the_socket_and_http(
    proxy: Proxy, sim: Sim, openai_client: OpenAIClient
) -> None:
    """The SDK's own event and item models accept every event of a trigger's response."""
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    events = TypeAdapter(ResponseStreamEvent)
    client = openai_client(proxy.http, api_key="sk-a")
    history = [user(fact(i)) for i in range(6)]
    async with client.responses.connect() as conn:
        await conn.response.create(model="sim", input=[*history, TRIGGER], store=False)
        seen = []
        async with asyncio.timeout(seconds(10)):
            async for ev in conn:
                seen.append(events.validate_python(ev.model_dump(warnings=False)))
                if ev.type in ("response.completed", "response.failed", "error"):
                    break
    assert seen[-1].type == "response.completed"
    assert [x.type for x in seen].count("response.compaction.compacting") == 1
    (item,) = seen[-1].response.output
    assert item.type == "compaction" and item.encrypted_content
    # over HTTP: the item starts a new chain
    resp = await client.responses.create(
        model="sim", input=[item.model_dump(exclude_none=True), user("go on")]
    )
    assert resp.status == "completed" and resp.output_text
    assert text_of(sim.bodies()[-1]["input"][0]).startswith(SUMMARY_PREFIX + SUMMARY_LEAD)
    # and a trigger over HTTP answers the compaction as the response
    again = await client.responses.create(model="sim", input=[*history, TRIGGER])
    assert [o.type for o in again.output] == ["compaction"]
    assert not upstream_saw_a_trigger(sim)


async def test_misplaced_trigger_is_a_400_and_the_conversation_is_unchanged(
    proxy: Proxy, sim: Sim
) -> None:
    async with connect(proxy.ws) as ws:
        prev = await chained_facts(ws, 1)
        (err,) = await turn(ws, input=[TRIGGER, user("x")], previous_response_id=prev)
        assert err["status"] == 400 and err["error"]["param"] == "input[0]"
        ok = await turn(ws, input=[user("still there?")], previous_response_id=prev)
        assert ok[-1]["type"] == "response.completed"
    assert not upstream_saw_a_trigger(sim)


async def test_native_continuations_are_fitted_and_compacted_by_the_proxy(
    sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    """With upstream.native_previous_response_id a turn that would overflow the window is
    sent in full, truncated, instead of as the upstream's continuation; a trigger is still
    the proxy's. (The simulated model keeps no state: every native attempt falls back.)"""
    sim, proxy = await small_window(
        sim_factory, proxy_factory, upstream__native_previous_response_id=True
    )
    async with connect(proxy.ws, additional_headers=AUTH) as ws:
        prev: str | None = None
        for i in range(12):
            fields: dict[str, Any] = {"input": [user(fact(i))], "truncation": "auto"}
            if prev:
                fields["previous_response_id"] = prev
            await send(ws, create(**fields))
            events = await until_terminal(ws)
            assert events[-1]["type"] == "response.completed", events[-1]
            prev = events[-1]["response"]["id"]
        await send(ws, create(input=[TRIGGER], previous_response_id=prev))
        events = await until_terminal(ws)
        assert [e["item"]["type"] for e in events if "item" in e] == ["compaction"] * 2
        await send(
            ws, create(input=[user("go on")], previous_response_id=events[-1]["response"]["id"])
        )
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"
    assert not upstream_saw_a_trigger(sim)
    assert all(count_tokens(b) <= WINDOW for b in generation_bodies(sim))
    assert "previous_response_id" not in sim.bodies()[-1]  # the upstream never saw the compaction


async def test_with_compaction_off_a_trigger_goes_to_a_responses_upstream_and_chat_refuses_it(
    sim: Sim, proxy_factory: ProxyFactory
) -> None:
    responses = await proxy_factory(sim.url, compaction__enabled=False)
    chat = await proxy_factory(sim.url, compaction__enabled=False, upstream__api="chat")
    async with connect(responses.ws) as ws:
        await turn(ws, input=[user("x"), TRIGGER])
    assert sim.bodies()[-1]["input"][-1] == TRIGGER  # for an upstream that compacts itself
    asked = len(sim.bodies())
    async with connect(chat.ws) as ws:
        (err,) = await turn(ws, input=[user("x"), TRIGGER])
    assert err["status"] == 400 and err["error"]["code"] == "unsupported_value"
    assert len(sim.bodies()) == asked  # never dropped silently
