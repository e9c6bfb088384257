"""The `upstream.api = "auto"` probe: which API the upstream speaks.

The probe is one `POST {upstream}/responses` with the body `{}` at start-up, to each replica
in turn until one answers: a server that has the endpoint rejects the empty body (400/422),
one that has not answers 404 or 405. Any other outcome (401 without the client's key, the
server not up yet, a timeout) leaves the choice to the first real request
(core/dialects/auto.py). A 404 is checked once more with `POST {upstream}/chat/completions`:
a 404 there too means the URL is wrong (a base URL without `/v1`), not that the server
speaks Chat, and is logged as such, deciding nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import aiohttp

from ..core.dialects.auto import REFUSED, AutoDialect
from ..core.urls import redact_url
from .client import UpstreamClient
from .failures import describe

log = logging.getLogger("wsmode.upstream")

PROBE_TIMEOUT = 5.0  # seconds; the probe must not hold up start-up for long


async def probe(
    upstream: UpstreamClient, dialect: AutoDialect, bases: Sequence[str] | None = None
) -> None:
    """Probe the replicas' base URLs (`bases`, by default the client's own) in order: the
    first that answers decides."""
    for base in bases or [upstream.base_url]:
        status = await _post_empty(upstream, base, "/responses")
        if status is not None:
            break
    else:
        log.info("upstream.api=auto: no upstream answered the probe; the first request decides")
        return
    if status == 404 and await _post_empty(upstream, base, "/chat/completions") == 404:
        # neither API is there: the URL is wrong (most often: /v1 left out), not the dialect
        dialect.url_looks_wrong = True
        log.warning(
            "upstream.api=auto: both POST %s/responses and POST %s/chat/completions answered "
            "404: the upstream URL looks wrong (OpenAI-compatible servers serve the API "
            "under /v1); the first request decides",
            redact_url(base),
            redact_url(base),
        )
        return
        return
    if status in REFUSED:
        dialect.decide(dialect.chat, f"the probe POST /responses answered {status}")
    elif status in (400, 422) or 200 <= status < 300:
        dialect.decide(dialect.responses, f"the probe POST /responses answered {status}")
    else:
        log.info("upstream.api=auto: probe answered %s; the first request decides", status)


async def _post_empty(upstream: UpstreamClient, base: str, path: str) -> int | None:
    """The status of `POST {base}{path}` with the body `{}`, or None if it failed."""
    assert upstream.session is not None
    url = base.rstrip("/") + path
    timeout = aiohttp.ClientTimeout(total=min(PROBE_TIMEOUT, upstream.settings.connect_timeout))
    try:
        async with upstream.session.post(
            url, data=b"{}", headers={"Content-Type": "application/json"}, timeout=timeout
        ) as resp:
            return resp.status
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
        log.info(
            "upstream.api=auto: probe of %s failed (%s); the first request decides",
            redact_url(url),
            describe(exc),
        )
        return None
