"""The docs cite tests as the proof of each invariant and failure-matrix row; a test that is moved or
renamed must take its citations along, or the design's claims point at nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([*ROOT.glob("docs/*.md"), ROOT / "README.md", ROOT / "routing" / "README.md"])
# ``tests/x.py``, ``tests/x.py::test_name``, or ``…::test_name`` (a test of a file the text named before).
CITATION = re.compile(r"(tests/[A-Za-z0-9_/]+\.py)(?:::([A-Za-z0-9_]+))?|…::([A-Za-z0-9_]+)")


def _defines(path: Path, name: str) -> bool:
    return re.search(rf"^\s*(?:async )?(?:def|class) {re.escape(name)}\b", path.read_text(), re.M) is not None


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_test_exists(doc: Path) -> None:
    tests = sorted((ROOT / "tests").rglob("test_*.py"))
    missing = []
    for match in CITATION.finditer(doc.read_text()):
        path, name, elsewhere = match.groups()
        if path is not None:
            if not (ROOT / path).exists():
                missing.append(path)
            elif name is not None and not _defines(ROOT / path, name):
                missing.append(f"{path}::{name}")
        elif not any(_defines(test, elsewhere) for test in tests):
            missing.append(f"…::{elsewhere}")
    assert not missing, f"{doc.name} cites tests that do not exist (moved or renamed?): {missing}"


def test_the_module_map_has_a_row_for_every_module_and_none_for_a_module_gone() -> None:
    """design.md's module map is how a newcomer finds a module: a module added, moved or removed
    takes its row along. A folder row (``devtools/stack/``) covers the modules under it."""
    text = (ROOT / "docs" / "design.md").read_text()
    table = text[text.index("### Module map") : text.index("## 3.")]
    first_cells = re.findall(r"^\| ([^|]+) \|", table, re.M)
    named: set[str] = set()
    for cell in first_cells:
        folder = ""
        for entry in re.findall(r"`([^`]+)`", cell):
            if "/" in entry and not entry.endswith("/"):
                folder = entry.rsplit("/", 1)[0] + "/"
            named.add(entry if "/" in entry else folder + entry)  # `a/x.py`, `y.py`: y sits in a/
    package = ROOT / "fanout_sink"
    modules = {str(path.relative_to(package)) for path in package.rglob("*.py") if path.name != "__init__.py"}
    folders = {entry for entry in named if entry.endswith("/")}
    unmapped = sorted(m for m in modules if m not in named and not any(m.startswith(f) for f in folders))
    # The tooling table below the map names tests/ paths, which test_every_cited_test_exists covers.
    gone = sorted(
        e for e in named if e.endswith(".py") and not e.startswith("tests/") and not (package / e).exists()
    )
    assert not unmapped, f"modules without a row in design.md's module map: {unmapped}"
    assert not gone, f"design.md's module map names modules that no longer exist: {gone}"
