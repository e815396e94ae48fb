"""A measured cost table (benchmarks/gpu_check.sh output) replaces analytic GEMM times in
`autoplan estimate` (and `search`, through the same loader); bad paths are one-line errors."""

from __future__ import annotations

import json

from click.testing import CliRunner

from autoplan.cli import cli

CONFIG = "examples/configs/smollm2-135m.json"
ARGS = ["estimate", "--model", CONFIG, "--target", "h100", "--precision", "bf16",
        "--batch", "32", "--json"]


def _tpot(result) -> float:  # noqa: ANN001
    assert result.exit_code == 0, result.output
    return json.loads(result.output)["candidate"]["metrics"]["tpot_s"]


def test_measured_rows_replace_the_analytic_gemm_time(tmp_path):
    table = tmp_path / "cost_table.json"
    row = {"m": 32, "n": 1536, "k": 576, "choice": "dense+bf16", "median_us": 50.0,
           "p10_us": 49.0, "p90_us": 51.0}
    table.write_text(json.dumps({"schema_version": 1, "device": "test", "rows": [row]}))
    runner = CliRunner()
    analytic = _tpot(runner.invoke(cli, ARGS))
    measured = _tpot(runner.invoke(cli, [*ARGS, "--cost-table", str(table)]))
    # 60 gate/up GEMMs (30 blocks x 2) now take 50 us each instead of a few us
    assert measured > analytic + 60 * 40e-6


def test_missing_cost_table_is_a_one_line_usage_error(tmp_path):
    result = CliRunner().invoke(cli, [*ARGS, "--cost-table", str(tmp_path / "nope.json")])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0 and "no cost table" in result.output
