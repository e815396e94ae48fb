"""docs/results.md holds current figures only: each is the value its results JSON holds.

A figure row is ``| what | figure | kind | source |``: ``source`` names a JSON file and a key
path in it (`` `benchmarks/results/x.json` `a.b[0].c` ``), ``figure`` is that value rounded to
the digits shown (thousands separators and a unit after the number are allowed; a figure
ending in ``%`` is the JSON's fraction x 100), and ``kind`` says ``measured`` or
``predicted``. A section's ``Command:`` line must be the command its JSON files record, and
its ``Machine:`` line name the CPU and core count they record.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "results.md"
_SOURCE = re.compile(r"`(?P<file>[^`]+\.json)`\s*`(?P<key>[^`]+)`")
_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?", re.I)
_COMMAND = re.compile(r"^Command:\s*`(?P<cmd>[^`]+)`", re.M)
_MACHINE = re.compile(r"^Machine:\s*(?P<machine>.+)$", re.M)


def _rows() -> list[tuple[str, str, str, list[str]]]:
    """(section title, its Command, its Machine line ("" when absent), the row's cells) of
    every figure row."""
    out = []
    for section in DOC.read_text().split("\n## ")[1:]:
        title = section.splitlines()[0].strip()
        command, machine = _COMMAND.search(section), _MACHINE.search(section)
        for line in section.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if line.startswith("|") and len(cells) == 4 and _SOURCE.search(cells[3]):
                out.append((title, command.group("cmd") if command else "",
                            machine.group("machine") if machine else "", cells))
    return out


def _lookup(doc: object, key: str) -> object:
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", key):
        doc = doc[int(part[1:-1])] if part.startswith("[") else doc[part]  # type: ignore[index]
    return doc


def _ids() -> list[str]:
    return [f"{title}: {cells[0]}" for title, _, _, cells in _rows()]


def test_the_doc_has_figures() -> None:
    assert len(_rows()) >= 5


@pytest.mark.parametrize(("title", "command", "machine", "cells"), _rows(), ids=_ids())
def test_each_figure_is_the_one_its_json_holds(title: str, command: str, machine: str,
                                               cells: list[str]) -> None:
    what, figure, kind, source = cells
    assert re.search(r"\b(measured|predicted)\b", kind), f"{what}: say measured or predicted"
    match = _SOURCE.search(source)
    assert match is not None
    path = ROOT / match.group("file")
    assert path.is_file(), f"{what}: no results file {match.group('file')}"
    doc = json.loads(path.read_text())
    value = _lookup(doc, match.group("key"))
    assert isinstance(value, (int, float)) and not isinstance(value, bool), (what, value)
    number = _NUMBER.search(figure)
    assert number is not None, f"{what}: no number in '{figure}'"
    text = number.group(0).replace(",", "")
    shown = float(text)
    digits = len(text.split(".")[1]) if "." in text and "e" not in text.lower() else 0
    scale = 100.0 if figure.rstrip().endswith("%") else 1.0
    assert abs(shown - value * scale) <= 0.5 * 10 ** -digits * (1 + 1e-9), \
        f"{what}: the doc says {figure}, {match.group('file')} holds {value}"
    if command and isinstance(doc, dict) and "command" in doc:
        assert doc["command"] == command, f"{title}: Command line differs from the JSON's"
    if "measured" in kind:
        assert machine, f"{title}: a measured figure needs the section's Machine: line"
        recorded = doc.get("machine", {}) if isinstance(doc, dict) else {}
        if recorded:
            assert recorded["cpu"] in machine and f"{recorded['cores']} cores" in machine, \
                f"{title}: Machine: line differs from the JSON's {recorded}"
