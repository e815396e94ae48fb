"""Committed results and docs carry no machine's absolute paths (they must read the same on
any clone); benchmark scripts write through `benchmarks/_common.write_result`, which makes
paths portable."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ABSOLUTE = re.compile(r"(?<![\w.~$<>-])/(?:work|root|home|opt|tmp)/[\w.-]")
FILES = sorted([*ROOT.glob("benchmarks/results/**/*.json"), *ROOT.glob("docs/*.md"),
                ROOT / "README.md"])


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_absolute_machine_paths(path: Path) -> None:
    hits = [m.group(0) for m in ABSOLUTE.finditer(path.read_text(errors="replace"))]
    assert not hits, f"{path.relative_to(ROOT)} names machine paths: {hits[:3]}"


def test_portable_rewrites_machine_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from _common import portable
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    monkeypatch.setenv("AUTOPLAN_CACHE", "/root/.cache/autoplan")
    doc = {"gguf": "/root/.cache/autoplan/x/plan.gguf", "cmd": ["--out", f"{ROOT}/r.json"],
           "art": "int8=/tmp/p3/art_int8", "models": "--models /tmp/scale_models", "n": 3}
    out = portable(doc)
    assert out == {"gguf": "$AUTOPLAN_CACHE/x/plan.gguf", "cmd": ["--out", "./r.json"],
                   "art": "int8=<path>/art_int8", "models": "--models <path>/scale_models",
                   "n": 3}
    assert not ABSOLUTE.search(str(out))
