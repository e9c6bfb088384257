"""The `wsmode` command. A thin skin over `load_settings` and the app factories."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from . import __version__
from .config import ConfigError, Settings, load_settings
from .core.urls import redact_url

_F = TypeVar("_F", bound=Callable[..., Any])


def _settings(config: str | None, overrides: dict[str, Any]) -> Settings:
    try:
        return load_settings(config, os.environ, overrides)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc


def _config_option(help: str) -> Callable[[_F], _F]:
    """`--config FILE`, also `WSMODE_CONFIG`: the same option on every command."""
    path = click.Path(exists=True, dir_okay=False)
    text = f"{help} [WSMODE_CONFIG]"
    return click.option("--config", "config", envvar="WSMODE_CONFIG", type=path, help=text)


# Every key of the config file is also a flag: --set section.key=value (repeatable).
SET_OPTION = click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="SECTION.KEY=VALUE",
    help="Any setting of config/wsmode.example.toml, e.g. --set server.max_connections=100 "
    "(lists: comma-separated). Wins over the file and the environment.",
)


def _parse_sets(sets: tuple[str, ...]) -> dict[str, Any]:
    import dataclasses

    sections = {f.name: f.type for f in dataclasses.fields(Settings)}
    out: dict[str, Any] = {}
    for item in sets:
        dotted, eq, value = item.partition("=")
        section, dot, key = dotted.strip().partition(".")
        if not eq or not dot or not key:
            raise click.UsageError(f"--set expects SECTION.KEY=VALUE, got {item!r}")
        if section not in sections:
            raise click.UsageError(f"unknown config section [{section}] in --set {item!r}")
        out[f"{section}.{key}"] = value
    return out


@click.group()
@click.version_option(__version__, prog_name="wsmode")
def main() -> None:
    """Give any stateless HTTP model API the Responses API's WebSocket mode."""


@main.command()
@click.option("--host", help="Address to listen on (default 127.0.0.1). [WSMODE_HOST]")
@click.option("--port", type=int, help="Port to listen on (default 8080). [WSMODE_PORT]")
@click.option(
    "--upstream",
    multiple=True,
    help="Base URL of the model server, e.g. http://127.0.0.1:8081/v1; repeat it for "
    "several replicas (docs/pool.md). Without it the built-in simulated model is fronted. "
    "[WSMODE_UPSTREAM, WSMODE_UPSTREAM_URLS]",
)
@_config_option("TOML config file (see config/wsmode.example.toml).")
@click.option("--log-level", help="DEBUG, INFO, WARNING or ERROR. [WSMODE_SERVER_LOG_LEVEL]")
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    help="Log lines as text or JSON. [WSMODE_SERVER_LOG_FORMAT]",
)
@SET_OPTION
def serve(
    host: str | None,
    port: int | None,
    upstream: tuple[str, ...],
    config: str | None,
    log_level: str | None,
    log_format: str | None,
    sets: tuple[str, ...],
) -> None:
    """Serve WebSocket mode on /v1/responses in front of a stateless upstream.

    On SIGTERM it drains: see server.drain_grace_seconds."""

    from .logs import configure
    from .serve import run as run_server

    settings = _settings(
        config,
        {
            "server.host": host,
            "server.port": port,
            # one flag: upstream.url; several: upstream.urls. Either replaces both keys
            "upstream.url": (upstream[0] if len(upstream) == 1 else "") if upstream else None,
            "upstream.urls": (upstream if len(upstream) > 1 else ()) if upstream else None,
            "server.log_level": log_level,
            "server.log_format": log_format,
            **_parse_sets(sets),
        },
    )
    configure(
        settings.server.log_level,
        settings.server.log_format,
        settings.server.log_repeat_limit,
    )
    _check_runtime(settings)
    sys.exit(_listening(lambda: run_server(settings, version=__version__)))


def _listening(run: Callable[[], int | None]) -> int:
    """Run a server; a socket it cannot listen on (the port in use) is one line, exit 1."""
    from .serve import ListenError

    try:
        return run() or 0
    except ListenError as exc:
        raise click.ClickException(str(exc)) from None


def _check_runtime(settings: Settings) -> None:
    """What load_settings cannot check alone: files the settings point at."""
    from .ops.auth import Authenticator

    try:
        Authenticator.from_settings(settings.auth)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc


@main.command("check-config")
@_config_option("TOML config file to check.")
@SET_OPTION
def check_config(config: str | None, sets: tuple[str, ...]) -> None:
    """Validate the configuration (file + WSMODE_* variables) and print the effective
    settings as TOML, secrets redacted. Exits 2 on an invalid configuration."""
    from .config_view import redacted
    from .ops.auth import Authenticator

    settings = _settings(config, _parse_sets(sets))
    _check_runtime(settings)
    auth = Authenticator.from_settings(settings.auth)
    click.echo(f"# wsmode {__version__}: configuration OK", err=True)
    if auth is not None:
        click.echo(f"# proxy auth on: {len(auth)} accepted key(s)", err=True)
    click.echo(_toml(redacted(settings)), nl=False)


def _toml(doc: dict[str, dict[str, Any]]) -> str:
    import json

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(v)

    out: list[str] = []
    for section, table in doc.items():
        out.append(f"[{section}]")
        out += [f"{k} = {value(v)}" for k, v in table.items()]
        out.append("")
    return "\n".join(out)


@main.command()
@click.option(
    "--upstream",
    help="Base URL of the remote WebSocket-mode server, e.g. https://api.openai.com/v1. "
    "Required. [WSMODE_SIDECAR_UPSTREAM]",
)
@click.option("--host", help="Address to listen on (default 127.0.0.1). [WSMODE_SIDECAR_HOST]")
@click.option("--port", type=int, help="Port to listen on (default 8090). [WSMODE_SIDECAR_PORT]")
@_config_option("TOML config file, section [sidecar] (see config/wsmode.example.toml).")
@click.option("--log-level", help="DEBUG, INFO, WARNING or ERROR. [WSMODE_SERVER_LOG_LEVEL]")
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    help="Log lines as text or JSON. [WSMODE_SERVER_LOG_FORMAT]",
)
@SET_OPTION
def sidecar(
    upstream: str | None,
    host: str | None,
    port: int | None,
    config: str | None,
    log_level: str | None,
    log_format: str | None,
    sets: tuple[str, ...],
) -> None:
    """Take plain HTTP on localhost; send /v1/responses to a WebSocket-mode server.

    Proxy auth ([auth]), /metrics (server.metrics), TLS (server.tls_cert_file) and the
    log settings of [server] apply to the sidecar too."""
    import asyncio

    from .logs import configure
    from .serve import client_host, run_site, tls_context
    from .sidecar.app import create_sidecar_app

    settings = _settings(
        config,
        {
            "sidecar.upstream": upstream,
            "sidecar.host": host,
            "sidecar.port": port,
            "server.log_level": log_level,
            "server.log_format": log_format,
            **_parse_sets(sets),
        },
    )
    sc = settings.sidecar
    if not sc.upstream:
        raise click.UsageError(
            "the sidecar needs --upstream (the remote server's base URL, e.g. "
            "https://api.openai.com/v1)"
        )
    _check_runtime(settings)
    configure(
        settings.server.log_level,
        settings.server.log_format,
        settings.server.log_repeat_limit,
    )
    scheme = "https" if settings.server.tls_cert_file else "http"

    def announce() -> None:
        logging.getLogger("wsmode").info(
            "wsmode %s sidecar on %s://%s:%d/v1 (clients use this as their base URL), "
            "WebSocket mode to %s",
            __version__,
            scheme,
            client_host(sc.host),
            sc.port,
            redact_url(sc.upstream),
        )

    def run() -> None:
        app = create_sidecar_app(settings)
        ctx = tls_context(settings.server)
        timeout = settings.server.header_timeout
        asyncio.run(
            run_site(app, sc.host, sc.port, announce, ssl_context=ctx, header_timeout=timeout)
        )

    sys.exit(_listening(run))


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8081, show_default=True)
@click.option("--config", "config", envvar="WSMODE_CONFIG", type=click.Path(exists=True))
@click.option("--ttft-ms", type=float, help="Time to first token in ms.")
@click.option("--tokens-per-second", type=float, help="Output rate; 0 is as fast as possible.")
@click.option("--output-tokens", type=int, help="Text tokens per answer.")
@click.option("--seed", type=int, help="Seed for deterministic output.")
def sim(
    host: str,
    port: int,
    config: str | None,
    ttft_ms: float | None,
    tokens_per_second: float | None,
    output_tokens: int | None,
    seed: int | None,
) -> None:
    """Run the simulated model server (stateless POST /v1/responses)."""
    from .logs import configure
    from .sim.app import create_sim_app

    settings = _settings(
        config,
        {
            "sim.ttft_ms": ttft_ms,
            "sim.tokens_per_second": tokens_per_second,
            "sim.output_tokens": output_tokens,
            "sim.seed": seed,
        },
    )
    configure(settings.server.log_level)

    def run() -> None:
        import asyncio

        from .serve import client_host, run_site

        def announce() -> None:
            click.echo(f"simulated model on http://{client_host(host)}:{port}/v1", err=True)

        asyncio.run(run_site(create_sim_app(settings.sim), host, port, announce))

    sys.exit(_listening(run))


@main.command()
@click.option("--connections", type=int, default=8, show_default=True, help="Conversations.")
@click.option("--turns", type=int, default=10, show_default=True, help="Turns each.")
@click.option("--duration", type=float, default=60.0, show_default=True, help="Seconds, at most.")
@click.option(
    "--fault-rate",
    type=float,
    default=0.1,
    show_default=True,
    help="Share of turns whose upstream stream is cut mid-event.",
)
@click.option(
    "--upstream-kills",
    type=int,
    default=1,
    show_default=True,
    help="Times the upstream process is killed (SIGKILL) and restarted.",
)
@click.option(
    "--rss-tolerance-mb",
    type=float,
    default=16.0,
    show_default=True,
    help="Allowed growth of the proxy's resident memory over its warm baseline.",
)
@click.option("--seed", type=int, default=1, show_default=True)
def soak(
    connections: int,
    turns: int,
    duration: float,
    fault_rate: float,
    upstream_kills: int,
    rss_tolerance_mb: float,
    seed: int,
) -> None:
    """Soak a real proxy process on loopback with injected faults; exit 1 on any failure.

    The last line is `N passed, N failed`."""
    import asyncio

    from .bench.soak import SoakConfig, run

    cfg = SoakConfig(
        connections, turns, duration, fault_rate, upstream_kills, seed, rss_tolerance_mb
    )
    passed, failed, lines = asyncio.run(run(cfg))
    for line in lines:
        click.echo(line)
    click.echo(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


# ---- wsmode bench: the benchmarks and their targets (proxy/bench/) ----


@main.command()
@click.argument(
    "scenarios",
    nargs=-1,
    type=click.Choice(
        ["agent-loop", "overhead", "relay", "scale", "fairness", "affinity", "tokens", "tracing"]
    ),
)
@click.option("--quick", is_flag=True, help="Every target, with a shorter profile.")
@click.option("--smoke", is_flag=True, hidden=True, help="The tiniest run (for the tests).")
@click.option(
    "--link",
    type=click.Choice(["auto", "netem", "shim"]),
    default="auto",
    show_default=True,
    help="WAN emulation for agent-loop: tc netem in a namespace, or the built-in shim.",
)
@click.option(
    "--loop",
    "relay_loop",
    type=click.Choice(["asyncio", "uvloop"]),
    default="asyncio",
    show_default=True,
    help="Event loop of the wsmode process in the relay scenario (uvloop must be installed).",
)
@click.option("--json", "json_path", default="bench.json", show_default=True, help="JSON report.")
@click.option("--png", "png_path", default="bench.png", show_default=True, help="PNG chart.")
@click.option(
    "--llamacpp-model",
    type=click.Path(exists=True, dir_okay=False),
    help="tokens: run against real llama.cpp with this GGUF instead of the sim.",
)
def bench(
    scenarios: tuple[str, ...],
    quick: bool,
    smoke: bool,
    link: str,
    relay_loop: str,
    json_path: str,
    png_path: str,
    llamacpp_model: str | None,
) -> None:
    """Benchmarks: agent-loop, overhead, relay, scale, fairness, affinity, tokens, tracing (all
    when none is named)."""
    import asyncio
    from pathlib import Path

    from .bench.procs import BenchError
    from .bench.runner import PLANS, SCENARIOS, run

    plan = PLANS["smoke" if smoke else "quick" if quick else "full"]
    try:
        asyncio.run(
            run(
                list(scenarios or SCENARIOS),
                plan,
                link=link,
                relay_loop=relay_loop,
                json_path=Path(json_path) if json_path else None,
                png_path=Path(png_path) if png_path else None,
                llamacpp_model=Path(llamacpp_model) if llamacpp_model else None,
            )
        )
    except BenchError as exc:
        raise click.ClickException(str(exc)) from exc


# ---- end of wsmode bench ----


if __name__ == "__main__":
    sys.exit(main())
