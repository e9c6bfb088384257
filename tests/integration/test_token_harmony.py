"""gpt-oss's harmony format on the token path (proxy/core/tokens/harmony.py), with the real
vocabulary read by `openai-harmony` (tests/support/harmony_vocab.py gets the file).

The parser is fed the ids `openai-harmony` itself encodes for gpt-oss's output, cut in every
way a stream may cut them. Then a wsmode in front of a llama.cpp-shaped model that speaks
harmony (`GptOssServer`: a simulated model on the real vocabulary, streaming one id per
event and, like llama-server without `--special`, no text for the framing tokens) runs a tool
loop over WebSocket mode: the format is found from the template, the call comes back as a
function_call item, and the next turn's prompt is the first one's ids, its generated ids and
then the new ones, with nothing diverged.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp import web
from websockets.asyncio.client import connect
from wsmode.core.tokens.formats import detect_format, parser_for
from wsmode.core.tokens.parsers import (
    BrokenCall,
    CallPiece,
    Piece,
    ReasoningEnd,
    ReasoningPiece,
    TextPiece,
)
from wsmode.upstream.harmony_vocab import harmony_encoding

from tests.support.harmony_vocab import vocabulary_folder
from tests.support.helpers import Proxy, Served, serve
from tests.support.parser_pieces import joined
from tests.support.token_path import counts, delta, engine_settings, trajectory, wait_ready, ws_turn

CALL = '<|channel|>commentary to=functions.shell <|constrain|>json<|message|>{"q": "ls"}<|call|>'
THOUGHT = "<|channel|>analysis<|message|>The listing shows two files.<|end|>"
FINAL = "<|start|>assistant<|channel|>final<|message|>There are two files.<|return|>"
# gpt-oss's framing, in a template as small as a test needs (the real one adds the system
# and developer messages, reasoning effort and tool namespaces)
TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}<|start|>assistant"
    "{%- if m.tool_calls -%}{%- for tc in m.tool_calls -%}"
    "<|channel|>commentary to=functions.{{ tc.function.name }} <|constrain|>json"
    "<|message|>{{ tc.function.arguments | tojson }}<|call|>"
    "{%- endfor -%}"
    "{%- else -%}<|channel|>final<|message|>{{ m.content }}<|end|>{%- endif -%}"
    "{%- elif m.role == 'tool' -%}<|start|>tool<|message|>{{ m.content }}<|end|>"
    "{%- else -%}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}"
)


@pytest.fixture(scope="module")
def vocabulary() -> Iterator[None]:
    folder = vocabulary_folder()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIKTOKEN_ENCODINGS_BASE", str(folder))
        yield


@pytest.fixture
async def encoding(vocabulary: None) -> Any:
    return await harmony_encoding()


def encode(encoding: Any, text: str) -> list[int]:
    return list(encoding.encode(text, allowed_special="all"))


def parse(encoding: Any, ids: list[int], size: int) -> tuple[list[Piece], bool]:
    parser = parser_for("harmony", TEMPLATE, harmony=encoding)
    assert hasattr(parser, "feed_ids")
    pieces: list[Piece] = []
    for at in range(0, len(ids), size):
        pieces += parser.feed_ids(ids[at : at + size])
    pieces += parser.end()
    return pieces, parser.after_calls_text


# ------------------------------------------------------------------ the parser


def test_the_template_says_harmony() -> None:
    assert detect_format(TEMPLATE) == "harmony"


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_reasoning_then_a_call_in_every_cut(encoding: Any, size: int) -> None:
    ids = encode(encoding, THOUGHT + "<|start|>assistant" + CALL)
    pieces, after = parse(encoding, ids, size)
    assert joined(pieces) == [
        ReasoningPiece("The listing shows two files."),
        CallPiece("shell", '{"q":"ls"}'),
    ]
    assert sum(isinstance(p, ReasoningEnd) for p in pieces) == 1
    assert not after


@pytest.mark.parametrize("size", [1, 4, 1000])
def test_reasoning_then_the_final_message(encoding: Any, size: int) -> None:
    pieces, _ = parse(encoding, encode(encoding, THOUGHT + FINAL), size)
    assert joined(pieces) == [
        ReasoningPiece("The listing shows two files."),
        TextPiece("There are two files."),
    ]


def test_a_preamble_on_commentary_is_text_for_the_user(encoding: Any) -> None:
    preamble = "<|channel|>commentary<|message|>Looking now.<|end|><|start|>assistant"
    pieces, _ = parse(encoding, encode(encoding, preamble + CALL), 1)
    assert joined(pieces) == [TextPiece("Looking now."), CallPiece("shell", '{"q":"ls"}')]


def test_arguments_that_are_not_json_are_a_broken_call(encoding: Any) -> None:
    bad = CALL.replace('{"q": "ls"}', '{"q": "ls"')
    pieces, _ = parse(encoding, encode(encoding, bad), 1)
    assert joined(pieces) == [BrokenCall('{"q": "ls"', "invalid_json")]


def test_generation_ending_inside_a_call_is_unterminated(encoding: Any) -> None:
    cut = CALL.removesuffix("<|call|>")
    pieces, _ = parse(encoding, encode(encoding, cut), 1)
    assert joined(pieces) == [BrokenCall('{"q": "ls"}', "unterminated")]


def test_ids_that_are_not_harmony_end_the_output_as_malformed(encoding: Any) -> None:
    ids = encode(encoding, "<|channel|>final<|message|>ok<|end|><|message|><|message|>x")
    pieces, _ = parse(encoding, ids, 1)
    assert joined(pieces)[0] == TextPiece("ok")
    assert isinstance(pieces[-1], BrokenCall) and pieces[-1].reason == "malformed"


def test_text_after_the_calls_is_dropped_and_said(encoding: Any) -> None:
    text = CALL + "<|start|>assistant<|channel|>final<|message|>and more<|return|>"
    pieces, after = parse(encoding, encode(encoding, text), 1)
    assert joined(pieces) == [CallPiece("shell", '{"q":"ls"}')]
    assert after


# ------------------------------------------------------------------ through wsmode


@dataclass
class GptOssServer:
    """llama-server as the token path asks it (GET /props, GET /v1/models, POST /tokenize,
    POST /completion) for a gpt-oss model: the harmony vocabulary, `TEMPLATE`, and the
    answers in `answers`, one per /completion, each streamed one id per event."""

    encoding: Any
    answers: list[str]
    completions: list[list[int]] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/props", self._props)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/completion", self._completion)
        return app

    async def _props(self, request: web.Request) -> web.Response:
        settings = {"n_ctx": 131072}
        return web.json_response(
            {"default_generation_settings": settings, "total_slots": 1, "chat_template": TEMPLATE}
        )

    async def _models(self, request: web.Request) -> web.Response:
        data = [{"id": "gpt-oss", "object": "model", "meta": {"n_vocab": 201088}}]
        return web.json_response({"object": "list", "data": data})

    async def _tokenize(self, request: web.Request) -> web.Response:
        doc = await request.json()
        if doc.get("parse_special") is True:
            ids = encode(self.encoding, doc["content"])
        else:
            ids = list(self.encoding.encode(doc["content"], allowed_special=set()))
        return web.json_response({"tokens": ids})

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        prompt = (await request.json())["prompt"]
        self.completions.append(prompt)
        ids = encode(self.encoding, self.answers[len(self.completions) - 1])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for n, token in enumerate(ids, 1):
            special = self.encoding.is_special_token(token)
            text = "" if special else self.encoding.decode([token])
            event = {"content": text, "tokens": [token], "stop": False, "tokens_predicted": n}
            await resp.write(b"data: " + orjson.dumps(event) + b"\n\n")
        final = {
            "content": "",
            "tokens": [],
            "stop": True,
            "stop_type": "eos",
            "tokens_predicted": len(ids),
            "tokens_evaluated": len(prompt),
            "timings": {"cache_n": 0, "prompt_n": len(prompt)},
        }
        await resp.write(b"data: " + orjson.dumps(final) + b"\n\n")
        await resp.write_eof()
        return resp


@pytest.fixture
async def gpt_oss(encoding: Any) -> AsyncIterator[tuple[GptOssServer, Served]]:
    server = GptOssServer(encoding, [CALL, THOUGHT + FINAL])
    served = await serve(server.app())
    yield server, served
    await served.runner.cleanup()


async def test_a_tool_loop_over_websocket_continues_token_exactly(
    gpt_oss: tuple[GptOssServer, Served],
    proxy_factory: Callable[..., Awaitable[Proxy]],
) -> None:
    server, served = gpt_oss
    proxy = await proxy_factory(f"{served.base}/v1", **engine_settings("auto"), store__enabled=True)
    await wait_ready(proxy)
    tool = {"type": "function", "name": "shell", "parameters": {"type": "object"}}
    before = await counts(proxy)
    async with connect(proxy.ws) as ws:
        first = await ws_turn(ws, input="What is here?", tools=[tool], store=True)
        done = first[-1]["response"]
        assert first[-1]["type"] == "response.completed", first[-1]
        calls = [item for item in done["output"] if item["type"] == "function_call"]
        assert [(c["name"], c["arguments"]) for c in calls] == [("shell", '{"q":"ls"}')]
        output = {"type": "function_call_output", "call_id": calls[0]["call_id"], "output": "a b"}
        second = await ws_turn(
            ws, input=[output], tools=[tool], store=True, previous_response_id=done["id"]
        )
    end = second[-1]["response"]
    assert second[-1]["type"] == "response.completed", second[-1]
    kinds = [item["type"] for item in end["output"]]
    assert kinds == ["reasoning", "message"]
    assert end["output"][1]["content"][0]["text"] == "There are two files."
    prompt, generated = await trajectory(proxy, done["id"])
    assert server.completions[0] == prompt
    assert server.encoding.decode(generated) == CALL
    follow = server.completions[1]
    assert follow[: len(prompt) + len(generated)] == prompt + generated
    new = server.encoding.decode(follow[len(prompt) + len(generated) :])
    assert new == "<|start|>tool<|message|>a b<|end|><|start|>assistant"
    used = delta(await counts(proxy), before)
    assert used["reused"] == len(prompt) + len(generated)
    assert used["history_changed"] == used["generation_rerendered"] == used["fingerprint"] == 0


async def test_without_the_vocabulary_the_token_path_is_not_ready(
    gpt_oss: tuple[GptOssServer, Served],
    proxy_factory: Callable[..., Awaitable[Proxy]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
) -> None:
    """A harmony template with no vocabulary to read it: /readyz 503 naming what is missing,
    never a fall back to text."""
    from wsmode.upstream import harmony_vocab

    monkeypatch.setattr(harmony_vocab, "_loaded", None)
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(tmp_path))  # an empty folder
    _, served = gpt_oss
    proxy = await proxy_factory(f"{served.base}/v1", **engine_settings("auto"))
    import aiohttp

    from tests.support.helpers import until

    async def says_why() -> bool:
        async with aiohttp.ClientSession() as http, http.get(f"{proxy.served.base}/readyz") as r:
            return r.status == 503 and "TIKTOKEN_ENCODINGS_BASE" in await r.text()

    await until(says_why, 10, message="/readyz never said the vocabulary is missing")
