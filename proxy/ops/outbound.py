"""One client connection's share of the memory budget's `outbound` part (core/memory.py).

A front reports after each write what its socket's write buffer holds (bytes written for
the client and not yet taken by the kernel), and nothing once the connection is over. The
WebSocket front does it per connection, the HTTP front per streamed (SSE) response.
"""

from __future__ import annotations

import asyncio

from ..core.memory import MemoryBudget


class Outbound:
    def __init__(self, budget: MemoryBudget) -> None:
        self.budget = budget
        self.held = 0  # bytes in the write buffer at the last report

    def count(self, transport: asyncio.BaseTransport | None) -> None:
        """What the write buffer holds now (a closed transport holds nothing)."""
        held = 0
        if isinstance(transport, asyncio.WriteTransport) and not transport.is_closing():
            held = transport.get_write_buffer_size()
        self._set(held)

    def release(self) -> None:
        """The connection is over: its buffer no longer counts."""
        self._set(0)

    def _set(self, held: int) -> None:
        self.budget.outbound += held - self.held
        self.held = held
