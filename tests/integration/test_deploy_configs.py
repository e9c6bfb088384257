"""deploy/'s HAProxy, nginx and Caddy configs, checked by the tools themselves (`haproxy -c`,
`nginx -t`, `caddy adapt`), each where it is installed (in CI, where REQUIRE_DEPLOY_BALANCERS
is set, Caddy must be: .ci/run installs it). Nothing is started: what the configs
say against the wsmode configuration they deploy is read in tests/unit/test_deploy.py, and
tests/system/test_deploy_balancers.py runs HAProxy and nginx in front of wsmode."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.deploy_files import CADDYFILE, HAPROXY_CFG, nginx_wrapper
from tests.support.helpers import seconds

# ---------------------------------------------------------------- HAProxy


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed")
def test_haproxy_accepts_the_reference_config() -> None:
    done = subprocess.run(
        ["haproxy", "-c", "-f", str(HAPROXY_CFG)],
        capture_output=True,
        text=True,
        check=False,
        timeout=seconds(30),
    )
    assert done.returncode == 0, done.stdout + done.stderr


# ---------------------------------------------------------------- nginx


@pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is not installed")
def test_nginx_accepts_the_reference_config(tmp_path: Path) -> None:
    done = subprocess.run(
        ["nginx", "-t", "-p", str(tmp_path), "-e", "stderr", "-c", str(nginx_wrapper(tmp_path))],
        capture_output=True,
        text=True,
        check=False,
        timeout=seconds(30),
    )
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------- Caddy


@pytest.mark.skipif(
    shutil.which("caddy") is None and not os.environ.get("REQUIRE_DEPLOY_BALANCERS"),
    reason="caddy is not installed (apt-get install caddy)",
)
def test_caddy_proxies_with_readiness_checks_and_no_buffering() -> None:
    """`caddy adapt` only turns the Caddyfile into Caddy's JSON; it starts nothing (`caddy
    validate` would start the health checks, towards the example addresses)."""
    done = subprocess.run(
        ["caddy", "adapt", "--config", str(CADDYFILE), "--adapter", "caddyfile"],
        capture_output=True,
        text=True,
        check=False,
        timeout=seconds(30),
    )
    assert done.returncode == 0, done.stderr
    (server,) = json.loads(done.stdout)["apps"]["http"]["servers"].values()
    handlers = [h for route in server["routes"] for h in route["handle"]]
    (proxy,) = [h for h in handlers if h["handler"] == "reverse_proxy"]
    assert proxy["health_checks"]["active"]["uri"] == "/readyz"
    assert proxy["health_checks"]["active"]["expect_status"] == 200
    assert proxy["flush_interval"] == -1  # events go out as they come
    assert proxy["load_balancing"]["selection_policy"]["policy"] == "least_conn"
    assert len(proxy["upstreams"]) >= 2
    # no read timeout on the stream: a socket lives as long as wsmode keeps it
    assert "read_timeout" not in proxy["transport"]
    (metrics,) = [r for r in server["routes"] if r.get("match") == [{"path": ["/metrics"]}]]
    assert metrics["handle"] == [{"handler": "static_response", "status_code": 404}]
