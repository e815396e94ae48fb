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
    # every block routes all tokens to experts 0 and 1: batch 64 touches ~2 experts, not 8
    # (the other six keep one pseudo-pick each in 20,008: 6 x 0.6 % of a step's reads)
    skewed = Routing.from_counts(spec, {b: [10_000, 10_000] + [0] * 6
                                        for b in spec.moe.moe_blocks}, tokens=10_000)
    even, hot = _model("mixtral-8x7b", 64), _model("mixtral-8x7b", 64, routing=skewed)
    assert hot.routing.expected_distinct(0, 64) == pytest.approx(2.04, abs=0.01)
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


def test_estimate_keeps_routed_experts_where_the_runtime_runs_them() -> None:
    """vLLM's CPU build has no quantized fused-MoE kernel (a rule about routed experts only):
    `estimate` prices their int8 as the search would plan it, experts at the baseline."""
    import json

    from click.testing import CliRunner

    from autoplan.cli import cli

    args = ["estimate", "--model", "mixtral-8x7b", "--target", "xeon-8480", "--runtime", "vllm",
            "--precision", "int8", "--breakdown", "--json"]
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["choice"] == "dense+int8" and doc["routed_experts"] == "dense+bf16"
    layers = doc["candidate"]["layers"]
    assert {la["choice"] for la in layers if ".experts." in la["name"]} == {"dense+bf16"}
    assert {la["choice"] for la in layers if ".self_attn." in la["name"]} == {"dense+int8"}
    assert "no quantized fused-MoE kernel" in out.stderr
    gpu = json.loads(CliRunner().invoke(cli, ["estimate", "--model", "mixtral-8x7b", "--target",
                                              "h100", "--runtime", "vllm", "--precision", "int8",
                                              "--json"]).stdout)
    assert "routed_experts" not in gpu  # vLLM on a GPU runs int8 fused-MoE


def test_an_expert_calibration_never_picked_is_still_read_at_large_batch() -> None:
    """One pseudo-pick per expert (Laplace's rule): shares sum to top_k, an unpicked expert's
    is small but not 0, and with top_k = E every share is exactly 1."""
    spec = resolve_config("mixtral-8x7b")
    counts = {b: [1024, 1024] + [0] * 6 for b in spec.moe.moe_blocks}
    shares = Routing.from_counts(spec, counts, tokens=1024).shares[0]
    assert sum(shares) == pytest.approx(2.0)
    assert shares[2] == pytest.approx(2 / (2048 + 8)) and shares[0] == pytest.approx(
        2 * 1025 / 2056)
    assert touched(shares[2], 1024) > 0.6  # read in most steps of a batch of 1,024
    import json

    from autoplan.cost.configs import bundled_configs
    from autoplan.modelspec import ModelSpec

    all_on = ModelSpec.from_config({**json.loads(bundled_configs()["mixtral-8x7b"]),
                                    "num_experts_per_tok": 8})  # top_k = E, as MoEfied e8k8
    every = Routing.from_counts(all_on, {b: [1024] * 8 for b in all_on.moe.moe_blocks}, 1024)
    assert set(every.shares[0]) == {1.0}


def test_timed_expert_rows_are_the_rows_the_cost_model_reads() -> None:
    """A local kernel table times each routed expert at the rows a picked expert gets in a
    decode step and in each prefill chunk (uniform routing): the cost model then prices the
    expert from those rows, at decode and in prefill, not from the roofline."""
    from autoplan.backends.cpu.predict import kernel_rows
    from autoplan.cost.model import PREFILL_CHUNK
    from autoplan.cost.moe import expert_overhead, expert_rows
    from autoplan.formats import Choice

    spec = resolve_config("mixtral-8x7b")
    choice = Choice.parse("int8")
    decisions = {layer.name: choice for layer in spec.layers}
    wl = {"concurrency": 8, "input_len": 512, "output_len": 128}
    rows = kernel_rows(spec, wl, decisions)
    expert = next(la for la in spec.layers if la.expert >= 0)
    timed_m = {m for m, n, k, _ in rows if (n, k) == (expert.out_features, expert.in_features)}
    share, chunk = 2 / 8, min(8 * 512, PREFILL_CHUNK)
    assert expert_rows(share, 8) == 2  # 8 x 1/4 rows over the 90 % chance it is picked
    assert {expert_rows(share, 8), expert_rows(share, chunk)} <= timed_m
    us = 12_345.0
    table = {"rows": [{"m": m, "n": n, "k": k, "choice": c, "median_us": us}
                      for m, n, k, c in rows]}
    plain = _model("mixtral-8x7b", 8, target="xeon-8480")
    timed = _model("mixtral-8x7b", 8, target="xeon-8480", measured=table)
    got, roofline = timed._expert_time(expert, choice), plain._expert_time(expert, choice)
    call = expert_overhead(timed.target, timed.eff, choice, timed._members)
    assert got.decode_s == pytest.approx(touched(share, 8) * us * 1e-6 + call)
    chunks = math.ceil(8 * 512 / chunk)
    assert got.prefill_s == pytest.approx(chunks * (touched(share, chunk) * us * 1e-6 + call))
    assert got.prefill_s > 10 * roofline.prefill_s  # the table, not the roofline


def test_estimate_memory_rows_add_up() -> None:
    """The printed memory is weights + KV cache + workspace, each a row of its own."""
    import re

    from click.testing import CliRunner

    from autoplan.cli import cli

    out = CliRunner().invoke(cli, ["estimate", "--model", "qwen3-30b-a3b", "--target", "h200",
                                   "--precision", "fp8", "--batch", "max"])
    assert out.exit_code == 0, out.output

    def row(label: str) -> list[float]:
        line = next(x for x in out.stdout.splitlines() if re.search(rf"│ +{label} +│", x))
        return [float(v.replace(",", "")) for v in re.findall(r"[\d,]+\.\d+", line)]

    total = row("memory GB")
    parts = [row(label) for label in ("weights GB", "KV cache GB", "workspace GB")]
    for side in range(2):
        assert total[side] == pytest.approx(sum(p[side] for p in parts), abs=0.015)


def test_estimate_prints_small_rates_to_three_significant_digits() -> None:
    """Mixtral on one Xeon decodes a few tokens a second: "7.1 | 6.8 | 1.05x", not "7 | 7"."""
    import re

    from click.testing import CliRunner

    from autoplan.cli import cli

    out = CliRunner().invoke(cli, ["estimate", "--model", "mixtral-8x7b", "--target",
                                   "xeon-8480", "--runtime", "vllm", "--precision", "int8"])
    assert out.exit_code == 0, out.output
    line = next(x for x in out.stdout.splitlines() if "decode tokens/s" in x)
    cand, base = re.findall(r"(?<=│) +([\d,.]+) +(?=│)", line)[:2]
    assert re.fullmatch(r"\d\.\d\d", cand) and re.fullmatch(r"\d\.\d\d", base), line


def test_estimate_warns_of_a_request_longer_than_the_models_context() -> None:
    from click.testing import CliRunner

    from autoplan.cli import cli

    args = ["estimate", "--model", "mixtral-8x7b", "--target", "h200", "--precision", "fp8"]
    long = CliRunner().invoke(cli, [*args, "--input-len", "32760", "--output-len", "10"])
    assert long.exit_code == 0, long.output
    assert "32,770 tokens is longer than the model's context, max_position_embeddings 32,768" \
        in long.stderr
    fits = CliRunner().invoke(cli, [*args, "--input-len", "32758", "--output-len", "10"])
    assert fits.exit_code == 0 and "max_position_embeddings" not in fits.stderr
    assert resolve_config("mixtral-8x7b").max_context == 32_768
