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
