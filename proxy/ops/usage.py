"""Usage accounting off the critical path.

When a response has ended and its terminal event has been written to the client, the
adapter hands a `PendingRecord` (references to data it already holds, no serialisation) to
`UsageSink.offer`, which never waits: the record goes into a bounded queue, or is dropped and
counted when the queue is full. A background task turns records into JSON and appends them to
a JSONL file (in a worker thread, so a slow disk never stalls the event loop) or POSTs them in
batches to a webhook. A stuck sink therefore costs dropped records, never a delayed turn.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from ..config import UsageSettings
from ..core import wire
from .metrics import Metrics

log = logging.getLogger("wsmode.usage")


@dataclass(frozen=True, slots=True)
class PendingRecord:
    time: float
    request_id: str | None
    owner: str  # a hash of the client's credential, never the credential
    dialect: str
    response_id: str | None
    outcome: str
    usage: dict[str, Any] | None
    model: str | None  # the response's model, else the request's
    client_bytes: int
    upstream_bytes: int
    upstream_received: int
    queued_seconds: float | None
    first_event_seconds: float | None
    duration_seconds: float | None
    upstream: str | None = None  # the replica that served it (upstream/pool.py)


def render(rec: PendingRecord) -> dict[str, Any]:

    def ms(s: float | None) -> float | None:
        return None if s is None else round(s * 1000, 3)

    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(rec.time))
        + f".{int(rec.time % 1 * 1000):03d}Z",
        "request_id": rec.request_id,
        "credential": rec.owner,
        "response_id": rec.response_id,
        "outcome": rec.outcome,
        "dialect": rec.dialect,
        "upstream": rec.upstream,
        "model": rec.model,
        "usage": rec.usage,
        "bytes": {
            "from_client": rec.client_bytes,
            "to_upstream": rec.upstream_bytes,
            "from_upstream": rec.upstream_received,
        },
        "timings_ms": {
            "queued": ms(rec.queued_seconds),
            "first_event": ms(rec.first_event_seconds),
            "total": ms(rec.duration_seconds),
        },
    }


class UsageSink:
    def __init__(self, settings: UsageSettings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.queue: asyncio.Queue[PendingRecord] = asyncio.Queue(settings.queue_size)
        self._task: asyncio.Task[None] | None = None
        self._http: aiohttp.ClientSession | None = None

    @staticmethod
    def enabled(settings: UsageSettings) -> bool:
        return bool(settings.jsonl_path or settings.webhook_url)

    def offer(self, rec: PendingRecord) -> None:
        """Never blocks: queue the record, or drop and count it."""
        try:
            self.queue.put_nowait(rec)
        except asyncio.QueueFull:
            self.metrics.usage_records.labels("dropped").inc()

    async def start(self) -> None:
        if self.settings.webhook_url:
            timeout = aiohttp.ClientTimeout(total=self.settings.webhook_timeout)
            self._http = aiohttp.ClientSession(timeout=timeout)
        self._task = asyncio.create_task(self._run(), name="wsmode-usage")

    async def stop(self, timeout: float = 5.0) -> None:
        """Write what is queued (for at most `timeout` seconds), then stop."""
        if self._task is not None:
            try:
                async with asyncio.timeout(timeout):
                    await self.queue.join()
            except TimeoutError:
                log.warning("usage: %d records not written at shutdown", self.queue.qsize())
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._http is not None:
            await self._http.close()

    async def _run(self) -> None:
        while True:
            batch = [await self.queue.get()]
            while len(batch) < self.settings.batch_size and not self.queue.empty():
                batch.append(self.queue.get_nowait())
            try:
                await self._write([render(r) for r in batch])
                self.metrics.usage_records.labels("written").inc(len(batch))
            except Exception as exc:  # a sink failure loses records, never the proxy
                self.metrics.usage_records.labels("failed").inc(len(batch))
                log.warning("usage: %d records lost: %s", len(batch), type(exc).__name__)
            finally:
                for _ in batch:
                    self.queue.task_done()

    async def _write(self, docs: list[dict[str, Any]]) -> None:
        if self.settings.jsonl_path:
            data = b"".join(wire.dumps(d) + b"\n" for d in docs)
            await asyncio.to_thread(_append, self.settings.jsonl_path, data)
        if self._http is not None:
            async with self._http.post(
                self.settings.webhook_url,
                data=wire.dumps(docs),
                headers={"Content-Type": "application/json"},
            ) as resp:
                if resp.status >= 300:
                    raise RuntimeError(f"webhook answered HTTP {resp.status}")


def _append(path: str, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)
