"""The real llama.cpp upstream (../shared/upstreams) for the tests marked `llamacpp`: installed
into `.upstreams/llamacpp` (gitignored, or LLAMACPP_UPSTREAM_DIR) when missing, started on a
free loopback port. Without ../shared the tests skip, unless REQUIRE_LLAMACPP_UPSTREAM is set
(CI sets it), when they fail. The `llamacpp` fixture (conftest.py) runs it once per session;
`llamacpp_pair` adds a second server beside it (two replicas, for the affinity test), also
once per session. Each server logs to its own files under the cache directory.

`llamacpp_tiny_vocab` serves a second model: random weights (gibberish out, fast prefill, no
sliding-window attention, so llama.cpp reuses its whole prompt cache) carrying Gemma 3's real
tokenizer and the `turns-with-tools.jinja` template, built once from the Gemma model into
`models/tiny-vocab.gguf` by ../shared/upstreams/make_tiny_vocab_gguf.py (which needs `gguf`
and `numpy`, installed into the cached venv from PyPI when missing).
`llamacpp_tiny_vocab_slots` serves it again with SLOTS slots (`--parallel`), each with its
own prompt cache, for the tests that pin conversations to slots (`upstream.llamacpp_slots`).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from tests.support.chat_streams import ROOT, SHARED_UPSTREAMS
from tests.support.helpers import until_sync

CACHE = Path(os.environ.get("LLAMACPP_UPSTREAM_DIR", ROOT / ".upstreams")) / "llamacpp"
MODEL = CACHE / "models" / "gemma-3-270m-q4_k_m.gguf"
PYTHON = CACHE / "venv" / "bin" / "python"
TINY_VOCAB_MODEL = CACHE / "models" / "tiny-vocab.gguf"
TEMPLATE_FILE = SHARED_UPSTREAMS / "turns-with-tools.jinja"
START_TIMEOUT = 180.0  # seconds to install (first run only) is separate; this bounds the start
TURN_TIMEOUT = 120.0  # one turn on a 2-core machine, prompt processing included
SLOTS = 2  # `--parallel` of `llamacpp_tiny_vocab_slots`


def _installed() -> bool:
    if not (MODEL.is_file() and MODEL.stat().st_size > 0 and PYTHON.exists()):
        return False
    check = subprocess.run([PYTHON, "-c", "import xllamacpp"], capture_output=True, timeout=60)
    return check.returncode == 0


def _install() -> None:
    """Set the server and model up under CACHE when missing (skip or fail without ../shared)."""
    if not (SHARED_UPSTREAMS / "setup_llamacpp_upstream.sh").exists():
        message = f"{SHARED_UPSTREAMS} is missing: the real llama.cpp upstream cannot be set up"
        if os.environ.get("REQUIRE_LLAMACPP_UPSTREAM"):
            pytest.fail(message)
        pytest.skip(message)
    if not _installed():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["bash", str(SHARED_UPSTREAMS / "setup_llamacpp_upstream.sh"), str(CACHE)],
            check=True,
            timeout=900,
        )


def build_tiny_vocab_model() -> Path:
    """The random-weight model with Gemma 3's tokenizer, built into the cache when missing
    (once: about a second, plus `pip install gguf numpy` into the cached venv the first time).
    Written under a temporary name and renamed, so an interrupted build leaves no half file."""
    _install()
    if TINY_VOCAB_MODEL.is_file() and TINY_VOCAB_MODEL.stat().st_size > 0:
        return TINY_VOCAB_MODEL
    has = subprocess.run([PYTHON, "-c", "import gguf, numpy"], capture_output=True, timeout=60)
    if has.returncode != 0:
        subprocess.run(
            [PYTHON, "-m", "pip", "install", "--quiet", "gguf", "numpy"], check=True, timeout=600
        )
    partial = TINY_VOCAB_MODEL.with_name(TINY_VOCAB_MODEL.name + ".partial")
    script = SHARED_UPSTREAMS / "make_tiny_vocab_gguf.py"
    subprocess.run(
        [PYTHON, str(script), "--vocab-from", str(MODEL), str(partial)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    partial.replace(TINY_VOCAB_MODEL)
    return TINY_VOCAB_MODEL


def serve_llamacpp(
    name: str = "server",
    *,
    model: Path = MODEL,
    alias: str = "gemma-3-270m",
    ctx: int = 4096,
    parallel: int = 1,
    template_file: Path | None = TEMPLATE_FILE,
) -> Iterator[str]:
    """The base URL (…/v1) of a running llama.cpp server on a free port; `name` names its
    log files (`NAME.out`, `NAME.log`), so that several can run at once. `model` is a GGUF
    under the cache (the Gemma model by default), `ctx` the total context split across the
    `parallel` slots; `template_file` None uses the template the GGUF carries."""
    _install()
    flags: dict[str, object] = {
        "--model": model,
        "--port": 0,  # the server prints the port it got
        "--alias": alias,
        "--parallel": parallel,
        "--ctx": ctx,
        "--n-predict": 128,
        "--seed": 1,
    }
    if template_file is not None:
        flags["--chat-template-file"] = template_file
    argv = [str(PYTHON), str(SHARED_UPSTREAMS / "xlc_serve.py")]
    argv += [str(x) for pair in flags.items() for x in pair]
    # stdout carries only the LISTENING line; llama.cpp logs to stderr. On one shared file the
    # two interleave and the line can be split mid-way, so they go to separate files.
    out_path, log_path = CACHE / f"{name}.out", CACHE / f"{name}.log"
    with open(out_path, "wb") as out, open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=out, stderr=log)

    def did_not_start() -> NoReturn:
        tail = log_path.read_text(errors="replace")[-2000:]
        pytest.fail(f"llama.cpp server did not start:\n{tail}")

    def listening() -> str | None:
        urls = [
            line.split()[1].rstrip("/")
            for line in out_path.read_text(errors="replace").splitlines()
            if line.startswith("LISTENING ")
        ]
        if not urls and proc.poll() is not None:
            did_not_start()
        return urls[-1] if urls else None

    try:
        try:
            url = until_sync(listening, START_TIMEOUT, every=0.1)
        except AssertionError:
            did_not_start()
        yield f"{url}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)
