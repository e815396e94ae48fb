"""Rich tables written to a file or a pipe keep every cell on its line (issue 13: `autoplan
targets > f` wrapped at 80 columns and split "alia/ses"); a terminal keeps its own width."""

from __future__ import annotations

import io
import json

from click.testing import CliRunner
from rich.table import Table

from autoplan.cli import cli
from autoplan.cli._output import FILE_WIDTH, _Console


def _rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("│")]


def test_targets_to_a_file_keeps_each_target_on_one_line() -> None:
    targets = json.loads(CliRunner().invoke(cli, ["targets", "--json"]).stdout)
    result = CliRunner().invoke(cli, ["targets"])  # stdout is not a terminal here
    assert result.exit_code == 0, result.output
    rows = _rows(result.stdout)
    assert len(rows) == len(targets)  # no row continues on a second line
    for t in targets:
        (row,) = [r for r in rows if r.split("│")[1].strip() == t["name"]]
        assert ", ".join(t["aliases"]) in row  # whole words, the whole list


def test_show_layers_to_a_file_keeps_names_and_choices_whole(tmp_path) -> None:
    from tests.unit.test_export_common import layer_names, make_plan, tiny_loaded

    loaded = tiny_loaded(tmp_path)
    decisions = {n: "dense+int4_g128" if "mlp" in n else "dense+fp8_e4m3"
                 for n in layer_names(loaded)}
    path = tmp_path / "plan.json"
    path.write_text(make_plan(loaded, decisions).model_dump_json())
    out = CliRunner().invoke(cli, ["show", str(path), "--layers"]).stdout
    lines = out.splitlines()
    for name, choice in decisions.items():
        assert any(line.split() == [name, choice] for line in lines), name
    assert "…" not in out  # nothing cut short


def test_file_width_applies_only_off_a_terminal() -> None:
    table = Table()
    table.add_column("a very long column heading that would not fit in eighty columns")
    table.add_column("another long heading, to be sure it needs more than eighty")
    table.add_row("x" * 70, "y" * 70)
    buf = io.StringIO()
    _Console(file=buf).print(table)
    widths = {len(line) for line in buf.getvalue().splitlines()}
    assert max(widths) > 140 and max(widths) < FILE_WIDTH  # as wide as the content, no wider
    narrow = io.StringIO()
    _Console(file=narrow, width=60).print(table)  # an explicit width is kept
    assert max(len(line) for line in narrow.getvalue().splitlines()) <= 60
    terminal = io.StringIO()
    _Console(file=terminal, force_terminal=True, width=None, color_system=None).print(table)
    assert max(len(line) for line in terminal.getvalue().splitlines()) < FILE_WIDTH


def test_show_groups_a_dense_plan_by_part(tmp_path) -> None:
    """One row per part and choice, the part named: a dense plan whose attention and MLP share
    a choice showed that choice twice with no part column to tell the rows apart."""
    from autoplan.modelspec import part_of
    from tests.unit.test_export_common import layer_names, make_plan, tiny_loaded

    loaded = tiny_loaded(tmp_path)
    decisions = dict.fromkeys(layer_names(loaded), "dense+bf16")
    path = tmp_path / "plan.json"
    path.write_text(make_plan(loaded, decisions).model_dump_json())
    out = CliRunner().invoke(cli, ["show", str(path)]).stdout
    rows = [[c.strip() for c in r.split("│")[1:-1]] for r in _rows(out)]
    by_part = {(p, c): n for p, c, n in (r for r in rows if len(r) == 3 and r[1] == "dense+bf16")}
    parts = {part_of(n) for n in decisions}
    assert {p for p, _ in by_part} == {p.replace("_", " ") for p in parts}
    assert sum(int(n) for n in by_part.values()) == len(decisions)
