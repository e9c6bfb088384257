"""Settings: frozen dataclasses, filled by one pure loader.

A section the core reads is the core's own dataclass, so its defaults are written once:
[limits] is `SessionLimits` (proxy/core/policy.py), [tokens] and [compaction] are
proxy/core/context/settings.py's, [chat] is `ChatOptions` (proxy/core/dialects/
chat_settings.py). Their checks run when they are built and raise `ValueError`, which the
loader reports as `ConfigError`.

Precedence, lowest first: the defaults below < a base TOML file (`WSMODE_BASE_CONFIG`: the
Docker image's own defaults, so a mounted file still wins over them) < the TOML file
(`--config`, `WSMODE_CONFIG`) < `WSMODE_<SECTION>_<KEY>` environment variables < command-line
flags. The flags of `wsmode serve` also have short environment names: `WSMODE_HOST`, `WSMODE_PORT`,
`WSMODE_UPSTREAM`. Every key is documented in config/wsmode.example.toml, which a test loads.
Unknown sections or keys are errors, never silently ignored.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .core.context.settings import CompactionSettings, TokensSettings
from .core.dialects.chat_settings import ChatOptions
from .core.policy import SessionLimits
from .core.tokens.formats import TOOL_FORMATS
from .core.urls import redact_url, without_userinfo
from .sim.settings import SimSettings
from .telemetry.settings import TelemetrySettings

MiB = 1024 * 1024
SECRET = {"secret": True}  # field metadata: never printed (config_view.py `redacted`)
LOG_FORMATS = ("text", "json")

_ORIGIN = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/?#\s]+$")


class ConfigError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class ServerSettings:
    # ---- listening: address, processes sharing the port, TLS
    host: str = "127.0.0.1"
    port: int = 8080
    workers: int = 1  # processes sharing the port (SO_REUSEPORT); state and limits per worker
    reuse_port: bool = False  # let several processes listen on the port (workers set it)
    # native TLS, PEM files; both set: the listener speaks TLS (wss://, https://)
    tls_cert_file: str = ""  # certificate chain; may hold the key too
    tls_key_file: str = ""  # private key, unless it is in tls_cert_file
    # once listening, write the base URL here (the Docker image's health check reads it); "": no
    listen_file: str = ""
    # ---- frames and buffers
    max_message_bytes: int = 16 * MiB  # larger client frames close the socket with 1009
    compression: bool = False  # permessage-deflate; costly on large frames
    outbound_buffer_bytes: int = 1 * MiB  # per connection, queued for a client not reading
    # ---- timeouts
    connection_lifetime_seconds: float = 3600.0  # then websocket_connection_limit_reached
    ping_interval: float = 30.0  # server pings; a peer silent for 1.5x this is reaped; 0: off
    send_timeout: float = 30.0  # a response blocked this long on a full buffer is cancelled
    header_timeout: float = 30.0  # a request's headers must arrive within this; idle too
    body_timeout: float = 60.0  # a body the proxy reads whole must arrive within this; 0: off
    drain_grace_seconds: float = 30.0  # on SIGTERM, how long in-flight responses may finish
    # ---- connection limits: how many, and one client's share of the event loop
    max_connections: int = 4096  # open WebSocket connections; beyond it an upgrade gets 503
    max_frames_per_second: float = 1000.0  # per connection; past it its reading slows; 0: off
    max_bytes_per_second: int = 64 * MiB  # per connection, the same for bytes; 0: off
    # ---- cross-site policy: browser origins, CORS, Host names
    allowed_origins: tuple[str, ...] = ()  # browser origins allowed in; others get 403
    cors_origins: tuple[str, ...] = ()  # origins that also get CORS headers and preflights
    allowed_hosts: tuple[str, ...] = ()  # Host names accepted besides loopback ones
    # ---- logging and metrics
    log_level: str = "INFO"
    log_format: str = "text"  # text or json
    log_repeat_limit: int = 20  # WARNING+ lines per message per 10 s, then suppressed; 0: off
    metrics: bool = True  # serve Prometheus metrics on /metrics


@dataclass(frozen=True, slots=True)
class UpstreamSettings:
    # ---- the model server: where, which API, whose credential, its context window
    url: str = ""  # empty: front the built-in simulated model
    api: str = "responses"
    api_key: str = field(default="", metadata=SECRET)  # set: replaces the client's credential
    context_window: int = 0  # tokens; 0 = unknown (no truncation, no overflow check)
    # ---- the token path, api = "tokens" (docs/tokens.md): engine, template, tool calls
    token_engine: str = "auto"  # or llamacpp, vllm, sglang; auto: from what the server says
    chat_template_file: str = ""  # the model's chat template; "": the server's (llama.cpp)
    tool_format: str = "auto"  # hermes, mistral, llama3, harmony or none; auto: the template's
    # ---- what is sent: the rebuilt request, or the upstream's own previous_response_id
    store: bool = False  # the `store` sent upstream on rebuilt requests
    native_previous_response_id: bool = False
    # ---- timeouts and sizes of one request
    connect_timeout: float = 10.0
    read_timeout: float = 300.0  # longest silence mid-stream; there is no total timeout
    max_event_bytes: int = 64 * MiB  # one SSE event (a response.completed can be large)
    max_error_body_bytes: int = 64 * 1024
    # ---- concurrency, per replica: requests in flight, and those waiting for one
    max_connections: int = 256  # pooled HTTP connections = concurrent upstream requests
    max_queued_requests: int = 1024  # requests waiting for one of max_connections
    queue_timeout: float = 30.0  # longest wait for a free upstream connection
    # ---- several replicas of one model server (docs/pool.md): where a conversation goes
    urls: tuple[str, ...] = ()  # base URLs of the replicas; `url` alone is a pool of one
    affinity: str = "conversation"  # or "none": least-loaded, ties round-robin
    load_bound: float = 1.0  # a new chain skips a replica at ceil(this x average); 0: off
    session_header: str = "x-session-id"  # the chain's key as a header upstream; "": none
    session_key_in_body: bool = True  # ... and as prompt_cache_key when the client set none
    llamacpp_slots: int = 0  # > 0: pin each chain to llama.cpp slot hash(chain) % this
    # ---- the replicas' health: active checks, passive ejection
    health_path: str = "models"  # GET, resolved against each base URL (RFC 3986)
    health_interval: float = 5.0  # seconds between active checks; 0: no active checks
    health_timeout: float = 2.0  # one check's time limit
    healthy_threshold: int = 1  # consecutive good checks that make a replica healthy again
    unhealthy_threshold: int = 2  # consecutive failed checks that make it unhealthy
    eject_after_failures: int = 3  # consecutive request failures (connect, 5xx); 0: never
    eject_seconds: float = 30.0  # how long an ejected replica gets no requests

    @property
    def replicas(self) -> tuple[str, ...]:
        """The base URLs of the pool's replicas (empty: the built-in simulated model)."""
        return self.urls or ((self.url,) if self.url else ())


AFFINITY_CHOICES = ("conversation", "none")


@dataclass(frozen=True, slots=True)
class CacheSettings:
    connection_max_entries: int = 1024
    connection_max_bytes: int = 256 * MiB
    process_max_entries: int = 100_000
    process_max_bytes: int = 4096 * MiB


@dataclass(frozen=True, slots=True)
class StoreSettings:
    # ---- whether responses are stored, where, and for how long
    enabled: bool = True
    # "memory" (this process) or "redis" (shared by replicas and workers; docs/store.md)
    backend: str = "memory"
    ttl_seconds: float = 86_400.0
    # ---- the memory backend's bounds (they bound nothing else)
    max_entries: int = 100_000
    max_bytes: int = 1024 * MiB
    # ---- the Redis backend
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_timeout: float = 0.5  # seconds a turn may wait on Redis, per round trip
    # Redis not answering: "degrade" (/readyz stays 200 and says so) or "leave" (503)
    readiness: str = "degrade"


@dataclass(frozen=True, slots=True)
class SidecarSettings:
    """`wsmode sidecar`: plain HTTP in on localhost, WebSocket mode out to a remote server."""

    # ---- listening
    host: str = "127.0.0.1"
    port: int = 8090
    # ---- the remote server and the credential sent to it
    upstream: str = ""  # base URL of the WebSocket-mode server, ending in /v1 (required)
    # sent to the upstream in place of the client's credential (and of the proxy key, when
    # [auth] is on: that key is the sidecar's own and never goes upstream); "": the client's
    api_key: str = field(default="", metadata=SECRET)
    # ---- timeouts and sizes
    connect_timeout: float = 10.0  # TCP, TLS and the WebSocket upgrade
    read_timeout: float = 300.0  # longest silence while waiting for the next upstream event
    max_request_bytes: int = 64 * MiB  # largest HTTP request body from a client
    max_message_bytes: int = 64 * MiB  # largest WebSocket message from the upstream
    # ---- pooled connections to the remote server
    max_connections: int = 32  # pooled upstream WebSockets, across all credentials
    idle_timeout: float = 300.0  # close a pooled WebSocket idle this long; 0 keeps it
    refusal_memory: float = 600.0  # after an upgrade refused with 404/426, HTTP this long
    max_http_connections: int = 64  # pooled HTTP connections for routes sent over HTTP
    # ---- conversations remembered, to send only what is new
    max_credentials: int = 64  # credentials whose chains are remembered
    chains_per_credential: int = 256  # chains remembered per credential


@dataclass(frozen=True, slots=True)
class AuthSettings:
    # Proxy API keys clients must present as `Authorization: Bearer KEY`; none: no auth.
    api_keys: tuple[str, ...] = field(default=(), metadata=SECRET)
    api_key_hashes_file: str = ""  # lines of sha256 hex digests of accepted keys
    # keys accepted on /metrics only (a scraper's, which cannot call the model). /metrics
    # needs a key when these or the proxy keys above are set; neither: it is open
    metrics_api_keys: tuple[str, ...] = field(default=(), metadata=SECRET)


@dataclass(frozen=True, slots=True)
class UsageSettings:
    # ---- where the records go
    jsonl_path: str = ""  # append one JSON record per response to this file
    webhook_url: str = field(default="", metadata=SECRET)  # or POST batches of records here
    webhook_timeout: float = 10.0
    # ---- queueing and batching
    queue_size: int = 10_000  # records waiting for the writer; beyond it they are dropped
    batch_size: int = 100  # records per write or POST


@dataclass(frozen=True, slots=True)
class GuardSettings:
    """`[guards]`: checks of each turn's new input (docs/guards.md)."""

    # ---- checks of the input itself
    max_new_input_bytes: int = 0  # 0: no limit
    deny_patterns: tuple[str, ...] = ()  # regular expressions, case-insensitive
    # ---- a moderation endpoint
    moderation_url: str = ""  # an OpenAI-compatible /v1/moderations; "": off
    moderation_model: str = "omni-moderation-latest"
    moderation_api_key: str = field(default="", metadata=SECRET)
    moderation_timeout: float = 5.0
    moderation_fail_open: bool = False  # endpoint failures let the turn through

    def __post_init__(self) -> None:
        if self.max_new_input_bytes < 0:
            raise ValueError("guards.max_new_input_bytes must be 0 or more")
        for pattern in self.deny_patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"guards.deny_patterns: {pattern!r} is not valid: {exc}") from None
        if self.moderation_url and not self.moderation_url.startswith(("http://", "https://")):
            raise ValueError("guards.moderation_url must start with http:// or https://")
        if self.moderation_timeout <= 0:
            raise ValueError("guards.moderation_timeout must be more than 0")


@dataclass(frozen=True, slots=True)
class ConsoleSettings:
    """`[console]`: the browser console at /console (docs/console.md)."""

    # ---- whether it is on, and what it shows
    enabled: bool | str = "auto"  # "auto": on only when server.host is a loopback address
    show_content: bool = False  # show the text of inputs and outputs (off: sizes only)
    # ---- its feed and snapshots
    ring_size: int = 500  # recent events a page that opens the feed gets first
    max_subscribers: int = 8  # console pages open at once; one more gets 503
    subscriber_queue: int = 256  # events waiting for a slow page; past it that page is dropped
    state_interval: float = 1.0  # seconds between snapshots (connections, upstreams, memory)

    def __post_init__(self) -> None:
        if isinstance(self.enabled, str) and self.enabled != "auto":
            raise ValueError('console.enabled must be "auto", true or false')
        for key in ("ring_size", "max_subscribers", "subscriber_queue"):
            if getattr(self, key) < 1:
                raise ValueError(f"console.{key} must be at least 1")
        if self.state_interval <= 0:
            raise ValueError("console.state_interval must be more than 0")


@dataclass(frozen=True, slots=True)
class Settings:
    server: ServerSettings = field(default_factory=ServerSettings)
    upstream: UpstreamSettings = field(default_factory=UpstreamSettings)
    cache: CacheSettings = field(default_factory=CacheSettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    limits: SessionLimits = field(default_factory=SessionLimits)
    tokens: TokensSettings = field(default_factory=TokensSettings)
    compaction: CompactionSettings = field(default_factory=CompactionSettings)
    auth: AuthSettings = field(default_factory=AuthSettings)
    usage: UsageSettings = field(default_factory=UsageSettings)
    sim: SimSettings = field(default_factory=SimSettings)
    sidecar: SidecarSettings = field(default_factory=SidecarSettings)
    chat: ChatOptions = field(default_factory=ChatOptions)
    guards: GuardSettings = field(default_factory=GuardSettings)
    console: ConsoleSettings = field(default_factory=ConsoleSettings)
    telemetry: TelemetrySettings = field(default_factory=TelemetrySettings)


# Short environment names for the flags of `wsmode serve`.
ENV_ALIASES = {
    "WSMODE_HOST": ("server", "host"),
    "WSMODE_PORT": ("server", "port"),
    "WSMODE_UPSTREAM": ("upstream", "url"),
}
API_CHOICES = ("responses", "chat", "auto", "tokens")
TOKEN_ENGINES = ("auto", "llamacpp", "vllm", "sglang")
_FILE_VARIABLES = frozenset({"WSMODE_CONFIG", "WSMODE_BASE_CONFIG"})  # name files, not keys


def _sections() -> dict[str, type[Any]]:
    return {f.name: _field_type(Settings, f.name) for f in dataclasses.fields(Settings)}


def _field_type(cls: type[Any], name: str) -> Any:
    return typing.get_type_hints(cls)[name]


def _coerce(section: str, key: str, value: Any, kind: Any) -> Any:
    where = f"{section}.{key}"
    if isinstance(kind, types.UnionType):  # `X | None`, or a choice such as `bool | str`
        kinds = [a for a in kind.__args__ if a is not type(None)]
        for first in kinds[:-1]:  # the first kind the value is, or converts to
            try:
                return _coerce(section, key, value, first)
            except ConfigError:
                pass
        kind = kinds[-1]
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("0", "false", "no", "off"):
            return False
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value.replace("_", ""))
            except ValueError:
                pass
    elif kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    elif kind is str and isinstance(value, str):
        return value
    elif typing.get_origin(kind) is tuple:  # tuple[str, ...]: a TOML array or "a,b" in env
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return tuple(value)
        kind = list
    raise ConfigError(f"{where}: expected {getattr(kind, '__name__', kind)}, got {value!r}")


def load_settings(
    path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Build the effective settings. `overrides` maps "section.key" to flag values."""
    layers: dict[str, dict[str, Any]] = {name: {} for name in _sections()}
    for file in ((env or {}).get("WSMODE_BASE_CONFIG"), path):
        if not file:
            continue
        try:
            with open(file, "rb") as f:
                doc = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config file {file}: {exc}") from exc
        for section, table in doc.items():
            if section not in layers or not isinstance(table, dict):
                raise ConfigError(f"unknown config section [{section}]")
            layers[section].update(table)
    for name, value in (env or {}).items():
        if name in _FILE_VARIABLES:
            continue
        if name in ENV_ALIASES:
            section, key = ENV_ALIASES[name]
            layers[section][key] = value
        elif name.startswith("WSMODE_"):
            rest = name.removeprefix("WSMODE_").lower()
            section, _, key = rest.partition("_")
            if section not in layers:
                raise ConfigError(f"unknown environment variable {name}")
            layers[section][key] = value
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        section, _, key = dotted.partition(".")
        layers[section][key] = value
    built: dict[str, Any] = {}
    for section, cls in _sections().items():
        names = {f.name for f in dataclasses.fields(cls)}
        values = {}
        for key, value in layers[section].items():
            if key not in names:
                raise ConfigError(f"unknown config key {section}.{key}")
            values[key] = _coerce(section, key, value, _field_type(cls, key))
        try:
            built[section] = cls(**values)
        except ValueError as exc:  # a section's own checks (`__post_init__`)
            raise ConfigError(str(exc)) from None
    settings = Settings(**built)
    _validate(settings)
    return settings


def _validate(s: Settings) -> None:
    u = s.upstream
    for key, value, choices in (
        ("api", u.api, API_CHOICES),
        ("token_engine", u.token_engine, TOKEN_ENGINES),
        ("tool_format", u.tool_format, TOOL_FORMATS),
        ("affinity", u.affinity, AFFINITY_CHOICES),
    ):
        if value not in choices:
            raise ConfigError(f"upstream.{key} must be one of {', '.join(choices)}")
    if u.native_previous_response_id and u.api != "responses":
        raise ConfigError("upstream.native_previous_response_id needs upstream.api = responses")
    _validate_pool(u)
    if u.chat_template_file and not os.path.isfile(u.chat_template_file):
        raise ConfigError(f"upstream.chat_template_file is not a file: {u.chat_template_file}")
    if s.server.tls_key_file and not s.server.tls_cert_file:
        raise ConfigError("server.tls_key_file needs server.tls_cert_file")
    if not 0 <= s.server.port <= 65535:
        raise ConfigError("server.port must be between 0 and 65535")
    if s.sidecar.upstream and not s.sidecar.upstream.startswith(("http://", "https://")):
        raise ConfigError("sidecar.upstream must start with http:// or https://")
    if not 0 <= s.sidecar.port <= 65535:
        raise ConfigError("sidecar.port must be between 0 and 65535")
    if s.sidecar.max_connections < 1:
        raise ConfigError("sidecar.max_connections must be at least 1")
    if s.server.log_format not in LOG_FORMATS:
        raise ConfigError(f"server.log_format must be one of {', '.join(LOG_FORMATS)}")
    if s.usage.webhook_url and not s.usage.webhook_url.startswith(("http://", "https://")):
        raise ConfigError("usage.webhook_url must start with http:// or https://")
    if s.usage.queue_size < 1 or s.usage.batch_size < 1:
        raise ConfigError("usage.queue_size and usage.batch_size must be at least 1")
    if s.server.workers < 1:
        raise ConfigError("server.workers must be at least 1")
    _validate_store(s.store)
    for origin in (*s.server.allowed_origins, *s.server.cors_origins):
        if origin != "*" and not _ORIGIN.match(origin):
            raise ConfigError(
                f"server.allowed_origins/cors_origins: {origin!r} is not an origin "
                "(scheme://host[:port], no path) nor '*'"
            )
    if s.server.outbound_buffer_bytes < 1024:
        raise ConfigError("server.outbound_buffer_bytes must be at least 1024")
    for key in ("max_queued_bytes_per_connection", "process_max_bytes"):
        if getattr(s.limits, key) < s.server.max_message_bytes:  # one create must always fit
            raise ConfigError(f"limits.{key} must be at least server.max_message_bytes")
    for section in (s.server, s.upstream, s.cache, s.store, s.limits, s.usage, s.sidecar):
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
                raise ConfigError(f"{f.name} must not be negative")


def _validate_pool(u: UpstreamSettings) -> None:
    if u.url and u.urls and (u.url,) != u.urls:
        raise ConfigError("upstream.url and upstream.urls are both set: list every URL in urls")
    for url in u.replicas:
        if not url.startswith(("http://", "https://")):
            what = "upstream.urls entries" if u.urls else "upstream.url"
            raise ConfigError(f"{what} must start with http:// or https:// ({redact_url(url)})")
    stripped = [without_userinfo(url).rstrip("/") for url in u.replicas]
    if len(set(stripped)) != len(stripped):  # two credentials for one server count too
        raise ConfigError("upstream.urls lists the same URL twice")
    if u.native_previous_response_id and len(u.replicas) > 1:
        raise ConfigError(
            "upstream.native_previous_response_id needs a single upstream: the upstream's "
            "own state lives on one replica, and a chain that moves would lose it"
        )
    if 0 < u.load_bound < 1:
        raise ConfigError("upstream.load_bound must be 0 (off) or at least 1")
    if u.health_interval and u.health_timeout <= 0:
        raise ConfigError("upstream.health_timeout must be more than 0")
    if u.healthy_threshold < 1 or u.unhealthy_threshold < 1:
        raise ConfigError("upstream.healthy_threshold and unhealthy_threshold must be at least 1")
    if u.session_header and not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", u.session_header):
        raise ConfigError("upstream.session_header must be a valid header name, or empty")


STORE_BACKENDS = ("memory", "redis")
STORE_READINESS = ("degrade", "leave")


def _validate_store(st: StoreSettings) -> None:
    if st.backend not in STORE_BACKENDS:
        raise ConfigError(f"store.backend must be one of {', '.join(STORE_BACKENDS)}")
    if st.readiness not in STORE_READINESS:
        raise ConfigError(f"store.readiness must be one of {', '.join(STORE_READINESS)}")
    if st.backend != "redis":
        return
    if not st.redis_url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError("store.redis_url must start with redis://, rediss:// or unix://")
    if st.redis_timeout <= 0:
        raise ConfigError("store.redis_timeout must be more than 0")
    if importlib.util.find_spec("redis") is None:
        raise ConfigError(
            "store.backend = redis needs the redis package: pip install 'wsmode[redis]'"
        )
