"""docs/architecture.md's search pipeline table names each stage where it is defined."""

from __future__ import annotations

import ast
from pathlib import Path
import re

ROOT = Path(__file__).resolve().parents[2]
SEARCH = ROOT / "autoplan" / "search"


def _table_rows() -> list[tuple[str, str]]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("## Search pipeline\n", 1)[1].split("```", 2)[1]
    return re.findall(r"^(?:CLI options ──► )?(\w+)\b.*?\s((?:request|preparation|stages)/_\w+\.py)\s",
                      block, flags=re.M)


def test_every_stage_lives_where_the_table_says() -> None:
    rows = _table_rows()
    names = [name for name, _ in rows]
    assert {"SearchRequest", "preflight", "prepare_shared", "prepare_platform", "run_rounds",
            "choose", "certify", "build_plan"} <= set(names), names
    wrong = []
    for name, file in rows:
        tree = ast.parse((SEARCH / file).read_text())
        defined = {n.name for n in tree.body
                   if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        if name not in defined:
            wrong.append(f"{name} is not defined in search/{file}")
    assert not wrong, wrong


def test_every_stage_is_exported_by_the_front_door_or_its_subpackage() -> None:
    from importlib import import_module

    modules = [import_module(f"autoplan.search{sub}") for sub in ("", ".request", ".preparation", ".stages")]
    for name, _ in _table_rows():
        assert any(name in m.__all__ for m in modules), name
