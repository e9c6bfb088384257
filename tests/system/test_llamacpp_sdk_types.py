"""Every event wsmode serves in front of the real llama.cpp server (its Responses stream,
rebuilt by the repair, and its Chat stream), validated by the openai SDK's own models
(`tests/support/sdk_types.py`), as tests/integration/test_sdk_types.py does in front of the
simulated model: a tool call, its output, and an answer cut by max_output_tokens."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect

from tests.support.chat_streams import SHARED_UPSTREAMS
from tests.support.helpers import Proxy, seconds, user
from tests.support.llamacpp_server import TURN_TIMEOUT
from tests.support.sdk_types import Client

# The first test that asks for the server may install it (about 10 s plus the model download,
# tests/support/llamacpp_server.py) and start it; a test itself takes up to 8 s here.
pytestmark = [pytest.mark.llamacpp, pytest.mark.timeout(seconds(600))]

ProxyFactory = Callable[..., Awaitable[Proxy]]


def _fewshot() -> dict[str, Any]:
    doc = orjson.loads((SHARED_UPSTREAMS / "responses_tool_fewshot_stop.json").read_bytes())
    assert isinstance(doc, dict)
    return doc


@pytest.mark.parametrize("api", ["responses", "chat"])  # responses: rebuilt by the repair
async def test_llamacpp_events_are_sdk_types(
    api: str, llamacpp: str, proxy_factory: ProxyFactory
) -> None:
    proxy = await proxy_factory(llamacpp, upstream__api=api, upstream__read_timeout=TURN_TIMEOUT)
    doc = _fewshot()
    settings = {
        "model": doc["model"],
        "tools": doc["tools"],
        "temperature": 0,
        "max_output_tokens": 60,
        "stop": doc["stop"],
    }
    async with connect(proxy.ws) as ws:
        c = Client(ws)
        first = await c.turn(timeout=TURN_TIMEOUT, input=doc["input"], **settings)
        calls = [i for i in first[-1]["response"]["output"] if i["type"] == "function_call"]
        assert calls, "the few-shot prompt makes the model call its tool"
        outputs = [
            {"type": "function_call_output", "call_id": x["call_id"], "output": "18 C"}
            for x in calls
        ]
        prev = first[-1]["response"]["id"]
        await c.turn(timeout=TURN_TIMEOUT, input=outputs, previous_response_id=prev, **settings)
        short = {**settings, "max_output_tokens": 16, "tools": []}
        cut = await c.turn(timeout=TURN_TIMEOUT, input=[user("Tell me a long story.")], **short)
        assert cut[-1]["type"] in ("response.incomplete", "response.completed")
    assert {"response.function_call_arguments.done", "response.output_item.done"} <= (c.seen.keys())
