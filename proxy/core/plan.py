"""The upstream request of a run: what is sent, where it should go, and how its events read.

A run's request is built when it starts (and again after a native fallback or `upstream.api =
"auto"`'s switch to Chat Completions): the dialect's translator for its events, the body (the
parent's items plus the new input, with the new request's own settings; or, for an upstream
that keeps state, only the new input and the upstream's own `previous_response_id`; or the
input the context manager prepared: compaction items expanded, the window fitted), and a
`Route` for the upstream pool: the replica of the parent and the chain's key (core/routing.py).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from .actions import Route, StartUpstream
from .context.managed_stream import ManagedStream
from .context.manager import ContextManager
from .conversation import EMPTY
from .policy import UpstreamPolicy
from .recorder import PROXY_MADE
from .routing import CLIENT, CONNECTION, CONTENT, chain_key, client_key, content_basis, slot_of
from .runs import Run
from .tokens.dialect import ROOT, TokenDialect


class Planner:
    """Builds one session's upstream requests."""

    def __init__(
        self, context: ContextManager | None, connection: str | None, owner: str = "anonymous"
    ) -> None:
        self.context = context
        # what a new chain whose client names no key is keyed on: the WebSocket connection's
        # id; None (HTTP): the conversation's start (core/routing.py)
        self.connection = connection
        self.owner = owner  # the credential: part of every key (core/routing.py)

    def chain_of(self, run: Run) -> str:
        """The key of the run's chain (core/routing.py): inherited from its parent, else
        derived for the owner from the client's prompt_cache_key, the connection's id or the
        conversation's start."""
        if run.parent is not None and run.parent.chain:
            return run.parent.chain
        req = run.req
        if (key := client_key(req.settings)) is not None:
            return chain_key(self.owner, CLIENT, key)
        if self.connection is not None:
            return chain_key(self.owner, CONNECTION, self.connection)
        return chain_key(self.owner, CONTENT, content_basis(req.settings, req.input_items))

    def can_go_native(self, run: Run, policy: UpstreamPolicy) -> bool:
        """The run may continue with the upstream's own `previous_response_id`: the upstream
        keeps state, and stored the parent, which it produced itself."""
        return (
            policy.native_previous_response_id
            and run.parent is not None
            and run.parent.settings.get("store") is not False
            and not run.parent.settings.get(PROXY_MADE)
        )

    def request(self, run: Run, policy: UpstreamPolicy) -> StartUpstream:
        """The run's upstream request under `policy`; sets its translator (`run.stream`).
        Raises ClientError when the dialect cannot express the request (chat: strict_tools,
        ...)."""
        req, dialect = run.req, policy.dialect
        patch = {"previous_response_id": req.previous_response_id, "store": req.store}
        chain = run.chain or self.chain_of(run)
        run.chain = chain
        session_key = policy.session_key_in_body and client_key(req.settings) is None
        if session_key:  # the proxy's own key goes upstream; the client's answer shows none
            patch["prompt_cache_key"] = None
        if isinstance(dialect, TokenDialect):  # the token path (never native: config.py)
            run.stream = run.tokens = dialect.stream(patch, req.body)
        else:
            run.stream = dialect.translator(patch, req.body)
        # an upstream that keeps state must store what the client stores, so that the next
        # turn can continue natively; a stateless one needs to store nothing
        store = req.store if policy.native_previous_response_id else policy.store
        extra: dict[str, Any] = {"stream": True, "store": store}
        settings = req.settings
        if run.native:
            assert run.parent is not None
            extra["previous_response_id"] = run.parent.id
            items = list(req.input_items)
            if run.context is not None:  # context_management is the proxy's, not sent
                settings = run.context.settings
        elif run.context is not None:  # prepared by the ContextManager
            assert self.context is not None
            prep = run.context
            run.stream = ManagedStream(
                run.stream,
                estimate_usage=partial(self.context.usage, prep),
                first_item=prep.compaction,
                extra_usage=prep.summary_usage,
            )
            settings, items = prep.settings, prep.items
        else:
            parent = run.parent or EMPTY
            items = parent.items()
            items.extend(req.input_items)
            if self.context is not None:  # usage the upstream does not report is estimated
                run.estimate_usage = partial(self.context.usage_of_items, settings, items)
        if session_key:
            extra["prompt_cache_key"] = chain
        if policy.llamacpp_slots:
            extra["id_slot"] = slot_of(chain, policy.llamacpp_slots)
        route = Route(run.parent.replica if run.parent else None, chain)
        moderate = tuple(run.moderation) if run.moderation is not None else None
        if isinstance(dialect, TokenDialect) and run.tokens is not None:
            # a compaction starts a new token chain; anything else continues the parent's
            compacted = run.context is not None and run.context.compaction is not None
            origin = None if compacted else run.parent
            new = len(req.input_items)
            prompt, run.tokens.fingerprint = dialect.prompt(settings, items, origin, extra, new)
            run.tokens.prompt = prompt
            path = ROOT + prompt.engine.generate_path
            start = StartUpstream(run.id, [], path, moderate, route, tokens=prompt)
        else:
            body = dialect.body(settings, extra, items)
            start = StartUpstream(run.id, body, dialect.path, moderate, route)
        run.moderation = None  # once: not again after a native fallback or auto's switch
        return start


__all__ = ["Planner"]
