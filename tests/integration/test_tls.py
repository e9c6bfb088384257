"""`server.tls_cert_file` / `tls_key_file`: `wsmode serve` and `wsmode sidecar` speak TLS
themselves. A self-signed certificate is made here; real clients (websockets, aiohttp, the
openai SDK's HTTP side) trust only it."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import signal
import ssl
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from websockets.asyncio.client import connect

from tests.support.helpers import create, free_port, running, seconds, send, until, until_terminal


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost: (cert.pem, key.pem)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "wsmode test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder = tmp_path_factory.mktemp("tls")
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def _trusting(cert: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(cert))


def _tls_args(cert: Path, key: Path) -> list[str]:
    return ["--set", f"server.tls_cert_file={cert}", "--set", f"server.tls_key_file={key}"]


async def _healthz(base: str, ctx: ssl.SSLContext) -> dict[str, object]:
    async def get() -> dict[str, object]:
        async with aiohttp.ClientSession() as http, http.get(f"{base}/healthz", ssl=ctx) as r:
            return dict(await r.json())

    return await until(get, ignore=(aiohttp.ClientConnectionError,), message="never healthy")


async def test_serve_speaks_tls(certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    ctx = _trusting(cert)
    port = free_port()
    args = ["serve", "--port", str(port), *_tls_args(cert, key)]
    with running(args, {"WSMODE_SIM_TTFT_MS": "0"}) as proc:
        health = await _healthz(f"https://127.0.0.1:{port}", ctx)
        assert health["status"] == "ok"
        async with connect(f"wss://127.0.0.1:{port}/v1/responses", ssl=ctx) as ws:
            await send(ws, create(input="hi", store=False))
            first = (await until_terminal(ws))[-1]
            assert first["type"] == "response.completed"
            await send(ws, create(input="again", previous_response_id=first["response"]["id"]))
            assert (await until_terminal(ws))[-1]["type"] == "response.completed"
        # plain HTTP to the TLS port is no request at all
        with pytest.raises(aiohttp.ClientError):
            async with (
                aiohttp.ClientSession() as http,
                http.get(f"http://127.0.0.1:{port}/healthz") as r,
            ):
                await r.read()
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.to_thread(proc.communicate, timeout=seconds(20))
    assert proc.returncode == 0, err
    assert f"listening on wss://127.0.0.1:{port}/v1/responses" in err
    assert f"base URL https://127.0.0.1:{port}/v1" in err


async def test_a_silent_tls_client_does_not_hold_up_the_others(
    certificate: tuple[Path, Path],
) -> None:
    """The handshake of each connection runs apart: a client that connects and sends
    nothing does not keep the next one from being served."""
    cert, key = certificate
    ctx = _trusting(cert)
    port = free_port()
    with running(["serve", "--port", str(port), *_tls_args(cert, key)]):
        await _healthz(f"https://127.0.0.1:{port}", ctx)
        _, silent = await asyncio.open_connection("127.0.0.1", port)  # never says hello
        try:
            health = await asyncio.wait_for(_healthz(f"https://127.0.0.1:{port}", ctx), seconds(10))
            assert health["status"] == "ok"
        finally:
            silent.close()


async def test_sidecar_speaks_tls(certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    ctx = _trusting(cert)
    port, remote = free_port(), free_port()
    with (
        running(["serve", "--port", str(remote)], {"WSMODE_SIM_TTFT_MS": "0"}),
        running(
            [
                "sidecar",
                "--upstream",
                f"http://127.0.0.1:{remote}/v1",
                "--port",
                str(port),
                *_tls_args(cert, key),
            ]
        ) as proc,
    ):
        base = f"https://127.0.0.1:{port}"
        assert (await _healthz(base, ctx))["mode"] == "sidecar"
        await _healthz(f"http://127.0.0.1:{remote}", ssl.create_default_context())
        body = {"model": "sim", "input": "hi", "store": False}
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{base}/v1/responses", json=body, ssl=ctx) as r,
        ):
            assert r.status == 200
            assert (await r.json())["status"] == "completed"
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.to_thread(proc.communicate, timeout=seconds(20))
    assert f"sidecar on https://127.0.0.1:{port}/v1" in err


def test_a_key_without_a_certificate_is_a_usage_error(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "wsmode", "serve", "--set", f"server.tls_key_file={tmp_path}/k"],
        capture_output=True,
        text=True,
        timeout=seconds(30),
    )
    assert out.returncode == 2
    assert "server.tls_key_file needs server.tls_cert_file" in out.stderr


def test_an_unreadable_certificate_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    args = ["serve", "--port", str(free_port()), "--set", f"server.tls_cert_file={missing}"]
    out = subprocess.run(
        [sys.executable, "-m", "wsmode", *args],
        capture_output=True,
        text=True,
        timeout=seconds(30),
    )
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert f"Error: cannot load server.tls_cert_file {missing}" in out.stderr
