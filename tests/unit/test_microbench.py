"""The microbenchmark harness on CPU with tiny shapes, and the cost-table file format."""

from __future__ import annotations

import json

import pytest
import torch

from autoplan.backends import microbench as MB
from autoplan.errors import AutoplanError, UnsupportedFormatError, UserInputError
from autoplan.formats import Choice, Precision
from autoplan.quant import quantize_activation


def test_time_callable_counts_calls_and_orders_percentiles():
    calls = []
    t = MB.time_callable(lambda: calls.append(1), "cpu", repeats=7, warmup=2)
    assert len(calls) == 9
    assert 0 <= t.p10_us <= t.median_us <= t.p90_us
    with pytest.raises(UserInputError):
        MB.time_callable(lambda: None, "cpu", repeats=0)


# bf16 outputs (every kernel fed bf16 x returns bf16): one bf16 rounding plus summation order
TOL = {"bf16": dict(rtol=2**-7, atol=1e-3), "fp32": dict(rtol=1e-5, atol=1e-5)}


@pytest.mark.parametrize("choice", ["dense+bf16", "dense+fp32", "block16@50+bf16",
                                    "block32@50+fp32", "block32@50+int8", "block32@50+fp8_e4m3"])
def test_layer_ops_compute_x_at_the_masked_simulated_weight(choice):
    """The timed kernel computes x_sim @ W_masked.T, where W_masked is the weight
    autoplan.prune + autoplan.quant make (what the quality of the plan was measured on)."""
    c = Choice.parse(choice)
    build, kernel = MB.prepare_linear(c, torch.device("cpu"))
    assert kernel in {"torch.linear", "bsr_reference"}
    gen = torch.Generator().manual_seed(0)
    w, x = torch.randn(64, 96, generator=gen) * 0.02, torch.randn(3, 96, generator=gen)
    q, mask = MB.compress_for(c, w)
    if mask is not None:
        assert 0 < float(mask.float().mean()) < 1 and not q.dequant[~mask].any()
    want = quantize_activation(x, c.precision) @ q.dequant.float().T
    act = torch.float32 if c.precision is Precision.FP32 else torch.bfloat16
    got = build(w)(x.to(act)).float()
    if c.precision.info.math in ("int8", "fp8"):  # inputs rounded from bf16 x, as timed
        want = quantize_activation(x.to(act).float(), c.precision) @ q.dequant.float().T
    torch.testing.assert_close(got, want, **TOL["bf16" if act == torch.bfloat16 else "fp32"])
    call, _ = MB.make_layer_op(choice, 3, 64, 96, "cpu")
    assert call().shape == (3, 64)


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
