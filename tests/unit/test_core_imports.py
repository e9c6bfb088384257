"""proxy/core/ stays sans-I/O: no event loop, network, metrics, CLI or clock imports, and no
logging configuration (modules may log through `logging.getLogger`, as the DEBUG notes of the
Chat translation do; handlers, levels and formats belong to the command line).

The scan reads the source with `ast` (nothing is imported), so it also covers imports inside
functions, `if TYPE_CHECKING:` blocks and `__import__`/`importlib.import_module` calls with a
literal name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "proxy" / "core"
FORBIDDEN = frozenset(
    {
        "asyncio",
        "aiohttp",
        "websockets",
        "prometheus_client",
        "click",
        "time",
        "socket",
    }
)


LOGGING_CONFIG = frozenset({"basicConfig", "addHandler", "setLevel", "dictConfig", "fileConfig"})


def logging_config_calls(source: str) -> list[str]:
    """`lineno: name` for every call that configures logging."""
    return [
        f"{node.lineno}: {node.func.attr}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in LOGGING_CONFIG
    ]


def forbidden_imports(source: str) -> list[str]:
    """`lineno: module` for every forbidden import in `source`."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (
                (isinstance(node.func, ast.Name) and node.func.id == "__import__")
                or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
            )
        ):
            names = [node.args[0].value]
        for name in names:
            if name.split(".")[0] in FORBIDDEN:
                found.append(f"{node.lineno}: {name}")
    return found


CORE_FILES = sorted(CORE.rglob("*.py"))


def test_core_files_are_found() -> None:
    names = {p.relative_to(CORE).as_posix() for p in CORE_FILES}
    expected = {"sse.py", "conversation.py", "request.py", "session.py", "dialects/responses.py"}
    assert expected <= names


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: p.relative_to(CORE).as_posix())
def test_core_module_has_no_io_imports(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    assert forbidden_imports(source) == []
    assert logging_config_calls(source) == []


def test_scanner_catches_logging_configuration() -> None:
    assert len(logging_config_calls("import logging\nlogging.basicConfig(level=10)")) == 1
    assert logging_config_calls("log = logging.getLogger(__name__)\nlog.debug('x')") == []


@pytest.mark.parametrize(
    "source",
    [
        "import asyncio",
        "import os, socket",
        "import aiohttp.web",
        "from websockets.asyncio.client import connect",
        "from prometheus_client import Counter",
        "import click as c",
        "def f():\n    import time",
        "from time import monotonic",
        "if TYPE_CHECKING:\n    import aiohttp",
        "__import__('time')",
        "importlib.import_module('socket')",
    ],
)
def test_scanner_catches_forbidden_imports(source: str) -> None:
    assert len(forbidden_imports(source)) == 1


@pytest.mark.parametrize(
    "source",
    [
        "import secrets",
        "from wsmode.core import wire",
        "from . import time",  # a sibling module that happens to share the name
        "import timeit",
        "import socketserver_like",
        "x = 'import asyncio'",
    ],
)
def test_scanner_allows_other_imports(source: str) -> None:
    assert forbidden_imports(source) == []
