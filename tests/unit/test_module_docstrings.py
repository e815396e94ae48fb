"""Module docstrings say what the module is for in a few lines (the why is in docs/modules.md)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 8
# The search's front door is its map: each stage, what it takes and returns, where it lives.
MAPS = {"autoplan/search/__init__.py"}


def _doc_lines(path: Path) -> int:
    doc = ast.get_docstring(ast.parse(path.read_text()), clean=False)
    return len(doc.strip("\n").splitlines()) if doc else 0


def test_module_docstrings_are_short() -> None:
    modules = sorted([*(ROOT / "autoplan").rglob("*.py"), *(ROOT / "backends").rglob("*.py")])
    assert len(modules) > 100
    long = {str(p.relative_to(ROOT)): n for p in modules
            if (n := _doc_lines(p)) > MAX_LINES and str(p.relative_to(ROOT)) not in MAPS}
    assert not long, f"module docstrings over {MAX_LINES} lines (move the why to docs): {long}"


def test_module_notes_name_real_modules() -> None:
    notes = (ROOT / "docs" / "modules.md").read_text()
    named = [line[5:-1] for line in notes.splitlines() if line.startswith("### `")]
    assert named
    gone = [n for n in named if not (ROOT / n).exists()]
    assert not gone, f"docs/modules.md has notes for modules that are gone: {gone}"
