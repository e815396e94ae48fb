"""The cost model on mixture-of-experts models: touched experts, memory, routing shares."""

from __future__ import annotations

import math

import pytest

from autoplan.cost import CostModel, resolve_config
from autoplan.cost.moe import Routing, touched
from autoplan.cost.operating import OperatingRequest, resolve_operating_point
from autoplan.errors import UserInputError
from autoplan.targets import get_target
from autoplan.workload import Workload


def _model(name: str, batch: int, routing: Routing | None = None, target: str = "h100",
           **kw) -> CostModel:
    wl = Workload(batch=batch, input_len=512, output_len=128)
    return CostModel(resolve_config(name), get_target(target), wl, routing=routing, **kw)


def test_expected_distinct_experts_uniform() -> None:
    spec = resolve_config("qwen3-30b-a3b")
    routing = Routing.uniform(spec)
    for batch in (1, 4, 64, 1024):
        expect = 128 * (1 - (1 - 8 / 128) ** batch)
        assert routing.expected_distinct(0, batch) == pytest.approx(expect)
    assert touched(0.0, 100) == 0.0 and touched(1.0, 3) == 1.0


def test_decode_reads_only_the_touched_experts_memory_counts_all() -> None:
    one, many = _model("mixtral-8x7b", 1), _model("mixtral-8x7b", 256)
    spec = one.spec
    experts = [la for la in spec.layers if la.expert >= 0]
    # at batch 1 a token reads top_k = 2 of 8 experts: a quarter of each expert on average
    assert one.decode_read_share(experts[0]) == pytest.approx(0.25)
    assert many.decode_read_share(experts[0]) == pytest.approx(1 - 0.75 ** 256)
    est1, est256 = one.evaluate("fp8_e4m3"), many.evaluate("fp8_e4m3")
    assert est1.memory.weights_bytes == pytest.approx(est256.memory.weights_bytes)
    assert est1.memory.weights_bytes > 46e9  # all 46.7 B parameters at ~1 byte
    # decode time of the experts: batch 1 reads ~1/4 of their bytes, batch 256 all of them
    t1 = sum(one.layer_time(la, one.resolve("fp8_e4m3")[0]).decode_s for la in experts)
    t256 = sum(many.layer_time(la, many.resolve("fp8_e4m3")[0]).decode_s for la in experts)
    assert 3.0 < t256 / t1 < 4.5
    assert est1.active_weight_bytes == pytest.approx(spec.active_params() * 1.0, rel=0.01)


def test_calibration_routing_changes_decode_not_memory() -> None:
    spec = resolve_config("mixtral-8x7b")
    # every block routes all tokens to experts 0 and 1: batch 64 touches 2 experts, not 8
    skewed = Routing.from_counts(spec, {b: [100, 100] + [0] * 6 for b in spec.moe.moe_blocks},
                                 tokens=100)
    even, hot = _model("mixtral-8x7b", 64), _model("mixtral-8x7b", 64, routing=skewed)
    assert hot.routing.expected_distinct(0, 64) == pytest.approx(2.0)
    assert even.routing.expected_distinct(0, 64) == pytest.approx(8 * (1 - 0.75 ** 64))
    e, h = even.evaluate("fp8_e4m3"), hot.evaluate("fp8_e4m3")
    assert h.metrics.decode_s < 0.6 * e.metrics.decode_s
    assert h.memory.weights_bytes == e.memory.weights_bytes
    assert Routing.from_counts(spec, {str(b): [1] * 8 for b in range(32)}, 4).source.startswith(
        "calibration")
    with pytest.raises(UserInputError, match="do not match"):
        Routing.from_counts(spec, {0: [1, 2]}, 3)


def test_step_times_stay_additive_over_layers() -> None:
    cm = _model("qwen3-30b-a3b", 32)
    choices = cm.resolve("fp8_e4m3")
    total = cm.fixed_time()
    for layer, c in zip(cm.spec.layers, choices):
        total = total + cm.layer_time(layer, c)
    step = cm.step_times("fp8_e4m3")
    assert step.decode_s == pytest.approx(total.decode_s, rel=1e-12)
    assert step.prefill_s == pytest.approx(total.prefill_s, rel=1e-12)
    assert "moe_routing" in cm.evaluate("fp8_e4m3").fixed


def test_prefill_reads_every_expert_and_runs_top_k_rows() -> None:
    """A 512-token prompt touches every Mixtral expert; its GEMMs are compute-bound on
    top_k / E of the rows, so expert prefill FLOPs equal a dense model's of the active size."""
    cm = _model("mixtral-8x7b", 8)
    layer = next(la for la in cm.spec.layers if la.expert == 0 and la.role == "expert_gate")
    t = cm.layer_time(layer, cm.resolve("fp8_e4m3")[0])
    rows = 8 * 512 * 2 / 8  # tokens x top_k / E
    flops = 2 * rows * layer.in_features * layer.out_features
    assert t.prefill_s > flops / (get_target("h100").peak("fp8") or math.inf)


def test_batch_max_and_slo_on_moe() -> None:
    spec, h200 = resolve_config("gpt-oss-20b"), get_target("h200")
    requests = {"max": OperatingRequest("max", 1000, 1000),
                "slo": OperatingRequest(None, 1000, 1000, tpot_s=0.030)}
    ops = {mode: resolve_operating_point(spec, h200, "fp8_e4m3", req,
                                         model_for=lambda wl: CostModel(spec, h200, wl))
           for mode, req in requests.items()}
    assert ops["max"].workload.batch > 1000  # windowed layers keep 128 tokens of KV
    assert 1 <= ops["slo"].workload.batch < ops["max"].workload.batch


def test_windowed_kv_cache_lets_gpt_oss_hold_more_sequences() -> None:
    cm = _model("gpt-oss-120b", 64, target="h200")  # 512 + 128 tokens per sequence
    mem = cm.memory(cm.resolve("fp8_e4m3"))
    per_layer_token = 2 * 8 * 64 * 2
    assert mem.kv_cache_bytes == 64 * per_layer_token * (18 * 640 + 18 * 128)
    assert mem.kv_cache_bytes == pytest.approx(0.6 * 64 * 640 * cm.spec.kv_bytes_per_token())


def test_estimate_keeps_routed_experts_dense_under_a_sparse_choice() -> None:
    """No engine runs grouped expert GEMMs on 2:4 weights: the search never offers it to
    experts, and `estimate` keeps them dense at the asked precision, saying so."""
    import json

    from click.testing import CliRunner

    from autoplan.cli import cli

    args = ["estimate", "--model", "qwen3-30b-a3b", "--target", "h100", "--precision", "fp8",
            "--sparsity", "2:4", "--runtime", "tensorrt-llm", "--breakdown", "--json"]
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["choice"] == "2:4+fp8_e4m3" and doc["routed_experts"] == "dense+fp8_e4m3"
    layers = doc["candidate"]["layers"]
    assert {la["choice"] for la in layers if ".experts." in la["name"]} == {"dense+fp8_e4m3"}
    assert {la["choice"] for la in layers if ".self_attn." in la["name"]} == {"2:4+fp8_e4m3"}
    assert "routed experts stay dense" in out.stderr
    dense = json.loads(CliRunner().invoke(cli, ["estimate", "--model", "mixtral-8x7b",
                                                "--target", "h100", "--precision", "fp8",
                                                "--json"]).stdout)
    assert "routed_experts" not in dense
