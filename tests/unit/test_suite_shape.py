"""Rules of the test suite itself, read from the sources with `ast`.

- Three tiers, by folder: tests/unit (fast and in-process), tests/integration (real sockets,
  real processes of ours, each test quick) and tests/system (slow or whole-system: the soak,
  the bench, a real browser, packaging, llama.cpp, HAProxy and nginx, Codex). Every test file
  is in one of them; tests/conftest.py marks each test with its tier (`-m unit`, ...), and
  `python -m pytest` runs all three. Helpers are in tests/support/, fixtures in conftest.py.
- tests/unit starts no process and opens no socket: no `subprocess`, `socket` or
  `multiprocessing`, no asyncio subprocess or connection, none of the helpers or fixtures
  that start servers or processes.
- A test file imports helpers (the modules of tests/support/), never another
  test file nor conftest.py: renaming or deleting a test module breaks nothing else, and
  conftest.py holds only fixtures (and the hook that marks the tiers).
- Waiting uses the scaled time unit: every sleep is `sleep(seconds(...))` (or `sleep(0)`, a
  yield to the event loop), and a loop that sleeps until something holds is `until(...)`.
  tests/support/helpers.py, where `until` lives, is the one exception.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
FILES = sorted(p for p in TESTS.rglob("*.py") if "fixtures" not in p.relative_to(TESTS).parts)
WAITING_LIVES_HERE = TESTS / "support" / "helpers.py"
TIERS = ("unit", "integration", "system")
UNIT_FILES = [p for p in FILES if p.relative_to(TESTS).parts[0] == "unit"]

# what starts a process or opens a socket, which tests/unit never does
PROCESS_MODULES = {"subprocess", "multiprocessing", "socket", "socketserver", "pty"}
PROCESS_CALLS = {  # by attribute, whatever the object (asyncio, a loop)
    "create_subprocess_exec",
    "create_subprocess_shell",
    "open_connection",
    "open_unix_connection",
    "start_server",
    "start_unix_server",
    "create_connection",
    "create_server",
}
OS_PROCESS_CALLS = {"system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp"}
# the helpers of tests/support that start servers or processes
PROCESS_HELPERS = {
    "running",
    "sim_processes",
    "SimProcess",
    "serve",
    "free_port",
    "wait_healthy",
    "start_replica",
    "redis_server_process",
    "serve_llamacpp",
    "start_stack",
    "build_tiny_vocab_model",
    "recording_relay",
    "serve_fake",
}
# the fixtures of conftest.py that start servers or processes
PROCESS_FIXTURES = {
    "sim",
    "sim_factory",
    "proxy",
    "proxy_factory",
    "sidecar_factory",
    "llamacpp",
    "llamacpp_pair",
    "llamacpp_tiny_vocab",
    "llamacpp_tiny_vocab_slots",
    "redis_server",
    "redis_session_server",
    "replicas",
    "otlp",
}


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


def processes_and_sockets(source: str) -> list[str]:
    """`lineno: what` for everything in `source` that starts a process or opens a socket."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        what: list[str] = []
        if isinstance(node, ast.Import):
            what = [a.name for a in node.names if a.name.split(".")[0] in PROCESS_MODULES]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module.split(".")[0] in PROCESS_MODULES:
                what = [module]
            elif module.startswith("tests."):
                what = [a.name for a in node.names if a.name in PROCESS_HELPERS]
            elif module == "os":
                what = [a.name for a in node.names if a.name in OS_PROCESS_CALLS]
        elif isinstance(node, ast.Attribute):
            base = node.value
            os_call = isinstance(base, ast.Name) and base.id == "os"
            if node.attr in PROCESS_CALLS or (os_call and node.attr in OS_PROCESS_CALLS):
                what = [ast.unparse(node)]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            what = [a.arg for a in node.args.args if a.arg in PROCESS_FIXTURES]
        found += [f"{node.lineno}: {w}" for w in what]
    return found


def rel(path: Path) -> str:
    return path.relative_to(TESTS).as_posix()


def out_of_place(path: str) -> bool:
    """Whether a file of tests/ (`unit/test_x.py`) is outside the layout: test files in a
    tier, helpers in support/, conftest.py and __init__.py in either."""
    *folders, name = path.split("/")
    if name in ("__init__.py", "conftest.py"):
        return bool(folders) and folders[0] not in (*TIERS, "support")
    if not folders:
        return True  # a module at the top of tests/
    if folders[0] == "support":
        return name.startswith("test_")  # a test among the helpers
    return folders[0] not in TIERS or not name.startswith("test_")


def test_files_are_found() -> None:
    names = {rel(p) for p in FILES}
    assert {
        "conftest.py",
        "support/helpers.py",
        "support/session.py",
        "support/fuzz_harness.py",
        "unit/test_session.py",
        "integration/test_ws_core.py",
        "system/test_soak.py",
    } <= names
    assert "unit/test_suite_shape.py" in {rel(p) for p in UNIT_FILES}


def test_every_file_is_in_a_tier_or_in_support() -> None:
    assert [rel(p) for p in FILES if out_of_place(rel(p))] == []


@pytest.mark.parametrize(
    ("path", "wrong"),
    [
        ("conftest.py", False),
        ("__init__.py", False),
        ("unit/test_session.py", False),
        ("integration/conftest.py", False),
        ("system/test_soak.py", False),
        ("support/helpers.py", False),
        ("support/__init__.py", False),
        ("test_session.py", True),  # at the top, in no tier
        ("helpers.py", True),
        ("fuzz/test_fuzz.py", True),  # a fourth folder
        ("unit/items.py", True),  # a helper beside the tests: it belongs in support/
        ("support/test_helpers.py", True),
    ],
)
def test_the_layout_rule(path: str, wrong: bool) -> None:
    assert out_of_place(path) is wrong


@pytest.mark.parametrize("path", UNIT_FILES, ids=rel)
def test_unit_tests_start_no_process_and_open_no_socket(path: Path) -> None:
    assert processes_and_sockets(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    "source",
    [
        "import subprocess",
        "from subprocess import run",
        "import socket",
        "import multiprocessing.pool",
        "proc = await asyncio.create_subprocess_exec('wsmode')",
        "reader, writer = await asyncio.open_connection('127.0.0.1', 80)",
        "os.system('ls')",
        "from tests.support.helpers import running",
        "from tests.support.redis_server import redis_server_process",
        "async def test_x(proxy: Proxy) -> None:\n    pass",
        "def test_x(tmp_path, llamacpp):\n    pass",
    ],
)
def test_scanner_catches_processes_and_sockets(source: str) -> None:
    assert len(processes_and_sockets(source)) == 1


@pytest.mark.parametrize(
    "source",
    [
        "import asyncio",
        "from tests.support.helpers import proxy_settings, seconds, until",
        "from tests.support.session import make_session",
        "from wsmode.core import session",
        "def test_x(tmp_path, monkeypatch):\n    pass",
        "path = os.path.join('a', 'b')",
        "server = make_session()",  # a name, not a server
    ],
)
def test_scanner_allows_in_process_code(source: str) -> None:
    assert processes_and_sockets(source) == []


def test_pyproject_runs_every_tier_and_knows_their_markers() -> None:
    pyproject = tomllib.loads((TESTS.parent / "pyproject.toml").read_text(encoding="utf-8"))
    ini = pyproject["tool"]["pytest"]["ini_options"]
    assert ini["testpaths"] == [f"tests/{tier}" for tier in TIERS]  # fast tier first
    assert "--strict-markers" in ini["addopts"].split()
    declared = {marker.split(":")[0] for marker in ini["markers"]}
    assert set(TIERS) <= declared
    # every test has a time limit; `thread` ends a hang that a signal would not interrupt
    assert float(ini["timeout"]) > 0 and ini["timeout_method"] == "thread"


def test_this_test_is_marked_with_its_tier(request: pytest.FixtureRequest) -> None:
    marks = {tier for tier in TIERS if request.node.get_closest_marker(tier) is not None}
    assert marks == {"unit"}


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
