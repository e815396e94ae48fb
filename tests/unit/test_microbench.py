"""The microbenchmark harness on CPU with tiny shapes, and the cost-table file format."""

from __future__ import annotations

import json

import pytest
import torch

from autoplan.backends import microbench as MB
from autoplan.errors import AutoplanError, UnsupportedFormatError, UserInputError


def test_time_callable_counts_calls_and_orders_percentiles():
    calls = []
    t = MB.time_callable(lambda: calls.append(1), "cpu", repeats=7, warmup=2)
    assert len(calls) == 9
    assert 0 <= t.p10_us <= t.median_us <= t.p90_us
    with pytest.raises(UserInputError):
        MB.time_callable(lambda: None, "cpu", repeats=0)


@pytest.mark.parametrize("choice", ["dense+bf16", "dense+fp32", "block16@50+bf16", "block32@50+int8"])
def test_layer_ops_compute_the_layer(choice):
    call, kernel = MB.make_layer_op(choice, 3, 64, 96, "cpu")
    y = call()
    assert y.shape == (3, 64) and torch.isfinite(y.float()).all()
    assert kernel in {"torch.linear", "bsr_reference"}


def test_gpu_only_choices_are_refused_on_cpu_with_the_alternatives():
    with pytest.raises(UnsupportedFormatError, match="CPU"):
        MB.make_layer_op("2:4+fp8_e4m3", 4, 64, 64, "cpu")


def test_sweep_writes_a_table_that_reads_back(tmp_path):
    rows, skipped = MB.run_microbench(
        [(2, 32, 64), (8, 64, 32)], ["dense+bf16", "block16@50+fp8_e4m3", "2:4+bf16"], "cpu", repeats=3, warmup=1
    )
    assert {(r["m"], r["choice"]) for r in rows} == {
        (2, "dense+bf16"), (2, "block16@50+fp8_e4m3"), (8, "dense+bf16"), (8, "block16@50+fp8_e4m3")
    }
    assert len(skipped) == 2 and all("\n" not in s["reason"] for s in skipped)
    path = MB.write_cost_table(MB.cost_table(rows, "cpu", skipped), tmp_path / "sub" / "table.json")
    data = MB.read_cost_table(path)
    assert data["schema_version"] == 1 and data["device"].startswith("cpu")
    assert data["torch"] == torch.__version__
    assert set(data["rows"][0]) == {"m", "n", "k", "choice", "kernel", "median_us", "p10_us", "p90_us"}


def test_read_refuses_other_schema_versions_and_broken_rows(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"schema_version": 2, "rows": []}))
    with pytest.raises(AutoplanError, match="schema_version"):
        MB.read_cost_table(path)
    path.write_text(json.dumps({"schema_version": 1, "rows": [{"m": 1}]}))
    with pytest.raises(AutoplanError, match="lacks"):
        MB.read_cost_table(path)
