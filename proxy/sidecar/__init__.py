"""Sidecar mode: HTTP-only clients get WebSocket mode to a remote server, unchanged.

`chains` (continuation detection) and `relay` (frames -> HTTP answer) are sans-I/O;
`pool`, `exchange` and `app` are the aiohttp adapters around them.
"""
