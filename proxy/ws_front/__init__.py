"""The WebSocket front: `GET /v1/responses` upgraded, one `Session` per connection."""

from .connection import ClientConnection

__all__ = ["ClientConnection"]
