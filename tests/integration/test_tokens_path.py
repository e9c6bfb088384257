"""The token path (`upstream.api = "tokens"`, proxy/core/tokens/) end to end: a real wsmode in
front of the simulated model speaking llama.cpp's, vLLM's or SGLang's token endpoints on a
loopback port, driven by real clients (the `websockets` library, the openai SDK's
`responses.connect()`, plain HTTP).

What a user sees is checked against what the model server saw: each later prompt starts with
the earlier prompt and the ids the model generated (`GET /v1/responses/{id}/tokens`), the
server's own prompt cache says so (`cached_tokens` grows), the text a client gets is the text
of the generated ids (the server's `/detokenize`), and the reuse is counted
(`wsmode_prompt_ids_total`, `wsmode_token_divergences_total`, the console feed).

Cancel, steer and failures on the token path are in test_tokens_path_faults.py.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from websockets.asyncio.client import connect

from tests.support.console_feed import short
from tests.support.helpers import (
    Proxy,
    Sim,
    create,
    post_responses,
    recv,
    sdk_chain,
    seconds,
    send,
    user,
)
from tests.support.token_path import (
    counts,
    delta,
    detokenize,
    engine_settings,
    output_text,
    streamed_text,
    token_record,
    trajectory,
    wait_ready,
    ws_turn,
)

SimFactory = Callable[..., Awaitable[Sim]]
ProxyFactory = Callable[..., Awaitable[Proxy]]

# engine, sim settings: llama.cpp is found by the probe (/props); vLLM and SGLang are named
ENGINES = {
    "llamacpp": ("auto", {}),
    "vllm": ("vllm", {}),
    "sglang": ("sglang", {}),
    "sglang-incremental": ("sglang", {"sglang_incremental_output": True}),
}


async def token_proxy(
    sim_factory: SimFactory, proxy_factory: ProxyFactory, engine: str = "auto", **overrides: Any
) -> tuple[Sim, Proxy]:
    """A sim and a ready token-path proxy in front of it; `sim__X` overrides go to the sim."""
    sim_overrides = {k[5:]: overrides.pop(k) for k in list(overrides) if k.startswith("sim__")}
    sim = await sim_factory(**sim_overrides)
    proxy = await proxy_factory(sim.url, **engine_settings(engine), **overrides)
    await wait_ready(proxy)
    return sim, proxy


def cached(response: dict[str, Any]) -> int:
    return int(response["usage"]["input_tokens_details"]["cached_tokens"])


# ------------------------------------------------------------------ each engine, three turns


@pytest.mark.parametrize("name", list(ENGINES))
async def test_three_chained_turns_reuse_every_earlier_id(
    name: str, sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    engine, sim_settings = ENGINES[name]
    sim = await sim_factory(**sim_settings)
    proxy = await proxy_factory(sim.url, **engine_settings(engine))
    await wait_ready(proxy)
    async with aiohttp.ClientSession() as http, http.get(f"{proxy.served.base}/healthz") as r:
        health = await r.json()
    assert health["dialect"] == "tokens"
    assert health["token_engine"] == ("llamacpp" if engine == "auto" else engine)

    before = await counts(proxy)
    responses: list[dict[str, Any]] = []
    ids: list[tuple[list[int], list[int]]] = []
    async with connect(proxy.ws) as ws:
        previous: str | None = None
        for word in ("apple", "banana", "cherry"):
            events = await ws_turn(ws, input=f"remember {word}", previous_response_id=previous)
            done = events[-1]
            assert done["type"] == "response.completed", done
            response = done["response"]
            prompt, generated = await trajectory(proxy, response["id"])
            text = await detokenize(sim.served.base, generated)
            # the client's text is the text of the ids the model generated
            assert generated and output_text(response) == streamed_text(events) == text.strip()
            # the prompt the server got is the conversation as the template renders it
            rendered = await detokenize(sim.served.base, prompt)
            assert rendered.endswith(f"remember {word}<end_of_turn>\n<start_of_turn>model\n")
            responses.append(response)
            ids.append((prompt, generated))
            previous = response["id"]
    # every later prompt is the earlier prompt, the generated ids, then the new text
    for (p0, g0), (p1, _) in itertools.pairwise(ids):
        assert p1[: len(p0) + len(g0)] == p0 + g0
        assert len(p1) > len(p0) + len(g0)
    # the server's prompt cache found the reused ids: cached tokens grow turn by turn
    hits = [cached(r) for r in responses]
    assert hits[0] == 0 and 0 < hits[1] < hits[2], hits
    assert all(
        r["usage"]["input_tokens"] == len(p) for r, (p, _) in zip(responses, ids, strict=True)
    )
    used = delta(await counts(proxy), before)
    reused = sum(len(p0) + len(g0) for p0, g0 in ids[:2])
    assert used["reused"] == reused
    assert used["tokenized"] == sum(len(p) for p, _ in ids) - reused
    assert used["fingerprint"] == used["history_changed"] == used["generation_rerendered"] == 0


async def test_the_openai_sdk_chains_over_websocket_mode_on_the_token_path(
    sim_factory: SimFactory, proxy_factory: ProxyFactory, openai_client: Any
) -> None:
    sim, proxy = await token_proxy(sim_factory, proxy_factory)
    client = openai_client(proxy.http, api_key="sk-test")
    async with client.responses.connect() as conn:
        done = await sdk_chain(conn, ("alpha", "beta", "gamma"))
    # the store is the credential's: the route answers the key that made the responses
    key = {"Authorization": "Bearer sk-test"}
    trajectories = [await trajectory(proxy, r.id, key) for r in done]
    for response, (_, generated) in zip(done, trajectories, strict=True):
        assert response.output_text == (await detokenize(sim.served.base, generated)).strip()
    for (p0, g0), (p1, _) in itertools.pairwise(trajectories):
        assert p1[: len(p0) + len(g0)] == p0 + g0
    assert done[2].usage is not None and done[2].usage.input_tokens_details.cached_tokens > 0


# ------------------------------------------------------------------ over plain HTTP


@pytest.mark.parametrize("stream", [True, False])
async def test_http_previous_response_id_reuses_the_ids(
    stream: bool, sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    sim, proxy = await token_proxy(sim_factory, proxy_factory)

    async def turn(text: str, previous: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {"model": "sim", "input": text, "store": True, "stream": stream}
        if previous:
            body["previous_response_id"] = previous
        status, answer = await post_responses(proxy, body)
        assert status == 200, answer
        if stream:
            assert answer[-1].event == "response.completed"
            response: dict[str, Any] = orjson.loads(answer[-1].data)["response"]
            deltas = [orjson.loads(e.data) for e in answer]
            assert streamed_text(deltas) == output_text(response)
            return response
        assert answer["status"] == "completed"
        return dict(answer)

    first = await turn("hello over http", None)
    second = await turn("and again", first["id"])
    p0, g0 = await trajectory(proxy, first["id"])
    p1, g1 = await trajectory(proxy, second["id"])
    assert p1[: len(p0) + len(g0)] == p0 + g0
    assert second["previous_response_id"] == first["id"]
    assert output_text(second) == (await detokenize(sim.served.base, g1)).strip()
    assert cached(second) > 0


# ------------------------------------------------------------------ lanes and forks


async def test_a_fork_on_two_lanes_starts_each_child_from_the_parents_ids(
    sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    sim, proxy = await token_proxy(
        sim_factory, proxy_factory, sim__tokens_per_second=400, sim__output_tokens=20
    )
    async with connect(proxy.ws) as ws:
        parent = (await ws_turn(ws, input="the parent turn"))[-1]["response"]
        # two children of one parent, each on its own lane, in flight together
        await send(ws, create(input="left child", previous_response_id=parent["id"], stream_id="L"))
        await send(
            ws, create(input="right child", previous_response_id=parent["id"], stream_id="R")
        )
        ends: dict[str, dict[str, Any]] = {}
        while len(ends) < 2:
            ev = await recv(ws)
            assert ev.get("stream_id") in ("L", "R"), ev
            if ev["type"] in ("response.completed", "response.failed", "error"):
                ends[ev["stream_id"]] = ev
        assert all(e["type"] == "response.completed" for e in ends.values()), ends
        left, right = ends["L"]["response"], ends["R"]["response"]
        # the left lane goes on from its own child
        grandchild = (
            await ws_turn(ws, input="left again", previous_response_id=left["id"], stream_id="L")
        )[-1]["response"]
    pp, pg = await trajectory(proxy, parent["id"])
    lp, lg = await trajectory(proxy, left["id"])
    rp, _ = await trajectory(proxy, right["id"])
    gp, _ = await trajectory(proxy, grandchild["id"])
    assert lp[: len(pp) + len(pg)] == pp + pg
    assert rp[: len(pp) + len(pg)] == pp + pg
    assert (await detokenize(sim.served.base, lp)).endswith(
        "left child<end_of_turn>\n<start_of_turn>model\n"
    )
    assert (await detokenize(sim.served.base, rp)).endswith(
        "right child<end_of_turn>\n<start_of_turn>model\n"
    )
    # the grandchild reuses its own branch, and holds nothing of the other one
    assert gp[: len(lp) + len(lg)] == lp + lg
    assert "right child" not in await detokenize(sim.served.base, gp)
    used = await counts(proxy)
    assert used["history_changed"] == used["generation_rerendered"] == used["fingerprint"] == 0


# ------------------------------------------------------------------ generate: false


async def test_a_warmup_input_joins_the_next_prompt_after_the_reused_ids(
    sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    sim, proxy = await token_proxy(sim_factory, proxy_factory)
    async with connect(proxy.ws) as ws:
        first = (await ws_turn(ws, input="first real turn"))[-1]["response"]
        started = len(sim.state.requests)
        warm = (
            await ws_turn(
                ws, input="warm-up context", generate=False, previous_response_id=first["id"]
            )
        )[-1]
        assert warm["type"] == "response.completed" and warm["response"]["output"] == []
        assert len(sim.state.requests) == started, "a warm-up must not reach the model"
        before = await counts(proxy)
        real = (
            await ws_turn(
                ws, input="the real question", previous_response_id=warm["response"]["id"]
            )
        )[-1]
    assert real["type"] == "response.completed", real
    p0, g0 = await trajectory(proxy, first["id"])
    p1, _ = await trajectory(proxy, real["response"]["id"])
    assert p1[: len(p0) + len(g0)] == p0 + g0  # the ids before the warm-up are reused
    rest = await detokenize(sim.served.base, p1[len(p0) + len(g0) :])
    assert rest.index("warm-up context") < rest.index("the real question")
    used = delta(await counts(proxy), before)
    assert used["reused"] == len(p0) + len(g0)
    assert used["history_changed"] == used["generation_rerendered"] == 0


# ------------------------------------------------------------------ truncation, compaction

WINDOW = 1600


def fact(i: int) -> str:
    return f"fact-{i} the user notes that item {i} matters " + "and more detail " * 35


async def test_truncation_is_a_counted_history_change(
    sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    """`truncation: "auto"` drops the oldest turns once the conversation passes the window:
    the rendered history no longer begins as the kept ids do, a `history_changed`
    divergence, counted; the turn still completes, from a prompt without the dropped turn."""
    sim, proxy = await token_proxy(sim_factory, proxy_factory, upstream__context_window=WINDOW)
    previous: str | None = None
    diverged: list[int] = []
    async with connect(proxy.ws) as ws:
        for i in range(6):
            before = await counts(proxy)
            events = await ws_turn(
                ws, input=[user(fact(i))], truncation="auto", previous_response_id=previous
            )
            assert events[-1]["type"] == "response.completed", (i, events[-1])
            response = events[-1]["response"]
            used = delta(await counts(proxy), before)
            prompt, _ = await trajectory(proxy, response["id"])
            text = await detokenize(sim.served.base, prompt)
            assert fact(i) in text
            if used["history_changed"]:
                assert used["history_changed"] == 1
                assert "fact-0 " not in text  # the oldest turn was dropped
                diverged.append(i)
            else:
                assert all(fact(j) in text for j in range(i + 1))
            assert used["generation_rerendered"] == used["fingerprint"] == 0
            previous = response["id"]
    assert diverged, "the conversation never passed the window"
    assert diverged == list(range(diverged[0], 6))  # from then on every turn drops one


async def test_a_compaction_starts_a_new_token_chain(
    sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    sim, proxy = await token_proxy(sim_factory, proxy_factory, upstream__context_window=WINDOW)
    cm = [{"type": "compaction", "compact_threshold": 1000}]
    previous: str | None = None
    compacted: str | None = None
    after: str | None = None
    async with connect(proxy.ws) as ws:
        for i in range(10):
            before = await counts(proxy)
            events = await ws_turn(
                ws, input=[user(fact(i))], context_management=cm, previous_response_id=previous
            )
            assert events[-1]["type"] == "response.completed", (i, events[-1])
            response = events[-1]["response"]
            used = delta(await counts(proxy), before)
            assert used["history_changed"] == used["generation_rerendered"] == 0, (i, used)
            if compacted is not None:
                after = response["id"]
                break
            if response["output"][0]["type"] == "compaction":
                compacted = response["id"]
                prompt, _ = await trajectory(proxy, compacted)
                assert used["reused"] == 0 and used["tokenized"] == len(prompt)  # afresh
                assert "fact-0 " not in await detokenize(sim.served.base, prompt)
            previous = response["id"]
    assert compacted is not None and after is not None, "no compaction happened"
    cp, cg = await trajectory(proxy, compacted)
    ap, _ = await trajectory(proxy, after)
    assert ap[: len(cp) + len(cg)] == cp + cg  # the new chain goes on from the compaction


# ------------------------------------------------------------------ the console feed


async def test_the_console_feed_shows_the_ids_sent_and_reused(
    sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    _, proxy = await token_proxy(sim_factory, proxy_factory)
    async with connect(proxy.ws) as ws:
        first = (await ws_turn(ws, input="one"))[-1]["response"]
        second = (await ws_turn(ws, input="two", previous_response_id=first["id"]))[-1]["response"]
    p0, g0 = await trajectory(proxy, first["id"])
    p1, _ = await trajectory(proxy, second["id"])
    turns: list[dict[str, Any]] = []
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{proxy.served.base}/console/feed") as r,
    ):
        assert r.status == 200
        buffer = b""
        async with asyncio.timeout(seconds(10)):
            async for chunk in r.content.iter_any():
                buffer += chunk
                while b"\n\n" in buffer:
                    block, buffer = buffer.split(b"\n\n", 1)
                    for line in block.split(b"\n"):
                        if (
                            line.startswith(b"data: ")
                            and (ev := orjson.loads(line[6:]))["type"] == "turn"
                        ):
                            turns.append(ev)
                if len(turns) >= 2:
                    break
    # with content hidden the feed names a response by a shortened id only
    shown = {t["response_id"]: t for t in turns}
    one, two = shown[short(first["id"])], shown[short(second["id"])]
    assert one["ids_sent"] == len(p0) and one["ids_reused"] == 0
    assert two["ids_sent"] == len(p1)
    assert two["ids_reused"] == len(p0) + len(g0)
    assert one["divergence"] is None is two["divergence"]


# ------------------------------------------------------------------ trajectories


async def test_a_trajectory_has_a_log_probability_per_generated_id_when_asked(
    sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    """`GET /v1/responses/{id}/tokens` with `include: ["message.output_text.logprobs"]`: one
    log probability per generated id, as the server reported them; without it, null."""
    _, proxy = await token_proxy(sim_factory, proxy_factory)
    async with connect(proxy.ws) as ws:
        asked = (
            await ws_turn(ws, input="hello", store=True, include=["message.output_text.logprobs"])
        )[-1]["response"]["id"]
        plain = (await ws_turn(ws, input="again", store=True, previous_response_id=asked))[-1]
    status, doc = await token_record(proxy, asked)
    assert status == 200
    assert doc["generation_token_ids"]
    first = doc["prompt_token_ids"] + doc["generation_token_ids"]
    probs = doc["generation_log_probs"]
    assert isinstance(probs, list) and len(probs) == len(doc["generation_token_ids"])
    assert all(isinstance(p, float) and p <= 0.0 for p in probs)
    status, doc = await token_record(proxy, plain["response"]["id"])
    assert status == 200 and doc["generation_log_probs"] is None
    assert doc["prompt_token_ids"][: len(first)] == first  # and the chain went on
