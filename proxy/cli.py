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


# ---- wsmode bench (issue 6) ----


@main.command()
@click.argument(
    "scenarios",
    nargs=-1,
    type=click.Choice(["agent-loop", "overhead", "relay", "scale"]),
)
@click.option("--quick", is_flag=True, help="A smaller run, within a minute.")
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
def bench(
    scenarios: tuple[str, ...],
    quick: bool,
    smoke: bool,
    link: str,
    relay_loop: str,
    json_path: str,
    png_path: str,
) -> None:
    """Benchmarks: agent-loop, overhead, relay, scale (all when none is named)."""
    import asyncio
    from pathlib import Path

    from proxy.bench.procs import BenchError
    from proxy.bench.runner import PLANS, SCENARIOS, run

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
            )
        )
    except BenchError as exc:
        raise click.ClickException(str(exc)) from exc


# ---- end of wsmode bench ----


if __name__ == "__main__":
    sys.exit(main())
