"""`GET`/`DELETE /v1/responses/{id}` and `GET /v1/responses/{id}/input_items`, served from
the response store (in-process or Redis: proxy/ops/redis_store.py) and scoped to the
caller's credential. When the shared store cannot answer in time they answer 503
`store_unavailable` (the response may exist: a 404 would say it does not)."""

from __future__ import annotations

from aiohttp import web

from ..core import wire
from ..core.api_objects import listed_item
from ..core.errors import ClientError, ProxyError
from ..core.store import StoredResponse, StoreUnavailable, owner_of
from ..runtime import APP_STATE
from . import passthrough
from .responses import error_response


def _not_found(rid: str) -> web.Response:
    return error_response(
        ClientError(
            f"No response found with id '{rid}'.", code="not_found", param="response_id", status=404
        )
    )


def _unavailable() -> web.Response:
    return error_response(
        ProxyError(
            "The response store is unavailable right now; retry later.",
            code="store_unavailable",
            status=503,
            type="server_error",
        )
    )


async def _stored(request: web.Request) -> StoredResponse | None:
    """The stored response the route names; raises StoreUnavailable."""
    store = request.app[APP_STATE].store
    if store is None:
        return None
    return await store.load(request.match_info["response_id"], _owner(request))


def _owner(request: web.Request) -> str:
    return owner_of(request.headers.get("Authorization"))


async def _missing(request: web.Request) -> web.StreamResponse:
    """Not in our store: an upstream that keeps its own state may know it; else 404."""
    if request.app[APP_STATE].settings.upstream.native_previous_response_id:
        return await passthrough(request)
    return _not_found(request.match_info["response_id"])


async def get_response(request: web.Request) -> web.StreamResponse:
    try:
        stored = await _stored(request)
    except StoreUnavailable:
        return _unavailable()
    if stored is None:
        return await _missing(request)
    return web.Response(body=stored.response, content_type="application/json")


async def delete_response(request: web.Request) -> web.StreamResponse:
    store = request.app[APP_STATE].store
    rid = request.match_info["response_id"]
    try:
        deleted = store is not None and await store.delete(rid, _owner(request))
    except StoreUnavailable:
        return _unavailable()
    if not deleted:
        return await _missing(request)
    return web.json_response({"id": rid, "object": "response", "deleted": True})


async def input_items(request: web.Request) -> web.StreamResponse:
    """The items the response was given (its parents' items and its own input), in the
    API's item shape (`ResponseItemList`), paginated like the API: `order` (default desc),
    `limit` (1-100, default 20), `after`."""
    rid = request.match_info["response_id"]
    try:
        stored = await _stored(request)
    except StoreUnavailable:
        return _unavailable()
    if stored is None:
        return await _missing(request)
    q = request.query
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        return error_response(ClientError("'order' must be asc or desc.", param="order"))
    try:
        limit = int(q.get("limit", "20"))
    except ValueError:
        limit = -1
    if not 1 <= limit <= 100:
        return error_response(ClientError("'limit' must be between 1 and 100.", param="limit"))
    # in the API's item shape; an id-less input item gets a stable id
    stem = rid.removeprefix("resp_")[:24]
    items = [
        listed_item(wire.loads(b), f"item_{stem}_{index}")
        for index, b in enumerate(list(stored.entry.items())[: stored.input_count])
    ]
    if order == "desc":
        items.reverse()
    after = q.get("after")
    if after:
        ids = [i.get("id") for i in items]
        if after not in ids:
            return error_response(ClientError(f"No item with id '{after}'.", param="after"))
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return web.json_response(
        {
            "object": "list",
            "data": page,
            "first_id": page[0].get("id") if page else None,
            "last_id": page[-1].get("id") if page else None,
            "has_more": len(items) > limit,
        },
        dumps=lambda o: wire.dumps(o).decode(),
    )


async def response_tokens(request: web.Request) -> web.StreamResponse:
    """The trajectory of a response made on the token path (docs/tokens.md "Trajectories"):
    the ids its prompt was, the ids the model generated and their log probabilities (when
    the request asked for them), under the field names RL frameworks use."""
    rid = request.match_info["response_id"]
    try:
        stored = await _stored(request)
    except StoreUnavailable:
        return _unavailable()
    if stored is None:
        return _not_found(rid)
    turn = stored.entry.tokens
    if turn is None or not turn.fingerprint:  # none, or a warmup's mark that none exist yet
        return error_response(
            ClientError(
                f"Response '{rid}' has no token ids: it was not made on the token path "
                "(upstream.api = tokens).",
                code="no_token_ids",
                param="response_id",
                status=404,
            )
        )
    doc = {
        "id": rid,
        "object": "response.tokens",
        "prompt_token_ids": turn.prompt_ids(),
        "generation_token_ids": turn.generated.ids.tolist(),
        "generation_log_probs": turn.logprobs.tolist() if turn.logprobs is not None else None,
        "fingerprint": turn.fingerprint,
    }
    return web.Response(body=wire.dumps(doc), content_type="application/json")
