"""Plain HTTP POST /v1/responses through the core, and the response store behind it."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest
from openai.types.responses import ResponseItemList
from websockets.asyncio.client import connect

from tests.support.helpers import (
    Proxy,
    Sim,
    create,
    post_responses,
    recv,
    seconds,
    send,
    until_terminal,
    user,
)

KEY_A = {"Authorization": "Bearer sk-a"}
KEY_B = {"Authorization": "Bearer sk-b"}


async def post(
    proxy: Proxy, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    return await post_responses(proxy, body, headers or KEY_A)


async def test_streaming_sse_has_event_lines(proxy: Proxy, sim: Sim) -> None:
    status, events = await post(proxy, {"model": "sim", "input": "hi", "stream": True})
    assert status == 200
    assert [e.event for e in events][:2] == ["response.created", "response.in_progress"]
    assert events[-1].event == "response.completed"
    for e in events:
        assert orjson.loads(e.data)["type"] == e.event
    upstream = sim.bodies()[0]
    assert upstream["stream"] is True and upstream["store"] is False


async def test_non_streaming_returns_the_response_object(proxy: Proxy) -> None:
    status, doc = await post(proxy, {"model": "sim", "input": "hi"})
    assert status == 200
    assert doc["object"] == "response" and doc["status"] == "completed"
    assert doc["output"][0]["type"] == "message" and doc["store"] is True


async def test_http_chaining_from_a_stored_response(proxy: Proxy, sim: Sim) -> None:
    _, first = await post(proxy, {"model": "sim", "input": [user("a")], "instructions": "x"})
    _, second = await post(
        proxy, {"model": "sim", "input": [user("b")], "previous_response_id": first["id"]}
    )
    assert second["status"] == "completed"
    assert second["previous_response_id"] == first["id"]
    assert sim.bodies()[1]["input"] == [user("a"), *first["output"], user("b")]
    assert "instructions" not in sim.bodies()[1]


async def test_store_false_is_never_chainable_over_http(proxy: Proxy) -> None:
    _, first = await post(proxy, {"model": "sim", "input": "a", "store": False})
    status, err = await post(
        proxy, {"model": "sim", "input": "b", "previous_response_id": first["id"]}
    )
    assert status == 400
    assert err["error"]["code"] == "previous_response_not_found"
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{proxy.http}/responses/{first['id']}", headers=KEY_A) as r,
    ):
        assert r.status == 404


async def test_another_credential_is_denied(proxy: Proxy) -> None:
    _, first = await post(proxy, {"model": "sim", "input": "a"})
    status, err = await post(
        proxy, {"model": "sim", "input": "b", "previous_response_id": first["id"]}, KEY_B
    )
    assert status == 400 and err["error"]["code"] == "previous_response_not_found"
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{proxy.http}/responses/{first['id']}", headers=KEY_B) as r:
            assert r.status == 404
        async with http.get(f"{proxy.http}/responses/{first['id']}", headers=KEY_A) as r:
            assert r.status == 200 and (await r.json())["id"] == first["id"]


async def test_cross_connection_continuation_over_websocket(proxy: Proxy, sim: Sim) -> None:
    """The agents SDKs reconnect between runs and reuse the last response id."""
    async with connect(proxy.ws, additional_headers=KEY_A) as ws:
        await send(ws, create(input=[user("a")]))  # no `store`: the default true
        first = (await until_terminal(ws))[-1]["response"]
    async with connect(proxy.ws, additional_headers=KEY_A) as ws:
        await send(ws, create(input=[user("b")], previous_response_id=first["id"]))
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"
    async with connect(proxy.ws, additional_headers=KEY_B) as ws:
        await send(ws, create(input=[user("c")], previous_response_id=first["id"]))
        assert (await recv(ws))["error"]["code"] == "previous_response_not_found"
    assert sim.bodies()[1]["input"] == [user("a"), *first["output"], user("b")]


async def test_input_items_are_listed_in_the_apis_item_shape(proxy: Proxy) -> None:
    """Whatever shorthand the input used, the list validates as the SDK's ResponseItemList:
    string content as parts, ids and statuses present, what was sent kept."""
    call = {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"}
    sent = [
        {"role": "developer", "content": "be brief"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}]},
        {"role": "assistant", "content": "earlier answer"},
        call,
        {"type": "function_call_output", "call_id": "call_1", "output": "42", "id": "fco_1"},
    ]
    _, doc = await post(proxy, {"model": "sim", "input": sent})
    url = f"{proxy.http}/responses/{doc['id']}/input_items?order=asc"
    async with aiohttp.ClientSession(headers=KEY_A) as http, http.get(url) as r:
        page = await r.json()
    listed = ResponseItemList.model_validate(page, strict=True)
    assert [i.type for i in listed.data] == ["message"] * 3 + ["function_call"] * 1 + [
        "function_call_output"
    ]
    developer, user_msg, assistant, fc, fco = page["data"]
    assert developer["content"] == [{"type": "input_text", "text": "be brief"}]
    assert user_msg["content"] == sent[1]["content"]
    assert assistant["content"] == [
        {"type": "output_text", "text": "earlier answer", "annotations": []}
    ]
    assert {k: fc[k] for k in call} == call and fc["status"] == "completed"
    assert fco["id"] == "fco_1" and fco["output"] == "42"
    assert len({i["id"] for i in page["data"]}) == 5


async def test_get_delete_and_input_items(proxy: Proxy) -> None:
    _, first = await post(proxy, {"model": "sim", "input": [user("a")]})
    _, second = await post(
        proxy,
        {"model": "sim", "input": [user("b"), user("c")], "previous_response_id": first["id"]},
    )
    base = f"{proxy.http}/responses/{second['id']}"
    async with aiohttp.ClientSession(headers=KEY_A) as http:
        async with http.get(base) as r:
            assert (await r.json()) == second
        async with http.get(f"{base}/input_items?order=asc") as r:
            page = await r.json()
        ResponseItemList.model_validate(page, strict=True)
        contents = [i["content"][0]["text"] for i in page["data"]]
        assert contents[0] == "a" and contents[-2:] == ["b", "c"]
        assert page["data"][1]["id"] == first["output"][0]["id"]
        assert page["has_more"] is False and page["first_id"] == page["data"][0]["id"]
        async with http.get(f"{base}/input_items?limit=2") as r:
            page = await r.json()
        texts = [i["content"] for i in page["data"]]
        assert texts == [[{"type": "input_text", "text": t}] for t in "cb"]
        assert page["has_more"] is True
        async with http.get(f"{base}/input_items?limit=2&after={page['last_id']}") as r:
            rest = await r.json()
        assert len(rest["data"]) == 2 and rest["has_more"] is False
        async with http.get(f"{base}/input_items?limit=0") as r:
            assert r.status == 400
        async with http.delete(base) as r:
            assert await r.json() == {"id": second["id"], "object": "response", "deleted": True}
        async with http.get(base) as r:
            assert r.status == 404
        async with http.delete(base) as r:
            assert r.status == 404


async def test_http_errors(proxy: Proxy, sim: Sim) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{proxy.http}/responses", data=b"{nope") as r,
    ):
        assert r.status == 400 and (await r.json())["error"]["code"] == "invalid_json"
    status, err = await post(proxy, {"model": "sim"})
    assert status == 400 and err["error"]["param"] == "input"
    status, err = await post(proxy, {"model": "sim", "input": "x", "background": True})
    assert status == 400 and err["error"]["param"] == "background"
    sim.state.faults.append("status:429")
    status, err = await post(proxy, {"model": "sim", "input": "x", "stream": True})
    assert status == 429 and err["error"]["message"] == "simulated upstream failure 429"


async def test_mid_stream_failure_over_sse(proxy: Proxy, sim: Sim) -> None:
    sim.state.faults.append("cut:5")
    status, events = await post(proxy, {"model": "sim", "input": "x", "stream": True})
    assert status == 200
    assert [e.event for e in events[-2:]] == ["response.failed", "error"]
    err = orjson.loads(events[-1].data)
    assert err["type"] == "error" and err["code"] == "upstream_unavailable"
    assert "error" not in err  # the HTTP shape: code/message/param at the top level
    sim.state.faults.append("cut:5")
    status, doc = await post(proxy, {"model": "sim", "input": "x"})
    assert status == 502 and doc["error"]["code"] == "upstream_unavailable"


@pytest.mark.parametrize(
    ("fault", "status", "code"),
    [
        # the upstream's own `response.failed` (no `error` event after it)
        ("failed:rate_limit_exceeded", 429, "rate_limit_exceeded"),
        ("failed:invalid_prompt", 400, "invalid_prompt"),
        ("failed:server_error", 500, "server_error"),
        # the proxy's: `response.failed`, then an `error` that changes nothing any more
        ("error:4", 500, "server_error"),
        ("cut:5", 502, "upstream_unavailable"),
        ("eof:4", 500, "server_error"),
    ],
)
async def test_response_failed_without_stream_is_the_codes_status_as_through_the_sidecar(
    fault: str, status: int, code: str, proxy: Proxy, sidecar_factory: Any
) -> None:
    """A stream that ends `response.failed`: the HTTP front and the sidecar (in front of the
    same proxy's WebSocket mode) derive the same status from `error.code`, with the same
    body (one mapping, core/http_answer.py)."""
    sidecar = await sidecar_factory(proxy.http)
    req = {"model": "sim", "input": "x", "metadata": {"sim_fault": fault}}
    direct = await post(proxy, req)
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{sidecar.http}/responses", json=req) as r,
    ):
        via = r.status, orjson.loads(await r.read())
    assert direct[0] == status
    assert direct[1]["error"]["code"] == code and direct[1]["error"]["type"] == "server_error"
    if fault.startswith("failed:"):
        assert direct[1]["error"]["message"] == f"simulated response failure ({code})"
    assert via == direct


async def test_openai_sdk_over_http(proxy: Proxy, openai_client: Any) -> None:
    client = openai_client(proxy.http, api_key="sk-a")
    first = await client.responses.create(model="sim", input="hi")
    assert first.output_text
    stream = await client.responses.create(
        model="sim", input="more", previous_response_id=first.id, stream=True
    )
    async with asyncio.timeout(seconds(10)):
        kinds = [ev.type async for ev in stream]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    fetched = await client.responses.retrieve(first.id)
    assert fetched.id == first.id and fetched.output_text == first.output_text
