"""An HTTP-only client's conversation through the sidecar: every turn resends the whole
history so far, as such a client does (the sidecar turns it into continuations)."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson


async def conversation(base: str, words: list[str]) -> list[dict[str, Any]]:
    """One turn per word, each `POST {base}/responses` carrying the history before it: for
    each, the response id, its output text and the bytes of the request sent."""
    history: list[Any] = []
    done: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as http:
        for word in words:
            history.append(
                {"type": "message", "role": "user", "content": f"please remember {word}"}
            )
            body = orjson.dumps({"model": "sim", "input": history, "store": False})
            headers = {"Content-Type": "application/json"}
            async with http.post(f"{base}/responses", data=body, headers=headers) as r:
                assert r.status == 200, await r.text()
                doc = await r.json()
            history += doc["output"]
            done.append(
                {"response_id": doc["id"], "output": doc["output"], "client_bytes": len(body)}
            )
    return done
