"""The `wsmode` command. A thin skin over `load_settings` and the app factories."""

from __future__ import annotations

import os
import sys
from typing import Any

import click
from aiohttp import web

from proxy import __version__
from proxy.config import ConfigError, Settings, load_settings


def _settings(config: str | None, overrides: dict[str, Any]) -> Settings:
    try:
        return load_settings(config, os.environ, overrides)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc


@click.group()
@click.version_option(__version__, prog_name="wsmode")
def main() -> None:
    """Give any stateless HTTP model API the Responses API's WebSocket mode."""


@main.command()
@click.option("--host", help="Address to listen on (default 127.0.0.1). [WSMODE_HOST]")
@click.option("--port", type=int, help="Port to listen on (default 8080). [WSMODE_PORT]")
@click.option(
    "--upstream",
    help="Base URL of the model server, e.g. http://127.0.0.1:8081/v1. Without it the "
    "built-in simulated model is fronted. [WSMODE_UPSTREAM]",
)
@click.option(
    "--config",
    "config",
    envvar="WSMODE_CONFIG",
    type=click.Path(exists=True, dir_okay=False),
    help="TOML config file (see config/wsmode.example.toml). [WSMODE_CONFIG]",
)
@click.option("--log-level", help="DEBUG, INFO, WARNING or ERROR. [WSMODE_SERVER_LOG_LEVEL]")
def serve(
    host: str | None,
    port: int | None,
    upstream: str | None,
    config: str | None,
    log_level: str | None,
) -> None:
    """Serve WebSocket mode on /v1/responses in front of a stateless upstream."""
    from proxy.app import create_app
    from proxy.logs import configure

    settings = _settings(
        config,
        {
            "server.host": host,
            "server.port": port,
            "upstream.url": upstream,
            "server.log_level": log_level,
        },
    )
    configure(settings.server.log_level)
    click.echo(
        f"wsmode {__version__} listening on ws://{settings.server.host}:{settings.server.port}"
        f"/v1/responses (clients use base URL http://{settings.server.host}:"
        f"{settings.server.port}/v1)",
        err=True,
    )
    web.run_app(
        create_app(settings),
        host=settings.server.host,
        port=settings.server.port,
        print=None,
        access_log=None,
    )


@main.command()
@click.option(
    "--upstream",
    help="Base URL of the remote WebSocket-mode server, e.g. https://api.openai.com/v1. "
    "Required. [WSMODE_SIDECAR_UPSTREAM]",
)
@click.option("--host", help="Address to listen on (default 127.0.0.1). [WSMODE_SIDECAR_HOST]")
@click.option("--port", type=int, help="Port to listen on (default 8090). [WSMODE_SIDECAR_PORT]")
@click.option(
    "--config",
    "config",
    envvar="WSMODE_CONFIG",
    type=click.Path(exists=True, dir_okay=False),
    help="TOML config file, section [sidecar] (see config/wsmode.example.toml). [WSMODE_CONFIG]",
)
@click.option("--log-level", help="DEBUG, INFO, WARNING or ERROR. [WSMODE_SERVER_LOG_LEVEL]")
def sidecar(
    upstream: str | None,
    host: str | None,
    port: int | None,
    config: str | None,
    log_level: str | None,
) -> None:
    """Take plain HTTP on localhost; send /v1/responses to a WebSocket-mode server."""
    from proxy.logs import configure
    from proxy.sidecar.app import create_sidecar_app

    settings = _settings(
        config,
        {
            "sidecar.upstream": upstream,
            "sidecar.host": host,
            "sidecar.port": port,
            "server.log_level": log_level,
        },
    )
    sc = settings.sidecar
    if not sc.upstream:
        raise click.UsageError(
            "the sidecar needs --upstream (the remote server's base URL, e.g. "
            "https://api.openai.com/v1)"
        )
    configure(settings.server.log_level)
    click.echo(
        f"wsmode {__version__} sidecar on http://{sc.host}:{sc.port}/v1 (clients use this as "
        f"their base URL), WebSocket mode to {sc.upstream}",
        err=True,
    )
    web.run_app(
        create_sidecar_app(settings),
        host=sc.host,
        port=sc.port,
        print=None,
        access_log=None,
        handler_cancellation=True,
    )


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
    from proxy.logs import configure
    from proxy.sim.app import create_sim_app

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
    click.echo(f"simulated model on http://{host}:{port}/v1", err=True)
    web.run_app(
        create_sim_app(settings.sim),
        host=host,
        port=port,
        print=None,
        access_log=None,
        handler_cancellation=True,
    )


if __name__ == "__main__":
    sys.exit(main())
