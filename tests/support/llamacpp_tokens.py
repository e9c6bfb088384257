"""What the tests of the token path against REAL llama.cpp share (tests/system/
test_llamacpp_tokens_*.py): llama.cpp's own endpoints (`/apply-template`, `/tokenize`,
`/detokenize`), wsmode on the token path in front of a recording relay
(tests/support/recording_relay.py), the token metrics, and the checks that read exactness
from what llama.cpp itself was sent and streamed back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
from websockets.asyncio.client import ClientConnection
from wsmode.core.tokens.chain import DIVERGENCES

from tests.support.chat_streams import SHARED_UPSTREAMS
from tests.support.helpers import (
    Metrics,
    Proxy,
    create,
    sample,
    scrape,
    scrape_until,
    send,
    until,
    until_terminal,
)
from tests.support.llamacpp_server import TURN_TIMEOUT
from tests.support.recording_relay import Completion, RecordingRelay

ProxyFactory = Callable[..., Awaitable[Proxy]]
Message = dict[str, Any]


def root(base: str) -> str:
    """The server's root from its base URL (…/v1): llama.cpp's own endpoints live there."""
    return base.removesuffix("/v1")


async def post(server: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.post(server + path, json=body) as r:
        raw = await r.read()
        assert r.status == 200, (path, r.status, raw[:500])
    doc = orjson.loads(raw)
    assert isinstance(doc, dict)
    return doc


async def apply_template(
    server: str, messages: list[Message], tools: list[dict[str, Any]] | None = None
) -> str:
    """llama.cpp's own rendering (`POST /apply-template`), with the generation prompt."""
    body: dict[str, Any] = {"messages": messages}
    if tools:
        body["tools"] = tools
    prompt = (await post(server, "/apply-template", body))["prompt"]
    assert isinstance(prompt, str)
    return prompt


async def tokenize(server: str, text: str, *, add_special: bool) -> list[int]:
    body = {"content": text, "add_special": add_special, "parse_special": True}
    tokens = (await post(server, "/tokenize", body))["tokens"]
    assert isinstance(tokens, list)
    return tokens


async def detokenize(server: str, ids: list[int]) -> str:
    """llama.cpp's own text for `ids`."""
    content = (await post(server, "/detokenize", {"tokens": ids}))["content"]
    assert isinstance(content, str)
    return content


async def readyz(px: Proxy) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.get(f"{px.served.base}/readyz") as r:
        return r.status, dict(await r.json())


async def token_proxy(
    proxy_factory: ProxyFactory, relay: RecordingRelay | str, **overrides: Any
) -> Proxy:
    """wsmode on the token path in front of the relay (or a server root), once its start-up
    probe succeeded (`/readyz` 200)."""
    target = relay.base if isinstance(relay, RecordingRelay) else relay
    settings = {"upstream__api": "tokens", "upstream__read_timeout": TURN_TIMEOUT, **overrides}
    px = await proxy_factory(f"{target}/v1", **settings)

    async def ready() -> bool:
        status, _ = await readyz(px)
        return status == 200

    await until(ready, 30, every=0.1, message="the token path never became ready")
    return px


def divergences(metrics: Metrics) -> dict[str, float]:
    return {r: sample(metrics, "wsmode_token_divergences_total", reason=r) for r in DIVERGENCES}


def ids_counted(metrics: Metrics, kind: str) -> float:
    """`wsmode_prompt_ids_total{kind}`: "reused" (from the cache) or "tokenized"."""
    return sample(metrics, "wsmode_prompt_ids_total", kind=kind)


async def counts(px: Proxy) -> dict[str, float]:
    m = await scrape(px)
    return {**divergences(m), **{k: ids_counted(m, k) for k in ("reused", "tokenized")}}


async def metrics_for(px: Proxy, relay: RecordingRelay) -> Metrics:
    """/metrics once every turn the relay saw is counted: the prompt ids wsmode reports
    (reused + tokenized) add up to the ids it sent."""
    sent = sum(len(c.prompt) for c in relay.recording.completions)
    return await scrape_until(
        px,
        lambda m: ids_counted(m, "reused") + ids_counted(m, "tokenized") == sent,
        timeout=10,
    )


def head(c: Completion) -> list[int]:
    """A completion's prompt and the ids llama.cpp generated for it: what a continuation of
    its response starts with."""
    return c.prompt + c.tokens


def continues(later: Completion, earlier: Completion) -> bool:
    """`later`'s prompt starts with exactly `earlier`'s prompt and the ids llama.cpp
    generated for it, as it streamed them."""
    h = head(earlier)
    return later.prompt[: len(h)] == h


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def chain_report(completions: list[Completion]) -> str:
    """Where each prompt stops following its predecessor, for a failure's message."""
    lines = []
    for k in range(1, len(completions)):
        prev, cur = completions[k - 1], completions[k]
        h = head(prev)
        at = common_prefix(h, cur.prompt)
        lines.append(
            f"turn {k}: previous prompt {len(prev.prompt)} ids + {len(prev.tokens)} generated "
            f"({prev.content!r}); this prompt follows them for {at} ids; "
            f"there it has {cur.prompt[at : at + 8]}, the chain {h[at : at + 8]}"
        )
    return "\n".join(lines)


async def turn(ws: ClientConnection, **fields: Any) -> list[dict[str, Any]]:
    """One create and its events up to the terminal one (a real model's time allowed)."""
    await send(ws, create(**fields))
    return await until_terminal(ws, timeout=TURN_TIMEOUT)


async def completed(ws: ClientConnection, **fields: Any) -> dict[str, Any]:
    """One turn that must end completed or incomplete (the token limit): its response."""
    events = await turn(ws, **fields)
    end = events[-1]
    assert end["type"] in ("response.completed", "response.incomplete"), end
    response: dict[str, Any] = end["response"]
    return response


def fewshot() -> dict[str, Any]:
    """The few-shot Responses body that makes the base Gemma model call a tool."""
    doc = orjson.loads((SHARED_UPSTREAMS / "responses_tool_fewshot_stop.json").read_bytes())
    assert isinstance(doc, dict)
    return doc


def chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses function tools as wsmode's chat translation writes them (hosted tools such
    as `web_search` left out, as it leaves them out)."""
    keys = ("name", "description", "parameters", "strict")
    return [
        {"type": "function", "function": {k: t[k] for k in keys if t.get(k) is not None}}
        for t in tools
        if t.get("type") == "function"
    ]


def chat_messages(items: list[dict[str, Any]]) -> list[Message]:
    """Responses input and output items as Chat Completions messages, grouped the way
    wsmode's chat path groups them: a function call joins the open assistant turn, assistant
    text opens a new one, anything else closes it."""
    out: list[Message] = []
    open_turn: Message | None = None
    for item in items:
        kind = item.get("type", "message")
        if kind == "function_call":
            if open_turn is None:
                open_turn = {"role": "assistant", "content": ""}
                out.append(open_turn)
            call = {"name": item["name"], "arguments": item["arguments"]}
            open_turn.setdefault("tool_calls", []).append(
                {"id": item["call_id"], "type": "function", "function": call}
            )
        elif kind == "function_call_output":
            open_turn = None
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
        elif kind == "message" and item["role"] == "assistant":
            content = item["content"]
            if isinstance(content, list):
                content = "\n".join(p["text"] for p in content if p["type"] == "output_text")
            open_turn = {"role": "assistant", "content": content}
            out.append(open_turn)
        elif kind == "message":
            open_turn = None
            content = item["content"]
            if isinstance(content, list):  # text parts joined by a newline, as wsmode joins
                content = "\n".join(p["text"] for p in content if "text" in p)
            role = "system" if item["role"] == "developer" else item["role"]
            out.append({"role": role, "content": content})
    return out
