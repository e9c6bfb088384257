"""`POST /v1/responses/compact` for stateless upstreams (docs/protocol.md "Compaction").

The body is a create's (`model` required, `input` and/or `previous_response_id` from the
caller's stored responses, `instructions`). The proxy asks the upstream model to summarise
the older part of the conversation and answers the compacted window:

    {"id", "object": "response.compaction", "created_at", "output": [compaction item,
     ...recent items], "usage"}

The client starts a new chain with that `output` followed by its new items. Nothing is
stored. With `compaction.enabled = false` the request goes to the upstream as it is.
"""

from __future__ import annotations

import logging
import time

from aiohttp import web

from ..core import wire
from ..core.context.compaction import parse_compact
from ..core.context.manager import compaction_failed
from ..core.conversation import CachedResponse
from ..core.errors import (
    ProxyError,
    UpstreamError,
    previous_response_not_found,
    stored_response_unavailable,
)
from ..core.ids import new_id
from ..core.store import StoreUnavailable, owner_of
from ..runtime import APP_STATE
from . import passthrough
from .responses import error_response, json_object

log = logging.getLogger("wsmode.compaction")


async def compact_response(request: web.Request) -> web.StreamResponse:
    state = request.app[APP_STATE]
    context = state.context
    if context is None:
        return await passthrough(request)
    owner = owner_of(request.headers.get("Authorization"))
    try:
        req = parse_compact(await json_object(request))
        parent: CachedResponse | None = None
        if req.previous_response_id is not None:
            rid = req.previous_response_id
            try:
                stored = await state.store.load(rid, owner) if state.store else None
            except StoreUnavailable:
                raise stored_response_unavailable(rid) from None
            if stored is None:
                raise previous_response_not_found(rid)
            parent = stored.entry
        prep = context.plan_compact(parent, req, owner)
        if prep.cut is not None:
            dialect = state.policy.dialect
            upstream = state.runner(request.headers, f"compaction for {request.remote}")
            more = True
            while more:  # one request per chunk of the older part (context.summary_action)
                action = context.summary_action(0, prep, req.model, dialect, req.instructions)
                result = await upstream.summary(dialect, action)
                more = context.absorb_summary(prep, result)
        output, usage = context.compact_output(prep, owner, new_id("cmp"))
    except UpstreamError as err:
        log.warning("compaction for %s failed (%s): %s", request.remote, err.status, err.message)
        return error_response(compaction_failed(err))
    except ProxyError as err:
        return error_response(err)
    doc = {
        "id": new_id("resp"),
        "object": "response.compaction",
        "created_at": int(time.time()),
        "output": output,
        "usage": usage,
    }
    return web.Response(body=wire.dumps(doc), content_type="application/json")
