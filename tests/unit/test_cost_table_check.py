"""`autoplan validate --cost-table`: the analytic GEMM time against a measured table, per
kernel class, on a synthetic table whose errors are known by construction."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from autoplan.cli import cli
from autoplan.cost.efficiency import baseline_precision, family_efficiency
from autoplan.cost.linear import call_overhead, gemm_time
from autoplan.cost.table_check import DISAGREE, check_cost_table
from autoplan.formats import Choice
from autoplan.targets import get_target

H200 = get_target("h200")
SHAPES = [(m, n, k) for m in (1, 16, 128, 1024, 8192) for n, k in ((6144, 4096), (4096, 14336))]


def _analytic_us(choice: str, m: int, n: int, k: int) -> float:
    c = Choice.parse(choice)
    eff = family_efficiency(H200)
    g = gemm_time(H200, eff, c, m, n, k, baseline_precision(H200))
    return (g.seconds + call_overhead(H200, eff, c)) * 1e6


def _table(scale: dict[str, float]) -> dict:
    """Rows measured at analytic x scale[choice]: the model's error is 1/scale - 1."""
    rows = [{"m": m, "n": n, "k": k, "choice": c, "kernel": f"k-{c}",
             "median_us": _analytic_us(c, m, n, k) * s, "p10_us": 0.0, "p90_us": 0.0}
            for c, s in scale.items() for m, n, k in SHAPES]
    return {"schema_version": 1, "device": "NVIDIA H200", "rows": rows}


def test_errors_per_kernel_class_are_the_constructed_ones():
    check = check_cost_table(_table({"dense+bf16": 1.0, "dense+fp8_e4m3": 1.25}), H200)
    by = {(c.choice, c.bound): c for c in check.classes}
    assert {c for c, _ in by} == {"dense+bf16", "dense+fp8_e4m3"}
    assert {b for _, b in by} == {"memory", "compute"}  # M = 1 streams, M = 8192 computes
    for (choice, _), c in by.items():
        want = 0.0 if choice == "dense+bf16" else 1 / 1.25 - 1  # measured slower: model fast
        assert c.mean_error == pytest.approx(want, abs=1e-9)
        assert c.mape == pytest.approx(abs(want), abs=1e-9)
        assert c.disagrees is (abs(want) > DISAGREE)
    assert check.mape == pytest.approx(0.1, abs=1e-9)  # half the rows 0, half 20 %


def test_a_choice_the_target_cannot_run_is_reported_not_predicted():
    table = _table({"dense+bf16": 1.0})
    table["rows"].append({"m": 16, "n": 4096, "k": 4096, "choice": "dense+nvfp4",
                          "median_us": 10.0})
    check = check_cost_table(table, H200)
    nvfp4 = [r for r in check.rows if r.choice == "dense+nvfp4"]
    assert len(nvfp4) == 1 and nvfp4[0].predicted_s is None and "fp4" in nvfp4[0].why
    assert all(c.choice != "dense+nvfp4" for c in check.classes)


def test_cli_reports_classes_reads_the_target_from_the_device_and_flags(tmp_path):
    path = tmp_path / "cost_table.json"
    path.write_text(json.dumps(_table({"dense+bf16": 1.0, "2:4+bf16": 0.5})))
    result = CliRunner().invoke(cli, ["validate", "--cost-table", str(path), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["target"] == "h200"
    flagged = {(c["choice"], c["disagrees"]) for c in doc["classes"]}
    assert flagged == {("dense+bf16", False), ("2:4+bf16", True)}  # predicted 2x slow
    text = CliRunner().invoke(cli, ["validate", "--cost-table", str(path)])
    assert text.exit_code == 0 and "(correction candidates): 2:4+bf16 (compute), 2:4+bf16 (memory)" in text.output


@pytest.mark.parametrize("args, message", [
    (["--target", "h200"], "--target applies to --cost-table only"),
    (["--cost-table", "{missing}"], "no cost table"),
    (["--cost-table", "{unknown_device}"], "cannot tell the target"),
])
def test_bad_input_is_a_one_line_usage_error(tmp_path, args, message):
    unknown = tmp_path / "t.json"
    unknown.write_text(json.dumps({**_table({"dense+bf16": 1.0}), "device": "cpu (2 threads)"}))
    args = [a.format(missing=tmp_path / "nope.json", unknown_device=unknown) for a in args]
    result = CliRunner().invoke(cli, ["validate", *args])
    assert result.exit_code == 2
    assert message in result.output and result.output.strip().count("\n") == 0
