"""gpt-oss's vocabulary for the harmony tests, without the internet.

`openai-harmony` reads `o200k_base.tiktoken` from `TIKTOKEN_ENCODINGS_BASE`. The tests take
it from, in order: that variable when it already names a folder holding the file; the cache
folder `.upstreams/harmony` (or `HARMONY_VOCAB_DIR`); else they make it from the npm
registry's `tiktoken` package, whose `encoders/o200k_base.json` carries the same ranks in
its own packed form ("! <first rank> <base64 token> <base64 token> ..."), unpacked here to
tiktoken's "<base64 token> <rank>" lines and checked against the file's published SHA-256.

With `REQUIRE_HARMONY_VOCAB` set (CI) a vocabulary that cannot be had fails the tests;
otherwise they are skipped, saying why.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILE = "o200k_base.tiktoken"
SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
NPM_PACKAGE = "tiktoken@1.0.22"
CACHE = Path(os.environ.get("HARMONY_VOCAB_DIR", ROOT / ".upstreams" / "harmony"))


def _good(folder: Path) -> bool:
    path = folder / FILE
    return path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == SHA256


def _unpack(packed: str) -> bytes:
    fields = packed.split(" ")
    first = int(fields[1])
    return "".join(f"{tok} {first + i}\n" for i, tok in enumerate(fields[2:])).encode()


def _from_npm() -> bytes:
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not installed")
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [npm, "pack", NPM_PACKAGE, "--silent"],
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"npm pack {NPM_PACKAGE}: {done.stderr.strip()[-300:]}")
        tgz = next(Path(tmp).glob("*.tgz"))
        with tarfile.open(tgz) as tar:
            member = tar.extractfile("package/encoders/o200k_base.json")
            assert member is not None
            doc = json.load(io.TextIOWrapper(member, encoding="utf-8"))
    return _unpack(doc["bpe_ranks"])


def vocabulary_folder() -> Path:
    """A folder holding o200k_base.tiktoken (skips or fails the test when there is none)."""
    given = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
    if given and _good(Path(given)):
        return Path(given)
    if _good(CACHE):
        return CACHE
    try:
        data = _from_npm()
        if hashlib.sha256(data).hexdigest() != SHA256:
            raise RuntimeError(f"the unpacked {FILE} does not have its published SHA-256")
    except (RuntimeError, OSError, subprocess.TimeoutExpired, KeyError) as exc:
        if os.environ.get("REQUIRE_HARMONY_VOCAB"):
            pytest.fail(f"gpt-oss's vocabulary could not be had: {exc}")
        pytest.skip(f"gpt-oss's vocabulary could not be had: {exc}")
    CACHE.mkdir(parents=True, exist_ok=True)
    part = CACHE / (FILE + ".part")
    part.write_bytes(data)
    part.replace(CACHE / FILE)
    return CACHE
