"""Rules of the test suite itself, read from the sources with `ast`.

- A test file imports helpers (the modules of tests/support/), never another
  test file nor conftest.py: renaming or deleting a test module breaks nothing else, and
  conftest.py holds only fixtures.
- Waiting uses the scaled time unit: every sleep is `sleep(seconds(...))` (or `sleep(0)`, a
  yield to the event loop), and a loop that sleeps until something holds is `until(...)`.
  tests/support/helpers.py, where `until` lives, is the one exception.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
FILES = sorted(p for p in TESTS.rglob("*.py") if "fixtures" not in p.relative_to(TESTS).parts)
WAITING_LIVES_HERE = TESTS / "support" / "helpers.py"


def imported_test_modules(source: str) -> list[str]:
    """`lineno: module` for every import of a test module or of conftest."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            # `from tests.unit import test_session` imports the module after `import`
            base = "." * node.level + (node.module or "")
            sep = "." if node.module else ""
            names = [base, *(f"{base}{sep}{alias.name}" for alias in node.names)]
        for name in names:
            if not (name.startswith(("tests.", ".")) or name in ("conftest", "tests")):
                continue  # another package's module (`aiohttp.test_utils` is a library's)
            last = name.rsplit(".", 1)[-1]
            if last == "conftest" or last.startswith("test_"):
                found.append(f"{node.lineno}: {name}")
    return found


def _is_sleep(node: ast.AST) -> bool:
    func = node.func if isinstance(node, ast.Call) else None
    return (isinstance(func, ast.Attribute) and func.attr == "sleep") or (
        isinstance(func, ast.Name) and func.id == "sleep"
    )


def unscaled_sleeps(source: str) -> list[str]:
    """`lineno: call` for every sleep whose length is not `seconds(...)` nor 0."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and _is_sleep(node)):
            continue
        arg = node.args[0] if node.args else None
        scaled = (
            isinstance(arg, ast.Call)
            and isinstance(arg.func, ast.Name)
            and arg.func.id == "seconds"
        )
        if not (scaled or (isinstance(arg, ast.Constant) and arg.value == 0)):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def poll_loops(source: str) -> list[int]:
    """Line numbers of loops that sleep and stop once something holds (break or return):
    inline polls, which `until(...)` replaces."""
    found: list[int] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.For | ast.AsyncFor | ast.While):
            continue
        inside = [n for stmt in node.body for n in ast.walk(stmt)]
        sleeps = any(isinstance(n, ast.Call) and _is_sleep(n) for n in inside)
        stops = any(isinstance(n, ast.Break | ast.Return) for n in inside)
        if sleeps and stops:
            found.append(node.lineno)
    return found


def rel(path: Path) -> str:
    return path.relative_to(TESTS).as_posix()


def test_files_are_found() -> None:
    names = {rel(p) for p in FILES}
    assert {
        "conftest.py",
        "support/helpers.py",
        "unit/test_session.py",
        "support/fuzz_harness.py",
    } <= names


@pytest.mark.parametrize("path", FILES, ids=rel)
def test_no_file_imports_a_test_module_or_conftest(path: Path) -> None:
    assert imported_test_modules(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("path", [p for p in FILES if p != WAITING_LIVES_HERE], ids=rel)
def test_waiting_uses_the_scaled_unit(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    assert unscaled_sleeps(source) == []
    assert poll_loops(source) == []


@pytest.mark.parametrize(
    "source",
    [
        "from tests.conftest import seconds",
        "from tests.integration.test_ops import scrape",
        "import tests.unit.test_session",
        "from tests.unit import test_session",
        "from . import conftest",
        "def f():\n    from .test_cli import free_port",
    ],
)
def test_scanner_catches_test_module_imports(source: str) -> None:
    assert len(imported_test_modules(source)) == 1


@pytest.mark.parametrize(
    "source",
    [
        "from tests.support.helpers import seconds, until",
        "from tests.support.session import make_session",
        "import tests.support.chat_streams",
        "from wsmode.core import session",
        "import pytest",
        "from aiohttp.test_utils import TestServer",  # a library's module, not one of ours
    ],
)
def test_scanner_allows_helper_imports(source: str) -> None:
    assert imported_test_modules(source) == []


@pytest.mark.parametrize(
    "source",
    [
        "await asyncio.sleep(0.02)",
        "time.sleep(1)",
        "await sleep(TIMEOUT)",
        "await asyncio.sleep(2 * seconds(0.1))",
    ],
)
def test_scanner_catches_unscaled_sleeps(source: str) -> None:
    assert len(unscaled_sleeps(source)) == 1


@pytest.mark.parametrize(
    "source",
    ["await asyncio.sleep(seconds(0.8))", "await asyncio.sleep(0)", "time.sleep(seconds(1))"],
)
def test_scanner_allows_scaled_sleeps(source: str) -> None:
    assert unscaled_sleeps(source) == []


def test_scanner_catches_poll_loops() -> None:
    poll = (
        "async def f():\n"
        "    for _ in range(100):\n"
        "        if done():\n"
        "            break\n"
        "        await asyncio.sleep(seconds(0.02))\n"
    )
    assert poll_loops(poll) == [2]
    assert poll_loops("while True:\n    if x():\n        return 1\n    time.sleep(0.1)") == [1]
    # a pause between the steps of a scenario is no poll
    steps = "async def f():\n    for i in range(3):\n        await go(i)\n        await sleep(x)\n"
    assert poll_loops(steps) == []
