"""The package's modules and the imports between them, read from the source with `ast`.

One walker for every test about imports (the layer rule of test_layers.py, the sans-I/O rule
of test_core_imports.py, the circles and the session's reach in test_import_graph.py).
Nothing is imported: the scan reads every import statement wherever it stands, at the top,
inside a function or under `if TYPE_CHECKING:`.

A module is named by its parts below proxy/ (imported as `wsmode`): `("core", "session")` for
proxy/core/session.py, `("core",)` for proxy/core/__init__.py, `()` for proxy/__init__.py.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "proxy"  # imported as `wsmode`
TOP = "wsmode"

Module = tuple[str, ...]  # a module of the package by its parts below proxy/: ("core", "sse")
ABOVE_TOP: Module = ("..",)  # where a relative import climbing out of the package lands


def module_of(path: Path, root: Path = PACKAGE) -> Module:
    parts = path.relative_to(root).with_suffix("").parts
    return parts[:-1] if parts[-1] == "__init__" else parts


def package_of(path: Path, root: Path = PACKAGE) -> Module:
    """The package relative imports in `path` start from: itself for an `__init__.py`."""
    module = module_of(path, root)
    return module if path.name == "__init__.py" else module[:-1]


def dotted(module: Module) -> str:
    """`core.session`; the package's own `__init__` is `wsmode`."""
    return ".".join(module) or TOP


def source_files(root: Path = PACKAGE) -> list[Path]:
    return sorted(root.rglob("*.py"))


def package_imports(
    source: str, package: Module, modules: Iterable[Module] = ()
) -> list[tuple[int, Module]]:
    """(lineno, module) for every import of the package's own modules in `source`, written
    in a module of `package`: relative imports resolved, and absolute `wsmode.*` ones.

    `from .. import wire` names the module `wire` of the parent package; when the parent is
    the top of the package, what follows `import` is the module. A relative import climbing
    above the top resolves to `ABOVE_TOP`, never inside anything.

    Given the package's `modules`, `from .core import wire` resolves to `("core", "wire")`
    when that is a module (a name defined in core/__init__.py stays `("core",)`), as does
    `from . import x` for a module `x`; without them, `from X import ...` is `X`.
    """
    known = frozenset(modules)
    found: list[tuple[int, Module]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                head, *rest = alias.name.split(".")
                if head == TOP:
                    found.append((node.lineno, tuple(rest)))
        elif isinstance(node, ast.ImportFrom):
            named = tuple(node.module.split(".")) if node.module else ()
            if node.level == 0:
                if named[:1] != (TOP,):
                    continue
                base = named[1:]
            elif node.level - 1 > len(package):
                found.append((node.lineno, ABOVE_TOP))
                continue
            else:
                base = package[: len(package) - (node.level - 1)] + named
            if node.module is None or not base:
                found += [(node.lineno, (*base, alias.name)) for alias in node.names]
            elif known:
                subs = [(*base, alias.name) for alias in node.names]
                found += [(node.lineno, sub if sub in known else base) for sub in subs]
            else:
                found.append((node.lineno, base))
    return found


Graph = Mapping[Module, frozenset[Module]]


def import_graph(root: Path = PACKAGE) -> dict[Module, frozenset[Module]]:
    """Every module of the package at `root`, with the modules of the package it imports.
    An import of something that is not a module of the package (a typo, a climb out) is left
    out; a package's `__init__` importing its submodules is an edge like any other."""
    modules = {module_of(p, root): p for p in source_files(root)}
    graph: dict[Module, frozenset[Module]] = {}
    for module, path in modules.items():
        source = path.read_text(encoding="utf-8")
        targets = {t for _, t in package_imports(source, package_of(path, root), modules)}
        graph[module] = frozenset(t for t in targets if t in modules and t != module)
    return graph


def strongly_connected(graph: Graph) -> list[list[Module]]:
    """The strongly connected components of `graph` (Tarjan's algorithm, without recursion),
    each sorted, in sorted order. A module that imports nothing circular is a component of
    its own."""
    index: dict[Module, int] = {}
    low: dict[Module, int] = {}
    stack: list[Module] = []
    on_stack: set[Module] = set()
    components: list[list[Module]] = []

    for root in sorted(graph):
        if root in index:
            continue
        # each frame: a module and the iterator over the modules it imports
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:  # every import of `node` seen
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component: list[Module] = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
    return sorted(components)


def circles(graph: Graph) -> list[list[Module]]:
    """The components of more than one module: modules that import each other, directly or
    around a longer loop."""
    return [c for c in strongly_connected(graph) if len(c) > 1]
