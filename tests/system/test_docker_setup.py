"""The Docker image's configuration, checked without Docker: the Dockerfile's own ENV lines
and HEALTHCHECK command, its base file, and docs/deployment.md's production example, as the image
would use them. (No image is built: the machine that runs the suite need not have Docker.)"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from wsmode.config import load_settings

from tests.support.helpers import free_port, running, seconds, until, wait_healthy

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _image_env() -> dict[str, str]:
    """The WSMODE_* variables the Dockerfile's ENV lines set, with the image's paths mapped
    to this checkout (docker/base.toml is copied to /etc/wsmode/base.toml)."""
    text = DOCKERFILE.replace("\\\n", " ")
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            for pair in shlex.split(line.removeprefix("ENV ")):
                name, _, value = pair.partition("=")
                if name.startswith("WSMODE_"):
                    env[name] = value
    assert env["WSMODE_BASE_CONFIG"] == "/etc/wsmode/base.toml"
    assert "COPY docker/base.toml /etc/wsmode/base.toml" in DOCKERFILE
    env["WSMODE_BASE_CONFIG"] = str(ROOT / "docker" / "base.toml")
    return env


def test_the_image_defaults_give_way_to_a_mounted_file(tmp_path: Path) -> None:
    env = _image_env()
    alone = load_settings(None, env, {})
    assert (alone.server.host, alone.server.port, alone.server.log_format) == (
        "0.0.0.0",
        8080,
        "json",
    )
    mounted = tmp_path / "wsmode.toml"
    mounted.write_text('[server]\nhost = "127.0.0.1"\nport = 9000\nlog_format = "text"\n')
    mine = load_settings(str(mounted), {**env, "WSMODE_CONFIG": str(mounted)}, {})
    assert (mine.server.host, mine.server.port, mine.server.log_format) == (
        "127.0.0.1",
        9000,
        "text",
    )
    # and a flag still wins over the file
    flagged = load_settings(str(mounted), env, {"server.port": 9100})
    assert flagged.server.port == 9100


def _healthcheck(listen_file: Path) -> subprocess.CompletedProcess[str]:
    """The Dockerfile's HEALTHCHECK command, run here (its script from this checkout)."""
    match = re.search(r"HEALTHCHECK[^\n]*\\\n\s*CMD (\[.*\])", DOCKERFILE)
    assert match, "the Dockerfile has a HEALTHCHECK ... CMD [exec form]"
    cmd = json.loads(match.group(1))
    assert cmd[:2] == ["python", "/usr/local/bin/wsmode-healthcheck"]
    assert "COPY docker/healthcheck.py /usr/local/bin/wsmode-healthcheck" in DOCKERFILE
    args = [sys.executable, str(ROOT / "docker" / "healthcheck.py"), str(listen_file)]
    return subprocess.run(args, capture_output=True, text=True, timeout=seconds(30))


async def test_the_health_check_follows_the_port_flag(tmp_path: Path) -> None:
    """`docker run wsmode --port 9000` (any port): the health check still finds the server,
    through the URL it wrote once it listened; before that, and after it stopped, it fails."""
    listen = tmp_path / "wsmode.listen"
    port = free_port()
    env = {
        **_image_env(),
        "WSMODE_SERVER_LISTEN_FILE": str(listen),  # not the image's /tmp path
        "WSMODE_HOST": "127.0.0.1",  # loopback only, in a test
        "WSMODE_SIM_TTFT_MS": "0",
    }
    assert _healthcheck(listen).returncode == 1  # nothing written yet
    with running(["serve", "--port", str(port)], env) as proc:
        await wait_healthy(f"http://127.0.0.1:{port}")
        await until(listen.exists, message="the listen file was never written")
        assert listen.read_text().strip() == f"http://127.0.0.1:{port}/v1"
        check = await asyncio.to_thread(_healthcheck, listen)
        assert check.returncode == 0, check.stderr
        proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(proc.communicate, timeout=seconds(20))
    gone = await asyncio.to_thread(_healthcheck, listen)
    assert gone.returncode == 1 and "unhealthy" in gone.stderr


def _production_example() -> str:
    doc = (ROOT / "docs" / "deployment.md").read_text()
    section = doc[doc.index("## Docker\n") :]
    return next(b for b in re.findall(r"```sh\n(.*?)```", section, re.S) if "docker run -d" in b)


def test_the_readme_production_example_fits_its_memory_limit() -> None:
    example = _production_example()
    words = shlex.split(example.replace("\\\n", " "), comments=True)
    env = dict(words[i + 1].partition("=")[::2] for i, w in enumerate(words[:-1]) if w == "-e")
    memory = words[words.index("--memory") + 1]
    assert memory.endswith("g")
    limit = int(memory[:-1]) * 1024**3
    # what the example sets must load (the key as `openssl rand -base64 32` writes it)
    env["WSMODE_COMPACTION_KEY"] = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
    for name in ("WSMODE_AUTH_API_KEY_HASHES_FILE", "WSMODE_UPSTREAM_API_KEY"):
        env.pop(name)
    settings = load_settings(None, env, {})
    assert "WSMODE_COMPACTION_KEY" in example  # compaction survives a restart
    budget = settings.limits.process_max_bytes
    assert budget <= limit // 2  # the interpreter, sockets and TLS need the rest
    assert settings.cache.process_max_bytes + settings.store.max_bytes < budget


async def test_every_metric_the_example_config_names_exists(tmp_path: Path) -> None:
    text = (ROOT / "config" / "wsmode.example.toml").read_text()
    named = set(re.findall(r"\bwsmode_[a-z_]+", text))
    assert named, "the example config names some metrics"
    port = free_port()
    with running(["serve", "--port", str(port)], {"WSMODE_SIM_TTFT_MS": "0"}):
        await wait_healthy(f"http://127.0.0.1:{port}")
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{port}/metrics") as r,
        ):
            exposed = await r.text()
    families = {f.name for f in text_string_to_metric_families(exposed)}
    suffixes = ("", "_total", "_bucket", "_count", "_sum", "_created")
    known = {f + s for f in families for s in suffixes}
    assert named <= known, f"not exposed: {sorted(named - known)}"
