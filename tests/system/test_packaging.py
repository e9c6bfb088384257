"""What `pip install wsmode` puts on disk: the import name is `wsmode`, the source folder
`proxy/` is never installed under its own name.

Why: `proxy` is also the top-level package of proxy.py, a popular PyPI distribution. When
wsmode installed a `proxy/` package, `pip install proxy.py` beside it overwrote
`proxy/__init__.py` and `wsmode --version` died with "ImportError: cannot import name
'__version__' from 'proxy'". The last test installs both for real and runs the command.

The wheel is built once per session from a copy of the sources (a build inside the checkout
leaves a `build/` folder whose stale files would go into the next wheel).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from configparser import ConfigParser
from pathlib import Path, PurePosixPath

import pytest
import wsmode

from tests.support.helpers import seconds

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "proxy"
# proxy.py, the distribution whose top-level `proxy` package collided with the old layout
PROXY_PY = "proxy.py>=2.4,<2.5"
# the first test builds the wheel (pip, up to 120 s of its own; 4 s here)
pytestmark = pytest.mark.timeout(seconds(300))


def clean_env() -> dict[str, str]:
    """This environment without PYTHONPATH: a folder on it holding `wsmode.egg-info` (the
    checkout) would make pip take wsmode for installed already, and Python import from it."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def run(argv: list[str], cwd: Path, timeout: float = 60) -> str:
    """`argv`'s stdout, run in `cwd` (away from the checkout, whose `proxy/` folder would be
    importable from the current folder); failing with its output."""
    done = subprocess.run(
        argv, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=seconds(timeout)
    )
    assert done.returncode == 0, f"{' '.join(argv)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def pip(cwd: Path, *args: str, python: Path | None = None) -> None:
    """`pip ARGS` with this interpreter's pip (for `python` when given)."""
    target = ["--python", str(python)] if python else []
    run([sys.executable, "-m", "pip", *target, *args, "--quiet", "--no-input"], cwd, 120)


def build_wheel(source: Path, out: Path) -> Path:
    """The wheel of the project at `source`, built from a clean copy of it."""
    tree = out / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(source / "proxy", tree / "proxy", ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(source / name, tree / name)
    pip(out, "wheel", "--no-deps", "--wheel-dir", str(out / "dist"), str(tree))
    [wheel] = (out / "dist").glob("wsmode-*.whl")
    return wheel


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(ROOT, tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="session")
def names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        return z.namelist()


def test_wheel_holds_only_wsmode(names: list[str]) -> None:
    tops = {name.split("/")[0] for name in names}
    assert "wsmode" in tops
    strays = sorted(t for t in tops if t != "wsmode" and not t.startswith("wsmode-"))
    assert strays == []  # above all no `proxy/`
    assert all(t == "wsmode" or t.endswith(".dist-info") for t in tops), tops


def test_entry_point_is_wsmode_cli(wheel: Path, names: list[str]) -> None:
    [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    with zipfile.ZipFile(wheel) as z:
        text = z.read(entry_points).decode()
    parser = ConfigParser()
    parser.read_string(text)
    assert dict(parser["console_scripts"]) == {"wsmode": "wsmode.cli:main"}


def test_every_package_of_the_source_is_in_the_wheel(names: list[str]) -> None:
    """pyproject.toml lists the packages one by one: a new subpackage must be added there."""
    packages = sorted(p.parent for p in SOURCE.rglob("__init__.py"))
    assert SOURCE in packages and len(packages) > 5
    shipped = set(names)
    missing = [
        p.relative_to(ROOT).as_posix()
        for p in packages
        if str(PurePosixPath("wsmode", p.relative_to(SOURCE).as_posix(), "__init__.py"))
        not in shipped
    ]
    assert missing == []
    # and every module, so a folder of modules without an __init__.py is caught too
    modules = [p for p in SOURCE.rglob("*.py") if "__pycache__" not in p.parts]
    absent = [
        p.relative_to(ROOT).as_posix()
        for p in modules
        if f"wsmode/{p.relative_to(SOURCE).as_posix()}" not in shipped
    ]
    assert absent == []


def test_the_console_page_is_in_the_wheel(names: list[str]) -> None:
    """The console's static files are package data (pyproject's package-data), not modules:
    without that entry the wheel would serve a console with no page."""
    static = sorted(p.name for p in (SOURCE / "console" / "static").iterdir())
    assert static == ["charts.js", "console.css", "console.js", "index.html", "sidecar.html"]
    assert [n for n in static if f"wsmode/console/static/{n}" not in set(names)] == []


def test_importing_the_app_never_imports_a_proxy_module(tmp_path: Path) -> None:
    """In a fresh interpreter (this one has imported much already), run away from the
    checkout, whose `proxy/` folder `python -c` would find through the current folder."""
    script = (
        "import sys, wsmode.app, wsmode.cli, wsmode.sidecar.app\n"
        "print(sorted(m for m in sys.modules if m == 'proxy' or m.startswith('proxy.')))\n"
    )
    assert run([sys.executable, "-c", script], tmp_path).strip() == "[]"


def venv_beside_proxy_py(wheel: Path, root: Path) -> Path:
    """A fresh venv holding the wheel and then proxy.py (the order of the reported breakage:
    proxy.py installed into an environment that has wsmode), and wsmode's dependencies from
    this test environment. Returns its `bin/` folder.

    The dependencies come in through a `.pth` file written after the installs, so pip sees an
    empty environment; a `.pth` line adds a folder to `sys.path` without running the `.pth`
    files inside it, so this environment's editable wsmode stays out.
    """
    env = root / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(env)], root)
    bindir = env / "bin"
    python = bindir / "python"
    pip(root, "install", "--no-deps", str(wheel), python=python)
    pip(root, "install", "--no-deps", PROXY_PY, python=python)
    site = run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], root)
    site = site.strip()
    ours = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    Path(site, "wsmode-test-deps.pth").write_text("\n".join(sorted(ours)) + "\n")
    return bindir


@pytest.mark.slow
@pytest.mark.timeout(seconds(600))  # a venv and two installs from PyPI, 120 s each; 6 s here
def test_wsmode_runs_with_proxy_py_installed_beside_it(wheel: Path, tmp_path: Path) -> None:
    """The reported breakage, for real: proxy.py from PyPI installed beside the built wheel
    (on the layout before the rename this failed with the ImportError quoted above)."""
    bindir = venv_beside_proxy_py(wheel, tmp_path)
    python = bindir / "python"
    expected = f"wsmode, version {wsmode.__version__}"
    assert run([str(bindir / "wsmode"), "--version"], tmp_path).strip() == expected
    assert run([str(python), "-m", "wsmode", "--version"], tmp_path).strip() == expected
    # the installed wheel answered, not this checkout; and proxy.py is intact beside it
    where = run([str(python), "-c", "import wsmode; print(wsmode.__file__)"], tmp_path)
    assert Path(where.strip()).is_relative_to(bindir.parent)
    assert run([str(python), "-m", "proxy", "--version"], tmp_path).strip().startswith("2.4.")
