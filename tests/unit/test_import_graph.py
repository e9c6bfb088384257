"""The shape of the package's imports, read from the source with `ast` (tests/unit/module_graph.py).

- No import circles: the graph of every module's imports of the package's own modules (at
  the top, inside functions and under `if TYPE_CHECKING:` alike, relative ones resolved) has
  no strongly connected component of more than one module. Two modules that need each other
  are one module split in the wrong place, whether or not Python happens to load them.
- Nothing under proxy/upstream/ or proxy/ops/ imports the session or its helper modules
  (`SESSION_MODULES`): the session drives them, never the other way round.
- No module is longer than `MAX_LINES` lines.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.module_graph import (
    PACKAGE,
    Graph,
    Module,
    circles,
    dotted,
    import_graph,
    module_of,
    package_imports,
    package_of,
    source_files,
    strongly_connected,
)

# The session and its helper modules, by their names below `wsmode` (a package's name covers
# every module inside it).
SESSION_MODULES: tuple[str, ...] = (
    "core.session",
    "core.driver",
    "core.admission",
    "core.plan",
    "core.recorder",
    "core.compacting",
)
# The parts whose modules may not import any of them.
BELOW_THE_SESSION: tuple[Module, ...] = (("upstream",), ("ops",))
MAX_LINES = 500

GRAPH = import_graph()


def describe(component: list[Module], graph: Graph) -> str:
    """`a <-> b: a -> b, b -> a`: the component's modules and the imports between them."""
    members = set(component)
    edges = [
        f"{dotted(m)} -> {dotted(t)}" for m in component for t in sorted(graph[m]) if t in members
    ]
    return " <-> ".join(dotted(m) for m in component) + ": " + ", ".join(edges)


def test_no_import_circles() -> None:
    found = [describe(c, GRAPH) for c in circles(GRAPH)]
    assert not found, "modules that import each other:\n" + "\n".join(found)


def session_imports(path: Path, modules: frozenset[Module]) -> list[str]:
    """`file:line: module` for each import of a session module in the module at `path`."""
    inside = tuple(f"{m}." for m in SESSION_MODULES)  # the modules of a session package
    found: list[str] = []
    source = path.read_text(encoding="utf-8")
    for line, target in package_imports(source, package_of(path), modules):
        name = dotted(target)
        if name in SESSION_MODULES or name.startswith(inside):
            found.append(f"{path.relative_to(PACKAGE).as_posix()}:{line}: {name}")
    return found


def test_upstream_and_ops_do_not_import_the_session() -> None:
    modules = frozenset(GRAPH)
    below = [
        p for p in source_files() if any(module_of(p)[:1] == part for part in BELOW_THE_SESSION)
    ]
    assert below, "the parts below the session are found"
    found = [hit for p in below for hit in session_imports(p, modules)]
    assert not found, "imports of the session below it:\n" + "\n".join(found)


def test_modules_are_short() -> None:
    longer: list[str] = []
    for path in source_files():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            longer.append(f"{path.relative_to(PACKAGE).as_posix()}: {lines} lines")
    assert not longer, f"modules over {MAX_LINES} lines:\n" + "\n".join(longer)


# ---- the walker and the components, on small examples


def test_every_module_is_in_the_graph() -> None:
    assert len(GRAPH) == len(source_files())
    assert {(), ("core",), ("core", "session"), ("sim", "state")} <= set(GRAPH)


MODULES = frozenset({(), ("core",), ("core", "wire"), ("core", "actions"), ("ops",), ("cli",)})


@pytest.mark.parametrize(
    ("source", "package", "expected"),
    [
        ("from .core import wire", (), [("core", "wire")]),
        ("from .core import Thing", (), [("core",)]),  # a name defined in core/__init__.py
        ("from .core import wire, Thing", (), [("core", "wire"), ("core",)]),
        ("from . import wire", ("core",), [("core", "wire")]),
        ("from . import cli", (), [("cli",)]),
        ("from ..core.actions import Y", ("ops",), [("core", "actions")]),
        ("from .. import wire", ("core", "dialects"), [("core", "wire")]),
        ("def f():\n    from ..core import wire", ("ops",), [("core", "wire")]),
        ("if TYPE_CHECKING:\n    from ..core.actions import Y", ("ops",), [("core", "actions")]),
        ("import wsmode.core.wire", ("ops",), [("core", "wire")]),
        ("from wsmode.core import wire", ("ops",), [("core", "wire")]),
        ("import aiohttp\nfrom typing import Any", ("ops",), []),
    ],
)
def test_imports_resolve_to_modules(source: str, package: Module, expected: list[Module]) -> None:
    assert [t for _, t in package_imports(source, package, MODULES)] == expected


def test_graph_of_a_package_on_disk(tmp_path: Path) -> None:
    files = {
        "__init__.py": "",
        "a.py": "from .sub import b\n",
        "sub/__init__.py": "from . import b\n",  # an __init__ importing its submodule
        "sub/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .. import a\n",
        "c.py": "def f():\n    from .sub.b import X\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path)
    assert graph == {
        (): frozenset(),
        ("a",): frozenset({("sub", "b")}),
        ("sub",): frozenset({("sub", "b")}),
        ("sub", "b"): frozenset({("a",)}),
        ("c",): frozenset({("sub", "b")}),
    }
    assert [describe(c, graph) for c in circles(graph)] == ["a <-> sub.b: a -> sub.b, sub.b -> a"]


def test_components() -> None:
    graph: dict[Module, frozenset[Module]] = {
        ("a",): frozenset({("b",)}),
        ("b",): frozenset({("c",), ("d",)}),
        ("c",): frozenset({("a",)}),  # a -> b -> c -> a
        ("d",): frozenset({("e",)}),
        ("e",): frozenset({("d",), ("f",)}),  # d <-> e, reached from the first circle
        ("f",): frozenset(),
        ("g",): frozenset({("a",), ("f",)}),
    }
    assert strongly_connected(graph) == [
        [("a",), ("b",), ("c",)],
        [("d",), ("e",)],
        [("f",)],
        [("g",)],
    ]
    assert circles(graph) == [[("a",), ("b",), ("c",)], [("d",), ("e",)]]
    assert circles({("a",): frozenset(), ("b",): frozenset({("a",)})}) == []


def test_components_of_a_long_chain() -> None:
    """No recursion: a loop far longer than Python's recursion limit is one component."""
    n = 5000
    graph: dict[Module, frozenset[Module]] = {
        (f"m{i}",): frozenset({(f"m{(i + 1) % n}",)}) for i in range(n)
    }
    assert [len(c) for c in strongly_connected(graph)] == [n]
