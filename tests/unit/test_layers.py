"""The dependency rule of docs/architecture.md, checked on the source with `ast`.

Each part of the package may import only the parts below it:

    core  <-  config, logs  <-  ops, upstream  <-  build, runtime  <-  executor
          <-  ws_front, http_front, sidecar  <-  app  <-  serve  <-  cli

`telemetry` (tracing's settings and hooks, no OpenTelemetry import) imports nothing of the
package and may be imported by any part; config only its settings. `sim` (the simulated
model) uses `core` only; `bench` is tooling and may use anything. `ops`
and `upstream` are siblings and do not import each other: the runner reports timings through
a protocol the tracker satisfies. A relative import that climbs out of a part is resolved to
the part it lands in; an absolute `wsmode.*` import counts alike. The imports are read by
tests/unit/module_graph.py, the walker every import test shares.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.module_graph import ABOVE_TOP, PACKAGE, dotted, package_imports

ALLOWED: dict[str, frozenset[str]] = {
    "core": frozenset(),
    # tracing's plain parts (its settings, the hooks the upstream client calls): stdlib only
    "telemetry": frozenset(),
    # `sim` and `telemetry` for their settings dataclasses only (see below)
    "config": frozenset({"core", "sim", "telemetry"}),
    "logs": frozenset({"core"}),
    # the settings as `wsmode check-config` shows them, redacted (config.py's neighbour)
    "config_view": frozenset({"core", "config"}),
    "ops": frozenset({"core", "config", "logs", "telemetry"}),
    "upstream": frozenset({"core", "config", "logs", "telemetry"}),
    "build": frozenset({"core", "config"}),
    "runtime": frozenset({"core", "config", "build", "upstream"}),
    # the one executor of the session's actions, which the two fronts of the session share
    "executor": frozenset({"core", "config", "logs", "ops", "upstream"}),
    "ws_front": frozenset(
        {"core", "config", "logs", "ops", "upstream", "build", "runtime", "executor"}
    ),
    "http_front": frozenset(
        {"core", "config", "logs", "ops", "upstream", "build", "runtime", "executor"}
    ),
    "sidecar": frozenset({"core", "config", "logs", "ops", "upstream"}),
    # the browser console reads what the fronts hold (open connections) for its snapshots
    "console": frozenset({"core", "config", "logs", "ops", "upstream", "runtime", "ws_front"}),
    "app": frozenset(
        {"core", "config", "logs", "ops", "upstream", "build", "runtime", "ws_front"}
        | {"http_front", "sim", "console"}
    ),
    "serve": frozenset({"core", "config", "logs", "ops", "app"}),
    "sim": frozenset({"core"}),
}
# Parts that may import anything: the command line and the benchmarks.
UNRESTRICTED = frozenset({"cli", "bench", "__init__", "__main__"})


def part_of(module: tuple[str, ...]) -> str:
    return module[0] if module else "__init__"  # `import wsmode`: the package's own top


def imported_parts(rel: tuple[str, ...], source: str) -> list[tuple[int, str, str]]:
    """`(line, part, dotted target)` for each import of the package's own modules in
    `source`, the module at `rel` (its path in the package without `.py`, e.g.
    `("core", "session")`)."""
    found: list[tuple[int, str, str]] = []
    for line, target in package_imports(source, rel[:-1]):
        if target == ABOVE_TOP:
            raise AssertionError(f"{'/'.join(rel)}:{line} climbs out of the package")
        found.append((line, part_of(target), dotted(target)))
    return found


def violations(rel: tuple[str, ...], source: str) -> list[str]:
    me = rel[0]
    if me in UNRESTRICTED:
        return []
    allowed = ALLOWED[me] | {me}
    found = imported_parts(rel, source)
    bad = [f"{line}: {target}" for line, part, target in found if part not in allowed]
    if me == "config":  # config may name the simulated model's settings, never its server
        bad += [
            f"{line}: {target}"
            for line, part, target in found
            if part in ("sim", "telemetry") and target != f"{part}.settings"
        ]
    return bad


FILES = sorted(PACKAGE.rglob("*.py"))


def test_every_part_has_a_rule() -> None:
    parts = {p.relative_to(PACKAGE).with_suffix("").parts[0] for p in FILES}
    assert parts - UNRESTRICTED <= set(ALLOWED), "a new part needs its place in the rule"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_module_imports_only_lower_layers(path: Path) -> None:
    rel = path.relative_to(PACKAGE).with_suffix("").parts
    assert violations(rel, path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    ("rel", "source", "expected"),
    [
        (
            ("core", "session"),
            "from ..ops.metrics import Metrics\nfrom . import wire",
            ["1: ops.metrics"],
        ),
        (("core", "dialects", "chat"), "from ...upstream import client", ["1: upstream"]),
        (("core", "dialects", "chat"), "from .. import wire\nfrom .builder import x", []),
        (("upstream", "runner"), "from ..ops.tracking import RunTrace", ["1: ops.tracking"]),
        (("config",), "from .sim.app import create_sim_app", ["1: sim.app"]),
        (("config",), "from .sim.settings import SimSettings", []),
        (("ws_front",), "from .app import create_app", ["1: app"]),
        (("cli",), "from .bench.runner import run", []),
    ],
)
def test_rule_resolves_relative_imports(
    rel: tuple[str, ...], source: str, expected: list[str]
) -> None:
    assert violations(rel, source) == expected
