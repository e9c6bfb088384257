"""The moderation hook of the input guards (docs/guards.md): the new text of a turn, and only
that, is posted to an OpenAI-compatible `POST /v1/moderations`, and a flagged turn is refused
before the model request goes out.

    {"model": "...", "input": ["text of item 1", "text of item 2", ...]}  ->  {"results":
    [{"flagged": bool, "categories": {...}}, ...]}

The runner (proxy/upstream/runner.py) awaits `Moderator.check` between the session's
`StartUpstream` and the model request, so the wait is part of the proxy's share of the time
to first event. The endpoint gets `guards.moderation_api_key` as its credential, never the
client's nor the upstream's. When it cannot answer (unreachable, timeout, a non-200, an
answer without `results`), `guards.moderation_fail_open` decides: refuse the turn with 503
`moderation_unavailable` (the default) or let it through.
"""

from __future__ import annotations

import logging
from typing import Any

import aiohttp

from ..config import GuardSettings
from ..core import wire
from ..core.errors import ProxyError
from ..core.guards import refused_prompt
from .client import refuse_redirects

log = logging.getLogger("wsmode.guards")


class ModerationUnavailable(ProxyError):
    status = 503
    type = "server_error"

    def __init__(self, why: str) -> None:
        super().__init__(
            f"The input could not be checked by the moderation service ({why}); try again.",
            code="moderation_unavailable",
        )


class Moderator:
    def __init__(self, settings: GuardSettings) -> None:
        self.settings = settings
        self.session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        headers = {"Content-Type": "application/json"}
        if self.settings.moderation_api_key:
            headers["Authorization"] = f"Bearer {self.settings.moderation_api_key}"
        # like every upstream session, it never follows a redirect: the new text and the
        # moderation key would go to wherever it points (a refused one is a failure below)
        self.session = aiohttp.ClientSession(
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=self.settings.moderation_timeout),
            middlewares=(refuse_redirects,),
        )

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def check(self, texts: tuple[str, ...], label: str) -> ProxyError | None:
        """None lets the turn through; else the error that refuses it."""
        try:
            results = await self._ask(texts)
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
            why = "timed out" if isinstance(exc, TimeoutError) else str(exc) or type(exc).__name__
            log.warning("%s moderation failed: %s", label, why)
            if self.settings.moderation_fail_open:
                return None
            return ModerationUnavailable(why)
        flagged = [r for r in results if r.get("flagged") is True]
        if not flagged:
            return None
        categories = sorted({name for r in flagged for name in _true(r)})
        log.info("%s input flagged by moderation (%s)", label, ", ".join(categories) or "-")
        what = f" ({', '.join(categories)})" if categories else ""
        return refused_prompt(f"the input was flagged by the moderation service{what}")

    async def _ask(self, texts: tuple[str, ...]) -> list[dict[str, Any]]:
        assert self.session is not None, "Moderator.start() was not awaited"
        body = wire.dumps({"model": self.settings.moderation_model, "input": list(texts)})
        async with self.session.post(self.settings.moderation_url, data=body) as resp:
            raw = await resp.read()
            if resp.status != 200:
                raise ValueError(f"it answered HTTP {resp.status}")
        try:
            doc = wire.loads(raw)
        except wire.JSONDecodeError:
            raise ValueError("its answer is not JSON") from None
        results = doc.get("results") if isinstance(doc, dict) else None
        if not isinstance(results, list) or not all(isinstance(r, dict) for r in results):
            raise ValueError("its answer has no 'results' list")
        return results


def _true(result: dict[str, Any]) -> list[str]:
    cats = result.get("categories")
    return [k for k, v in cats.items() if v is True] if isinstance(cats, dict) else []
