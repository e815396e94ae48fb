"""Operating points (`--batch max`, TTFT/TPOT SLOs) and CPU node layouts: bisection equals a
linear scan of the cost model, refusals carry the numbers, fleet sizes memory domains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoplan.cli import cli
from autoplan.cost import CostModel, resolve_config
from autoplan.cost.operating import NoOperatingPoint, OperatingRequest, resolve_operating_point
from autoplan.errors import UnknownNameError, UserInputError
from autoplan.fleet import size_fleet
from autoplan.nodes import INTERLEAVED_FACTOR, node_layout
from autoplan.targets import get_target
from autoplan.workload import Workload


def _scan(spec, target, ok, hi: int) -> int:  # noqa: ANN001
    best = 0
    for b in range(1, hi + 1):
        if ok(b):
            best = b
    return best


def test_batch_max_and_slo_equal_a_linear_scan() -> None:
    spec, target = resolve_config("llama-3.1-8b"), get_target("l40s")
    at = lambda b: CostModel(spec, target, Workload(batch=b, input_len=2048,  # noqa: E731
                                                        output_len=512))
    point = resolve_operating_point(spec, target, "fp8_e4m3", OperatingRequest("max", 2048, 512))
    cap = _scan(spec, target, lambda b: at(b).memory(at(b).resolve("fp8_e4m3")).fits, 400)
    assert 1 < cap < 400 and point.workload.batch == cap and point.bound == "memory"
    slo = OperatingRequest(None, 2048, 512, ttft_s=2.0, tpot_s=0.03)
    point = resolve_operating_point(spec, target, "fp8_e4m3", slo)

    def meets(b: int) -> bool:
        t = at(b).step_times("fp8_e4m3")
        return t.prefill_s <= 2.0 and t.decode_s <= 0.03

    assert point.workload.batch == _scan(spec, target, meets, cap) > 1
    assert point.bound in ("ttft", "tpot") and point.mode == "slo"
    # a smaller format fits more sequences
    bf16 = resolve_operating_point(spec, target, None, OperatingRequest("max", 2048, 512))
    assert bf16.workload.batch < cap


def test_refusals_name_the_numbers() -> None:
    spec = resolve_config("llama-3.1-70b")
    with pytest.raises(NoOperatingPoint, match="nothing fits on h100-sxm.*141") as exc:
        resolve_operating_point(spec, get_target("h100"), None, OperatingRequest("max"))
    assert exc.value.needed_bytes > exc.value.usable_bytes
    with pytest.raises(NoOperatingPoint, match="TPOT .* > 0.001 ms"):
        resolve_operating_point(resolve_config("llama-3.1-8b"), get_target("h100"), None,
                                OperatingRequest(None, tpot_s=1e-6))
    with pytest.raises(UserInputError, match="leave --batch out"):
        OperatingRequest(8, ttft_s=0.5)
    with pytest.raises(UserInputError, match="integer or 'max'"):
        OperatingRequest.parse("many", input_len=8, output_len=8)
    assert OperatingRequest.parse(None, input_len=8, output_len=4).fixed().batch == 32


def test_estimate_cli_batch_max_and_slo() -> None:
    runner = CliRunner()
    res = runner.invoke(cli, ["estimate", "--model", "llama-3.1-8b", "--target", "h100",
                              "--precision", "fp8_e4m3", "--batch", "max", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output[res.output.index("{"):])
    points = doc["operating_point"]
    assert points["candidate"]["batch"] > points["baseline"]["batch"]  # fp8 fits more
    assert doc["candidate"]["workload"]["batch"] == points["candidate"]["batch"]
    res = runner.invoke(cli, ["estimate", "--model", "llama-3.1-70b", "--target", "h100",
                              "--batch", "max"])
    assert res.exit_code == 2 and "nothing fits" in res.output and "Traceback" not in res.output


def test_cpu_nodes_and_layouts() -> None:
    xeon = get_target("xeon-8480")
    assert xeon.node.sockets == 2 and xeon.node.threads_per_core == 2
    socket = node_layout(xeon)
    assert socket.name == "socket" and socket.domains == 2 and socket.target == xeon
    assert socket.node_price_per_hour == pytest.approx(2 * xeon.price_per_hour.value)
    assert "membind" in socket.runtime_must and "56 threads" in socket.runtime_must
    span = node_layout(xeon, "spanning")
    assert span.domains == 1 and span.target.bandwidth == pytest.approx(2 * xeon.bandwidth)
    assert span.target.memory_bytes == pytest.approx(2 * xeon.memory_bytes)
    inter = node_layout(xeon, "interleaved")
    assert inter.target.bandwidth == pytest.approx(2 * xeon.bandwidth * INTERLEAVED_FACTOR)
    assert node_layout(get_target("h100")).name == "device"
    with pytest.raises(UnknownNameError):
        node_layout(xeon, "sideways")
    with pytest.raises(UnknownNameError):
        node_layout(get_target("h100"), "spanning")


def test_fleet_counts_memory_domains() -> None:
    kw = dict(weight_bytes=1e9, kv_bytes_per_token=1e5, node_memory_bytes=512e9, batch=4,
              input_len=512, output_len=128, ttft_s=0.1, tpot_s=0.01, qps=5, p99_s=10,
              price_per_hour=10.0)
    one, two = size_fleet(**kw), size_fleet(**kw, domains=2)
    assert two.replicas_per_node == 2 * one.replicas_per_node
    assert two.node_throughput_tok_s == pytest.approx(2 * one.node_throughput_tok_s)
    assert any(s.label == "replicas per memory domain" for s in two.steps)


def test_fleet_cli_layout_and_batch_max(tmp_path: Path) -> None:
    plan = tmp_path / "p.json"
    layer = "model.layers.0.mlp.down_proj"
    plan.write_text(json.dumps({"decisions": {layer: "dense+int8a8_g128"}}))
    args = ["fleet", "--plan", str(plan), "--model", "smollm2-135m", "--node", "xeon-8480",
            "--qps", "2", "--p99-ms", "60000", "--json"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["layout"]["layout"] == "socket" and doc["plan"]["replicas_per_node"] == 2
    res = CliRunner().invoke(cli, args + ["--layout", "spanning", "--batch", "max"])
    doc = json.loads(res.output)
    assert doc["layout"]["domains"] == 1 and doc["operating_point"]["plan"]["mode"] == "max"


_70B_MODES = [["--batch", "max"], ["--ttft-ms", "2000", "--tpot-ms", "50"], ["--batch", "4"]]


@pytest.mark.parametrize("target", ["h100", "h200"])
@pytest.mark.parametrize("mode", _70B_MODES, ids=["max", "slo", "fixed"])
def test_70b_fp8_on_one_gpu_is_not_blocked_by_its_baseline(target: str, mode: list[str]) -> None:
    """bf16 Llama-3.1-70B (141 GB) fits neither GPU; FP8 (72 GB) fits both: the candidate is
    evaluated and the baseline is a "does not fit" column with its bytes."""
    res = CliRunner().invoke(cli, ["estimate", "--model", "llama-3.1-70b", "--target", target,
                                   "--precision", "fp8", *mode, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["candidate"]["memory"]["fits"] and doc["candidate"]["metrics"]["throughput"] > 0
    assert doc["baseline"]["status"] == "does not fit" and not doc["baseline"]["memory"]["fits"]
    assert doc["baseline"]["memory"]["weights_bytes"] > 140e9 and doc["speedup"] == {}
    assert "needs 14" in doc["baseline"]["reason"]  # 141-142 GB, with the usable bytes
    assert "baseline dense+bf16 does not fit: at batch" in res.stderr
    table = CliRunner().invoke(cli, ["estimate", "--model", "llama-3.1-70b", "--target",
                                     target, "--precision", "fp8", *mode])
    assert table.exit_code == 0 and "(does not fit)" in table.stdout


def test_a_baseline_that_misses_the_slo_does_not_block() -> None:
    res = CliRunner().invoke(cli, ["estimate", "--model", "llama-3.1-8b", "--target", "h100",
                                   "--precision", "fp8", "--tpot-ms", "5", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["baseline"]["status"] == "misses the SLO"
    assert doc["operating_point"]["candidate"]["batch"] >= 1


@pytest.mark.parametrize("node", ["h100", "h200"])
@pytest.mark.parametrize("mode", _70B_MODES, ids=["max", "slo", "fixed"])
def test_fleet_sizes_the_70b_fp8_plan_when_bf16_does_not_fit(tmp_path: Path, node: str,
                                                            mode: list[str]) -> None:
    spec = resolve_config("llama-3.1-70b")
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps({"decisions": {la.name: "dense+fp8_e4m3" for la in spec.layers}}))
    res = CliRunner().invoke(cli, ["fleet", "--plan", str(plan), "--model", "llama-3.1-70b",
                                   "--node", node, "--qps", "2", "--p99-ms", "60000", *mode,
                                   "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["plan"]["nodes"] >= 1 and doc["baseline"]["nodes"] is None
    assert doc["baseline"]["reason"].startswith("does not fit:")
    assert "GB is usable on" in doc["baseline"]["reason"]
    assert doc["operating_point"]["baseline"]["status"] == "does not fit"


_70B_CONFIG = str(Path(__file__).resolve().parents[2] / "autoplan/data/configs/llama-3.1-70b.json")


@pytest.mark.parametrize("target", ["h100", "h200"])
@pytest.mark.parametrize("mode", ["max", "slo", "fixed"])
def test_search_plans_the_70b_on_one_gpu_with_the_formats_that_fit(target: str, mode: str) -> None:
    """search and compare resolve the operating point in preflight: a bf16 baseline that does
    not fit leaves the formats whose uniform recipe fits (FP8 here), at that recipe's batch."""
    from autoplan.backends.registry import resolve_target
    from autoplan.search import SearchRequest
    from autoplan.search.request import fits_reference, operating_point

    op = {"max": OperatingRequest.parse("max", input_len=512, output_len=128),
          "slo": OperatingRequest.parse(None, input_len=512, output_len=128, ttft_ms=2000,
                                        tpot_ms=50), "fixed": None}[mode]
    req = SearchRequest(model=_70B_CONFIG, target=target, operating=op,
                        workload=Workload(batch=4, input_len=512, output_len=128))
    point, unfit = operating_point(req, resolve_target(target), "vllm")
    assert unfit is not None and unfit.baseline == "dense+bf16"
    assert unfit.needed_bytes > 140e9 > unfit.usable_bytes
    assert unfit.reference.startswith("dense+fp8")
    assert "does not fit" in unfit.describe(target) and "GB is usable" in unfit.describe(target)
    assert (point is None) == (mode == "fixed")
    if point is not None:
        assert point.workload.batch >= 1
    from autoplan.formats import Choice

    assert not fits_reference(Choice.parse("dense+bf16"), unfit.reference)
    assert fits_reference(Choice.parse("dense+int4_g128"), unfit.reference)
    assert fits_reference(Choice.parse("2:4+fp8_e4m3"), unfit.reference)


def test_when_nothing_fits_the_search_says_so_with_both_sizes() -> None:
    from autoplan.backends.registry import resolve_target
    from autoplan.search import SearchRequest
    from autoplan.search.request import operating_point

    long = OperatingRequest.parse("max", input_len=200_000, output_len=128)  # 65 GB of KV
    req = SearchRequest(model=_70B_CONFIG, target="h100", operating=long)
    with pytest.raises(NoOperatingPoint, match="nothing fits on h100-sxm at batch 1: the "
                       "uncompressed model needs 20[0-9.]+ GB and even") as exc:
        operating_point(req, resolve_target("h100"), "vllm")
    assert exc.value.needed_bytes > exc.value.usable_bytes
