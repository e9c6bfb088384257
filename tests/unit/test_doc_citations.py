"""The protocol and client references cited in the source, the tests and the README are in
the repository (docs/protocol.md, docs/clients.md), and every section a citation names
exists there, as every section of docs/tokens.md the token path's code names: a renamed
section, or a citation of a file that is not in the repository, fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = {name: ROOT / name for name in ("docs/protocol.md", "docs/clients.md", "docs/tokens.md")}
# a citation: the file, then one or more quoted section names, comma-separated
CITATION = re.compile(r'(docs/(?:protocol|clients|tokens)\.md)((?:,?\s+"[^"]{1,60}")+)')


def _texts() -> dict[Path, str]:
    files = [*ROOT.glob("proxy/**/*.py"), *ROOT.glob("tests/**/*.py"), *ROOT.glob("docs/*.md")]
    files += [ROOT / "README.md", ROOT / "config/wsmode.example.toml"]
    return {f: f.read_text(encoding="utf-8") for f in files if f != Path(__file__)}


def _headings(path: Path) -> set[str]:
    return {
        m.group(1).strip()
        for m in re.finditer(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.MULTILINE)
    }


def test_nothing_cites_a_reference_outside_the_repository() -> None:
    outside = re.compile(r"\b(PROTOCOL|CLIENTS)(\.md\b| \d)")
    found = [
        f"{path.relative_to(ROOT)}: {m.group(0)}"
        for path, text in _texts().items()
        for m in outside.finditer(text)
    ]
    assert found == []


def test_every_cited_section_exists() -> None:
    headings = {name: _headings(path) for name, path in DOCS.items()}
    cited = 0
    missing = []
    for path, text in _texts().items():
        for m in CITATION.finditer(text):
            for section in re.findall(r'"([^"]+)"', m.group(2)):
                cited += 1
                if " ".join(section.replace("#", " ").split()) not in headings[m.group(1)]:
                    missing.append(f"{path.relative_to(ROOT)}: {m.group(1)} {section!r}")
    assert missing == []
    assert cited > 50  # the source cites the reference throughout
