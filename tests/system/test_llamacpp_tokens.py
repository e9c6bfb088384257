"""The token path (`upstream.api = "tokens"`, docs/tokens.md) against REAL llama.cpp servers:
wsmode renders the chat template itself, keeps each response's exact ids and sends id arrays
to `POST /completion`; what it sent and what llama.cpp streamed back are read from a recording
relay between the two (tests/support/recording_relay.py), never from wsmode's own state.

Two models (tests/support/llamacpp_server.py): `llamacpp_tiny_vocab`, random weights with
Gemma 3's real tokenizer and the `turns-with-tools.jinja` template in its GGUF (fast prefill,
no sliding-window attention: llama.cpp reuses its whole prompt cache), and `llamacpp`, Gemma 3
270M itself with the same template given on the command line. Protocol properties are
asserted, never the model's wording; sampling is greedy (temperature 0).
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from websockets.asyncio.client import connect
from wsmode.core.tokens.chain import DIVERGENCES
from wsmode.core.tokens.engine import LLAMACPP_FINAL_FIELDS
from wsmode.core.tokens.template import ChatTemplate, object_arguments

from tests.support.event_checks import check_sequence
from tests.support.helpers import (
    Proxy,
    create,
    sdk_terminal,
    seconds,
    send,
    serve,
    until,
    until_terminal,
)
from tests.support.llamacpp_server import TURN_TIMEOUT
from tests.support.llamacpp_tokens import (
    apply_template,
    chain_report,
    chat_messages,
    continues,
    divergences,
    fewshot,
    ids_counted,
    metrics_for,
    readyz,
    token_proxy,
    tokenize,
)
from tests.support.llamacpp_tokens import (
    root as server_root,
)
from tests.support.recording_relay import recording_relay

# The first test that asks for a server may install it (about 10 s plus the model download),
# build the tiny-vocab model (about 20 s, plus `pip install gguf numpy` the first time) and
# start it; a test itself takes up to about 30 s on 2 cores.
pytestmark = pytest.mark.timeout(seconds(600))
LLAMACPP = pytest.mark.llamacpp  # every test but the start-up one, which needs no llama.cpp

ProxyFactory = Callable[..., Awaitable[Proxy]]
Message = dict[str, Any]

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the notes for <tags> & words",
        "parameters": {
            "type": "object",
            "properties": {"q": {"type": "string"}, "limit": {"type": "integer"}},
        },
    },
}


# ---------------------------------------------------------------- llama.cpp itself


async def _props(root: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(root + "/props") as r:
        assert r.status == 200
        doc = orjson.loads(await r.read())
    assert isinstance(doc, dict)
    return doc


# ---------------------------------------------------------------- (a) rendering


CONVERSATIONS: dict[str, tuple[list[Message], list[dict[str, Any]] | None]] = {
    "system and user": (
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say hello."},
        ],
        None,
    ),
    "tool call and result": (
        [
            {"role": "system", "content": "Use the tools."},
            {"role": "user", "content": "What is the weather in Rome?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 20}'},
            {"role": "assistant", "content": "It is 20 C in Rome."},
            {"role": "user", "content": "And in Paris?"},
        ],
        [WEATHER_TOOL],
    ),
    "unicode, markup and nested arguments": (
        [
            {"role": "user", "content": 'Grüße, 你好 🙂 — is 1 < 2 && 3 > 2? <b>bold</b> "q"'},
            {
                "role": "assistant",
                "content": "Let me look <that> up & see.",
                "tool_calls": [
                    {
                        "id": "call_a",
                        "type": "function",
                        "function": {
                            "name": "search",
                            "arguments": orjson.dumps(
                                {
                                    "q": "a < b & c > d, naïve café 🙂",
                                    "limit": 3,
                                    "filters": {"tags": ["x", "y"], "exact": True, "none": None},
                                }
                            ).decode(),
                        },
                    },
                    {
                        "id": "call_b",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_a", "content": "<none> & nothing"},
            {"role": "tool", "tool_call_id": "call_b", "content": "12 °C"},
        ],
        [SEARCH_TOOL, WEATHER_TOOL],
    ),
    "several turns": (
        [
            message
            for i in range(4)
            for message in (
                {"role": "user", "content": f"Question {i}: what is {i} + {i}?"},
                {"role": "assistant", "content": f"It is {2 * i}.\n\nAnything else?"},
            )
        ]
        + [{"role": "user", "content": "No, thanks."}],
        None,
    ),
}


@LLAMACPP
@pytest.mark.parametrize("server", ["llamacpp", "llamacpp_tiny_vocab"])
@pytest.mark.parametrize("name", list(CONVERSATIONS))
async def test_rendering_is_llamacpps_byte_for_byte(
    server: str, name: str, request: pytest.FixtureRequest
) -> None:
    """wsmode's rendering of the template the server reports (`/props`: from the command line
    on one server, from the GGUF on the other) is llama.cpp's own (`/apply-template`)."""
    root = server_root(request.getfixturevalue(server))
    props = await _props(root)
    template = ChatTemplate(
        props["chat_template"],
        name=f"{server} /props",
        bos_token=props["bos_token"],
        eos_token=props["eos_token"],
    )
    messages, tools = CONVERSATIONS[name]
    expected = await apply_template(root, messages, tools)
    got = template.render(object_arguments(copy.deepcopy(messages)), tools)
    assert got == expected


# ---------------------------------------------------------------- (b) token-exact, tiny vocab


INSTRUCTIONS = "Answer in one short line."
TURNS = (
    "Hello there, what is your name?",
    "Tell me about Grüße & <tags>.",
    "Next: 你好 and 🙂?",
    "Count to three.",
    "Why is the sky blue?",
    "Thanks, that is all.",
)


@LLAMACPP
async def test_six_turns_continue_token_exactly_over_sdk_websocket(
    llamacpp_tiny_vocab: str, proxy_factory: ProxyFactory, openai_client: Any
) -> None:
    root = server_root(llamacpp_tiny_vocab)
    async with recording_relay(root) as relay:
        px = await token_proxy(proxy_factory, relay)
        # the start-up probe tokenises too (the turn marker): only the turns' requests count
        startup = len(relay.recording.tokenize)
        client = openai_client(px.http, api_key="sk-tokens", timeout=TURN_TIMEOUT)
        texts: list[str] = []  # each response's output text, as the client sees it
        previous: str | None = None
        async with client.responses.connect() as conn:
            for text in TURNS:
                await conn.response.create(
                    model="tiny-vocab",
                    instructions=INSTRUCTIONS,
                    input=text,
                    previous_response_id=previous,
                    store=False,
                    max_output_tokens=12,
                    temperature=0,
                )
                ev = await sdk_terminal(conn, timeout=TURN_TIMEOUT)
                assert ev.type in ("response.completed", "response.incomplete"), ev
                assert ev.response.previous_response_id == previous
                texts.append(ev.response.output_text)
                previous = ev.response.id
        metrics = await metrics_for(px, relay)
    calls = relay.recording.completions
    tokenized = relay.recording.tokenize[startup:]
    assert len(calls) == len(TURNS) and all(c.status == 200 for c in calls)
    assert len(tokenized) == len(TURNS)  # every turn has new text (its input) to tokenise

    # the first prompt is the one llama.cpp's chat endpoint builds for the same messages:
    # its own rendering, tokenised with the BOS added and special tokens parsed
    first = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": TURNS[0]}]
    rendered = await apply_template(root, first)
    assert calls[0].prompt == await tokenize(root, rendered, add_special=True)
    assert tokenized[0] == {"content": rendered, "add_special": True, "parse_special": True}

    # every later prompt is the previous prompt and the ids generated for it, then new ids
    assert all(continues(calls[k], calls[k - 1]) for k in range(1, len(calls))), (
        f"divergences on /metrics: {divergences(metrics)}\n{chain_report(calls)}"
    )
    # so llama.cpp computes only the new ids: its cache covers the previous prompt and
    # generation but the last generated id, which was sampled and never evaluated
    for k in range(1, len(calls)):
        timings = calls[k].timings
        assert timings is not None
        assert timings["cache_n"] >= len(calls[k - 1].prompt) + len(calls[k - 1].tokens) - 1
    # and its final event holds only the fields wsmode reads (`response_fields`), not the
    # whole prompt as text that it otherwise sends back every turn
    for call in calls:
        assert call.request["response_fields"] == list(LLAMACPP_FINAL_FIELDS)
        assert "stop" in call.final_fields and "timings" in call.final_fields
        assert set(call.final_fields) <= set(LLAMACPP_FINAL_FIELDS), call.final_fields

    # and each later turn tokenises only its new text: what llama.cpp's rendering of the
    # whole conversation has after the previous prompt and the text generated for it (the
    # end of that turn, the new input, the generation prompt), never the earlier history
    history: list[Message] = list(first)
    before = rendered  # the previous prompt, as text
    for k in range(1, len(TURNS)):
        history += [
            {"role": "assistant", "content": texts[k - 1]},
            {"role": "user", "content": TURNS[k]},
        ]
        whole = await apply_template(root, history)
        body = tokenized[k]
        assert body["add_special"] is False and body["parse_special"] is True
        assert TURNS[k] in body["content"] and TURNS[0] not in body["content"], body
        assert whole.startswith(before + calls[k - 1].content), (k, calls[k - 1].content)
        assert body["content"] == whole[len(before) + len(calls[k - 1].content) :]
        before = whole
    reused = sum(len(c.prompt) + len(c.tokens) for c in calls[:-1])
    assert divergences(metrics) == dict.fromkeys(DIVERGENCES, 0.0)
    assert ids_counted(metrics, "reused") == reused > 0


# ---------------------------------------------------------------- (c) the same on Gemma 3


@LLAMACPP
async def test_gemma_continues_token_exactly_over_websocket(
    llamacpp: str, proxy_factory: ProxyFactory
) -> None:
    async with recording_relay(server_root(llamacpp)) as relay:
        px = await token_proxy(proxy_factory, relay)
        previous: str | None = None
        async with connect(px.ws) as ws:
            for text in TURNS:
                body: dict[str, Any] = {
                    "model": "gemma-3-270m",
                    "instructions": INSTRUCTIONS,
                    "input": text,
                    "store": False,
                    "max_output_tokens": 12,
                    "temperature": 0,
                }
                if previous is not None:
                    body["previous_response_id"] = previous
                await send(ws, create(**body))
                events = await until_terminal(ws, timeout=TURN_TIMEOUT)
                final = check_sequence(events).terminal
                assert events[-1]["type"] in ("response.completed", "response.incomplete")
                previous = final["id"]
        metrics = await metrics_for(px, relay)
    calls = relay.recording.completions
    assert len(calls) == len(TURNS)
    assert all(continues(calls[k], calls[k - 1]) for k in range(1, len(calls))), (
        f"divergences on /metrics: {divergences(metrics)}\n{chain_report(calls)}"
    )
    for k in range(1, len(calls)):
        timings = calls[k].timings
        assert timings is not None
        # Gemma 3 uses sliding-window attention: llama.cpp cannot roll its cache back to any
        # point, only to a checkpoint it took a few ids before the end of the previous prompt
        # (5 here), and evaluates the rest again, the previous generation included, even for
        # an exact continuation. 8 leaves room for where that checkpoint falls.
        assert timings["cache_n"] >= len(calls[k - 1].prompt) - 8, (k, timings)


# ---------------------------------------------------------------- (d) a tool loop on Gemma 3


@LLAMACPP
async def test_gemma_tool_call_loop_over_websocket(
    llamacpp: str, proxy_factory: ProxyFactory
) -> None:
    """Codex's shape: tools on every turn, store false, each turn continuing the last with
    the tool's result. The token path sends no `stop`, so the base model writes on after
    `</tool_call>`; wsmode parses the call out of its text anyway."""
    doc = fewshot()
    root = server_root(llamacpp)
    settings = {
        "model": doc["model"],
        "tools": doc["tools"],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "temperature": 0,
        "max_output_tokens": 60,
        "store": False,
    }
    async with recording_relay(root) as relay:
        px = await token_proxy(proxy_factory, relay)
        async with connect(px.ws) as ws:
            await send(ws, create(**settings, input=doc["input"]))
            events = await until_terminal(ws, timeout=TURN_TIMEOUT)
            first = check_sequence(events).terminal
            calls = [i for i in first["output"] if i["type"] == "function_call"]
            # the few-shot prompt makes the base model call the tool: a protocol property
            assert calls and calls[0]["name"] == "get_weather", first["output"]
            assert isinstance(orjson.loads(calls[0]["arguments"]), dict)
            assert calls[0]["call_id"] and calls[0]["id"].startswith("fc_")
            results = [
                {
                    "type": "function_call_output",
                    "call_id": c["call_id"],
                    "output": '{"temp_c": 18}',
                }
                for c in calls
            ]
            await send(ws, create(**settings, input=results, previous_response_id=first["id"]))
            events = await until_terminal(ws, timeout=TURN_TIMEOUT)
            second = check_sequence(events).terminal
            assert events[-1]["type"] in ("response.completed", "response.incomplete")
            assert second["previous_response_id"] == first["id"]
        metrics = await metrics_for(px, relay)
    made = relay.recording.completions
    assert len(made) == 2

    # What the divergence metric must say, derived from llama.cpp's own rendering: the second
    # turn keeps the first turn's generated ids only if the template writes the history with
    # the generation exactly as the model wrote it (the few-shot examples end a call with
    # `</tool_call><end_of_turn>`; a model that writes on after the call does not match).
    tools = [
        {"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
        for t in doc["tools"]
    ]
    before = chat_messages(doc["input"])
    after = chat_messages([*doc["input"], *first["output"], *results])
    r1 = await apply_template(root, before, tools)
    r2 = await apply_template(root, after, tools)
    assert r2.startswith(r1)  # the history itself is unchanged: the first prompt stays
    rerendered = 0.0 if r2.startswith(r1 + made[0].content) else 1.0
    expected = {**dict.fromkeys(DIVERGENCES, 0.0), "generation_rerendered": rerendered}
    assert divergences(metrics) == expected, (made[0].content, r2[len(r1) :])
    # the ids before the divergence are reused: the second prompt starts with the first
    assert made[1].prompt[: len(made[0].prompt)] == made[0].prompt
    if rerendered == 0.0:
        assert continues(made[1], made[0])
    reused = len(made[0].prompt) + (0 if rerendered else len(made[0].tokens))
    assert ids_counted(metrics, "reused") == reused


# ---------------------------------------------------------------- (e) trajectories


@LLAMACPP
async def test_stored_response_tokens_are_what_llamacpp_saw(
    llamacpp_tiny_vocab: str, proxy_factory: ProxyFactory
) -> None:
    owner = {"Authorization": "Bearer sk-owner"}
    async with recording_relay(server_root(llamacpp_tiny_vocab)) as relay:
        px = await token_proxy(proxy_factory, relay)
        ids: list[str] = []
        async with connect(px.ws, additional_headers=owner) as ws:
            for text in TURNS[:2]:
                body: dict[str, Any] = {
                    "model": "tiny-vocab",
                    "input": text,
                    "store": True,
                    "max_output_tokens": 10,
                    "temperature": 0,
                }
                if ids:
                    body["previous_response_id"] = ids[-1]
                await send(ws, create(**body))
                events = await until_terminal(ws, timeout=TURN_TIMEOUT)
                assert events[-1]["type"] in ("response.completed", "response.incomplete")
                ids.append(events[-1]["response"]["id"])
        calls = relay.recording.completions
        assert len(calls) == 2
        async with aiohttp.ClientSession() as http:
            for rid, call in zip(ids, calls, strict=True):
                url = f"{px.http}/responses/{rid}/tokens"
                async with http.get(url, headers=owner) as r:
                    assert r.status == 200
                    doc = await r.json()
                assert doc["prompt_token_ids"] == call.prompt
                assert doc["generation_token_ids"] == call.tokens and call.tokens
                assert doc["generation_log_probs"] is None  # none were asked for
                assert isinstance(doc["fingerprint"], str) and doc["fingerprint"]
                other = {"Authorization": "Bearer sk-someone-else"}
                async with http.get(url, headers=other) as r:
                    assert r.status == 404
                    # the same answer as for an id that does not exist: nothing is disclosed
                    assert (await r.json())["error"]["code"] == "not_found"


# ---------------------------------------------------------------- (f) not a token engine


async def test_a_server_that_is_no_token_engine_is_not_ready(
    proxy_factory: ProxyFactory,
) -> None:
    asked: list[str] = []

    async def nothing_here(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.json_response({"error": "not found"}, status=404)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", nothing_here)
    served = await serve(app)
    try:
        px = await proxy_factory(f"{served.base}/v1", upstream__api="tokens")
        address = f"127.0.0.1:{served.port}"

        async def probed() -> dict[str, Any] | None:
            # a reason that names the server: the probe ran and failed (not "not probed yet")
            status, doc = await readyz(px)
            reasons = doc.get("reasons", [])
            hit = any("token path" in r and address in r for r in reasons)
            return doc if status == 503 and hit else None

        doc: dict[str, Any] = await until(
            probed, 30, every=0.1, message="/readyz never gave the probe's reason"
        )
        assert doc["status"] == "not ready"
        assert "/props" in asked  # llama.cpp's, at the server's root (not under /v1)
        async with connect(px.ws) as ws:
            await send(ws, create(input="hello", store=False))
            events = await until_terminal(ws, timeout=10)
        assert [e["type"] for e in events] == ["error"], events
        assert events[0]["error"]["code"] == "upstream_not_ready", events[0]
        assert "token path" in events[0]["error"]["message"]
        assert "/completion" not in asked and "/tokenize" not in asked
    finally:
        await served.runner.cleanup()
