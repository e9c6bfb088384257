"""Real llama.cpp for the "tokens" scenario (`wsmode bench tokens --llamacpp-model PATH`):
llama.cpp's own server, embedded by ../shared/upstreams/xlc_serve.py, run with the
interpreter of the cached upstream venv (`.upstreams/llamacpp/venv`, or under
`LLAMACPP_UPSTREAM_DIR`, as tests/support/llamacpp_server.py installs it), one slot, the
context the scenario asks for, and the `turns-with-tools.jinja` chat template the sim also
serves. Loopback only, on a port of ours."""

from __future__ import annotations

import os
from pathlib import Path

from .procs import BenchError, Server, Servers, free_port

ROOT = Path(__file__).resolve().parents[2]  # the checkout: proxy/bench/ is two levels down
SHARED = ROOT.parent / "shared" / "upstreams"
CACHE = Path(os.environ.get("LLAMACPP_UPSTREAM_DIR", ROOT / ".upstreams")) / "llamacpp"


def _python() -> Path:
    python = CACHE / "venv" / "bin" / "python"
    if not python.exists():
        raise BenchError(
            f"{python} is missing: set the llama.cpp upstream up first "
            f"(bash {SHARED / 'setup_llamacpp_upstream.sh'} {CACHE})"
        )
    return python


async def start_llamacpp(servers: Servers, model: Path, context: int, name: str) -> Server:
    """A llama.cpp server with `model` and a `context`-token slot, listening on loopback."""
    if not model.is_file():
        raise BenchError(f"--llamacpp-model {model}: no such file")
    script = SHARED / "xlc_serve.py"
    if not script.is_file():
        raise BenchError(f"{script} is missing: the llama.cpp upstream cannot be started")
    port = free_port()
    cmd = [str(_python()), str(script), "--model", str(model), "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--alias", "tiny", "--parallel", "1", "--ctx", str(context)]
    cmd += ["--n-predict", "128", "--seed", "1"]
    cmd += ["--chat-template-file", str(SHARED / "turns-with-tools.jinja")]
    return await servers.start(name, cmd, "127.0.0.1", port)
