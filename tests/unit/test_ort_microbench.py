"""ORT kernel microbenchmark (backends/cpu/ort_microbench.py) and its use by the cost model.

Tiny shapes only: a few seconds on 2 cores.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from autoplan.backends.cpu import ort_microbench as OM
from autoplan.backends.microbench import read_cost_table, write_cost_table

from autoplan.cost import CostModel
from autoplan.cost.efficiency import family_efficiency
from autoplan.cost.measured import MeasuredTable
from autoplan.formats import Choice
from autoplan.modelspec import ModelSpec
from autoplan.targets import get_target
from autoplan.workload import Workload

_TOY_CFG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 256, "tie_word_embeddings": True}


def _optimized_ops(model, tmp_path) -> list[str]:
    import onnx
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return [n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node]


@pytest.mark.parametrize("choice,op", [("fp32", "MatMul"), ("int8", "DynamicQuantizeMatMul"),
                                       ("int4_g32", "MatMulNBits"), ("int4a8_g32", "MatMulNBits"),
                                       ("int8a8_g128", "MatMulNBits")])
def test_graph_runs_the_artifact_kernel(choice, op, tmp_path):
    model, kernel = OM.build_graph(2, 48, 64, choice, copies=2)
    assert kernel == op
    assert _optimized_ops(model, tmp_path) == [op, op]  # one kernel per copy, int8 fused


def test_fp32_graph_computes_the_product():
    from onnx import numpy_helper

    model, _ = OM.build_graph(3, 16, 32, "fp32", copies=2)
    sess = OM._session(model, threads=1, spinning=False)
    x = np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32)
    ys = sess.run(None, {"x0": x, "x1": x})
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    np.testing.assert_allclose(ys[1], x @ weights["linear1.weight_t"], rtol=1e-5, atol=1e-5)
    assert not np.allclose(ys[0], ys[1])  # distinct weight copies


def test_time_row_fields_and_order():
    row = OM.time_row(1, 32, 64, "int4a8_g32", threads=1, repeats=5)
    assert (row["m"], row["n"], row["k"], row["choice"]) == (1, 32, 64, "dense+int4a8_g32")
    assert row["accuracy_level"] == 4 and row["kernel"] == "MatMulNBits"
    assert OM.time_row(1, 32, 64, "int4_g32", threads=1, repeats=5)["accuracy_level"] == 0
    assert 0 < row["p10_us"] <= row["median_us"] <= row["p90_us"]
    assert OM.time_row(1, 32, 64, "fp32", threads=1, repeats=5)["accuracy_level"] is None


def test_copies_rotate_small_weights_only():
    fp32 = Choice.parse("fp32")
    assert OM.copies_for(576, 576, fp32) == OM.MAX_COPIES
    assert OM.copies_for(49152, 576, fp32) <= 2  # 113 MB: already far beyond the caches


def test_table_cached_readable_and_selected(tmp_path, monkeypatch):
    path = tmp_path / "table.json"
    wanted = [OM.row_key(1, 32, 64, "fp32"), OM.row_key(1, 32, 64, "int4a8_g32")]
    table = OM.measure_rows(wanted, threads=1, path=path, spinning=False)
    assert read_cost_table(path)["rows"] == table["rows"]  # schema v1 compatible
    assert table["includes_dispatch"] and table["runtime"] == "onnxruntime"
    monkeypatch.setattr(OM, "time_row", lambda *a, **k: pytest.fail("re-measured a cached row"))
    again = OM.measure_rows(wanted[:1], threads=1, path=path, spinning=False)
    assert len(again["rows"]) == 2
    # The weight-only format (accuracy_level 0) is a different row.
    with pytest.raises(Exception, match="lacks"):
        OM.select(again, [OM.row_key(1, 32, 64, "int4_g32")])
    # A table timed with spinning threads is another table: its rows are not reused.
    monkeypatch.undo()
    assert len(OM.measure_rows(wanted[:1], threads=1, path=path, spinning=True)["rows"]) == 1
    assert len(OM.select(again, wanted[1:])["rows"]) == 1
    write_cost_table(again, tmp_path / "copy.json")
    assert MeasuredTable.from_document(read_cost_table(tmp_path / "copy.json")).includes_dispatch


def test_cost_model_shares_packed_rows_without_extra_overhead():
    spec = ModelSpec.from_config(_TOY_CFG)
    target = get_target("xeon-8480")
    fp32 = Choice.parse("fp32")
    q = spec.layer("model.layers.0.self_attn.q_proj")
    packed_n = sum(l.out_features for l in spec.layers if l.fuse_group == q.fuse_group)
    o = spec.layer("model.layers.0.self_attn.o_proj")
    rows = [{"m": 1, "n": packed_n, "k": 64, "choice": "dense+fp32", "median_us": 100.0},
            {"m": 1, "n": 64, "k": 64, "choice": "dense+fp32", "median_us": 40.0}]
    wl = Workload(batch=1, input_len=8, output_len=4)
    cm = CostModel(spec, target, wl, measured={"rows": rows, "includes_dispatch": True})
    assert cm.layer_time(q, fp32).decode_s == pytest.approx(100e-6 * q.out_features / packed_n)
    assert cm.layer_time(o, fp32).decode_s == pytest.approx(40e-6)
    plain = CostModel(spec, target, wl, measured={"rows": rows})
    eff = family_efficiency(target)
    assert plain.layer_time(o, fp32).decode_s == pytest.approx(40e-6 + eff.kernel_s)


def test_kernel_rows_follow_the_manifest():
    from autoplan.backends.cpu.predict import kernel_rows

    spec = ModelSpec.from_config(_TOY_CFG)
    layers = {l.name: {"node": l.fuse_group, "columns": [0, 1]} if l.role in ("q", "k", "v")
              else {"node": l.name, "columns": None} for l in spec.layers}
    wl = {"concurrency": 2, "input_len": 8, "output_len": 4}
    int4 = {l.name: Choice.parse("int4a8_g32") for l in spec.layers}
    rows = kernel_rows(spec, wl, int4, {"layers": layers})
    q = spec.layer("model.layers.0.self_attn.q_proj")
    packed_n = sum(l.out_features for l in spec.layers if l.fuse_group == q.fuse_group)
    assert OM.row_key(2, packed_n, 64, "int4a8_g32") in rows  # decode, packed
    assert OM.row_key(16, packed_n, 64, "int4a8_g32") in rows  # prefill: 2 x 8 tokens
    assert OM.row_key(2, spec.vocab, 64, "int4a8_g32") in rows  # lm_head: decode m only
    assert OM.row_key(16, spec.vocab, 64, "int4a8_g32") not in rows
    gate = spec.layer("model.layers.0.mlp.gate_proj")
    assert OM.row_key(2, gate.out_features, 64, "int4a8_g32") in rows  # not packed here


def test_measured_non_gemm_replaces_fixed_decode_terms():
    spec = ModelSpec.from_config(_TOY_CFG)
    target = get_target("xeon-8480")
    wl = Workload(batch=1, input_len=8, output_len=4)
    analytic = CostModel(spec, target, wl)
    measured = CostModel(spec, target, wl, measured={"rows": [], "non_gemm_decode_s": 1e-3})
    assert measured.fixed_time().decode_s == pytest.approx(1e-3)
    assert measured.fixed_time().prefill_s == pytest.approx(analytic.fixed_time().prefill_s)
    with pytest.raises(Exception, match="non_gemm_decode_s"):
        MeasuredTable.from_document({"rows": [], "non_gemm_decode_s": 0})


def test_search_kernel_table_times_every_unit_choice_at_packed_width(monkeypatch):
    from types import SimpleNamespace

    from autoplan.backends.cpu import predict
    from autoplan.search import build_space

    spec = ModelSpec.from_config(_TOY_CFG)
    space = build_space(spec, get_target("xeon-8480"), "onnxruntime",
                        candidates=[Choice.parse("int4a8_g32"), Choice.parse("int8a8_g128")])
    seen = {}

    def fake_measure(rows, threads=None, **kw):
        seen["rows"], seen["spinning"] = rows, kw.get("spinning")
        return {"rows": [], "includes_dispatch": True}

    monkeypatch.setattr(OM, "measure_rows", fake_measure)
    wl = Workload(batch=2, input_len=8, output_len=4)  # batch 2: no non-GEMM step timing
    table = predict.search_kernel_table(SimpleNamespace(spec=spec), space, wl)
    assert table["non_gemm_decode_s"] is None and seen["spinning"] is True
    q = spec.layer("model.layers.0.self_attn.q_proj")
    packed_n = sum(l.out_features for l in spec.layers if l.fuse_group == q.fuse_group)
    for choice in ("fp32", "int4a8_g32", "int8a8_g128"):
        assert OM.row_key(2, packed_n, 64, choice) in seen["rows"]  # decode, packed q/k/v
        assert OM.row_key(16, packed_n, 64, choice) in seen["rows"]  # prefill chunk
        assert OM.row_key(2, spec.vocab, 64, choice) in seen["rows"]  # lm_head is searched
