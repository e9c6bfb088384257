"""proxy/core/ stays sans-I/O: no event loop, network, metrics, CLI or clock imports, and no
logging configuration (modules may log through `logging.getLogger`, as the DEBUG notes of the
Chat translation do; handlers, levels and formats belong to the command line).

The same holds for every module outside core whose docstring says it has no I/O
(`sidecar/relay.py`, `sidecar/chains.py`, ...). And the package's own imports cannot smuggle
I/O in: a core module imports only core modules (`from ..ops import metrics` inside core
would bring aiohttp along), and the other sans-I/O modules only core or each other.

The scan reads the source with `ast` (nothing is imported), so it also covers imports inside
functions, `if TYPE_CHECKING:` blocks and `__import__`/`importlib.import_module` calls with a
literal name.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.support.module_graph import PACKAGE, Module, module_of, package_imports, package_of

CORE = PACKAGE / "core"
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


def core_escapes(source: str, package: Module) -> list[str]:
    """`lineno: module` for every import of a module outside core, from a core module."""
    return [
        f"{line}: {'.'.join(target)}"
        for line, target in package_imports(source, package)
        if target[:1] != ("core",)
    ]


CORE_FILES = sorted(CORE.rglob("*.py"))
NO_IO_CLAIM = re.compile(r"\b(no I/O|sans-I/O|without I/O)\b", re.IGNORECASE)


def claims_no_io(path: Path) -> bool:
    """The module's docstring says it does no I/O. A package's `__init__` is left out: its
    docstring describes the modules inside it."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return path.name != "__init__.py" and bool(NO_IO_CLAIM.search(doc))


NO_IO_FILES = sorted(p for p in PACKAGE.rglob("*.py") if CORE not in p.parents and claims_no_io(p))
SANS_IO = frozenset(module_of(p) for p in NO_IO_FILES)


def test_core_files_are_found() -> None:
    names = {p.relative_to(CORE).as_posix() for p in CORE_FILES}
    expected = {"sse.py", "conversation.py", "request.py", "session.py", "dialects/responses.py"}
    assert expected <= names


def test_modules_that_claim_no_io_are_found() -> None:
    names = {p.relative_to(PACKAGE).as_posix() for p in NO_IO_FILES}
    assert {"sidecar/relay.py", "sidecar/chains.py"} <= names


def rel(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


@pytest.mark.parametrize("path", CORE_FILES + NO_IO_FILES, ids=rel)
def test_sans_io_module_has_no_io_imports(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    assert forbidden_imports(source) == []
    assert logging_config_calls(source) == []


@pytest.mark.parametrize("path", CORE_FILES, ids=rel)
def test_core_module_imports_only_core(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    assert core_escapes(source, package_of(path)) == []


@pytest.mark.parametrize("path", NO_IO_FILES, ids=rel)
def test_other_sans_io_module_imports_only_sans_io_modules(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    outside = [
        f"{line}: {'.'.join(target)}"
        for line, target in package_imports(source, package_of(path))
        if target[:1] != ("core",) and target not in SANS_IO
    ]
    assert outside == []


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


@pytest.mark.parametrize(
    ("source", "package"),
    [
        ("from ..ops import metrics", ("core",)),
        ("from .. import runtime", ("core",)),
        ("from ..upstream.client import UpstreamClient", ("core",)),
        ("from ... import app", ("core", "dialects")),
        ("from ...ops.metrics import Metrics", ("core", "context")),
        ("from .... import x", ("core", "dialects")),  # above the top of the package
        ("def f():\n    from ..sidecar import pool", ("core",)),
        ("if TYPE_CHECKING:\n    from ..runtime import AppState", ("core",)),
        ("import wsmode.ops.metrics", ("core",)),
        ("from wsmode.upstream import runner", ("core",)),
        ("from wsmode import cli", ("core",)),
    ],
)
def test_scanner_catches_imports_leaving_core(source: str, package: Module) -> None:
    assert len(core_escapes(source, package)) == 1


@pytest.mark.parametrize(
    ("source", "package"),
    [
        ("from . import wire", ("core",)),
        ("from .sse import SSEEvent", ("core",)),
        ("from .context.tokens import estimate", ("core",)),
        ("from .. import wire", ("core", "dialects")),
        ("from ..errors import UpstreamError", ("core", "context")),
        ("from .builder import build", ("core", "dialects")),
        ("from wsmode.core import wire", ("core",)),
        ("import wsmode.core.sse", ("core",)),
        ("import os\nfrom typing import Any", ("core",)),
    ],
)
def test_scanner_allows_imports_within_core(source: str, package: Module) -> None:
    assert core_escapes(source, package) == []


def test_scanner_resolves_imports_of_modules_outside_core() -> None:
    """What the sidecar's sans-I/O modules may import: core, and each other."""
    relay = ("sidecar",)
    source = "from ..core import wire\nfrom .chains import Chains\nfrom . import pool\n"
    assert package_imports(source, relay) == [
        (1, ("core",)),
        (2, ("sidecar", "chains")),
        (3, ("sidecar", "pool")),
    ]
    assert ("sidecar", "chains") in SANS_IO and ("sidecar", "pool") not in SANS_IO
