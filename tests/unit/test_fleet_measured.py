"""Fleet sizing from a measured capacity curve, against cases computed by hand; both serving
benchmarks' result formats; `autoplan fleet --measured` side by side with the analytic queue."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoplan.cli import cli
from autoplan.errors import UserInputError
from autoplan.fleet_measured import read_capacity_curves, size_fleet_measured, this_machine


def _pt(rate, thr, ttft_ms, tpot_ms, e2el_ms=None) -> dict:
    doc = {"request_rate": rate, "completed": 24, "duration_s": 10.0,
           "request_throughput": thr, "output_throughput": thr * 11, "ttft_p50_ms": ttft_ms / 2,
           "ttft_p99_ms": ttft_ms, "tpot_p50_ms": tpot_ms / 2, "tpot_p99_ms": tpot_ms}
    if e2el_ms is not None:
        doc["e2el_p99_ms"] = e2el_ms
    return doc


# One node: 1 req/s and 2 req/s kept up with; 4 req/s fell behind (3.0 achieved < 0.8 x 4)
BASE = [_pt(1, 1.0, 100, 40, e2el_ms=500), _pt(2, 1.98, 200, 60, e2el_ms=800),
        _pt(4, 3.0, 900, 300, e2el_ms=4000)]
# No e2el: p99 latency = TTFT p99 + (11 - 1) x TPOT p99
PLAN = [_pt(2, 2.0, 100, 30), _pt(4, 3.9, 150, 50), _pt(8, 7.5, 300, 100)]


def _write(tmp_path: Path, points: list[dict], name: str = "curve.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"workload": {"input_len": 100, "output_len": 11},
                                "sides": {"baseline": {"points": points}}}))
    return path


def _serve_vllm(tmp_path: Path, machine: dict | None = None) -> Path:
    path = tmp_path / "serve_vllm.json"
    path.write_text(json.dumps({"workload": {"input_len": 100, "output_len": 11},
                                "machine": machine or this_machine(),
                                "sides": {"baseline": {"points": BASE},
                                          "plan": {"points": PLAN}}}))
    return path


def _serve_llamacpp(tmp_path: Path, machine: dict | None = None) -> Path:
    # llamacpp_serve.py: sides hold the decode sweep (no points); the curves are in serving
    path = tmp_path / "serve_llamacpp.json"
    doc = {"workload": {"input_len": 100, "output_len": 11},
           "sides": {"original": {"kl": 0.0}, "plan_tpot": {"kl": 0.01}},
           "serving": {"original": {"points": BASE}, "plan_tpot": {"points": PLAN}}}
    if machine != {}:
        doc["machine"] = machine or this_machine()
    path.write_text(json.dumps(doc))
    return path


def test_hand_computed_case(tmp_path):
    """Baseline, SLA 1 s, 7 req/s:
    rate 1: achieved 1.0 >= 0.8, p99 e2el 0.5 s <= 1 -> holds
    rate 2: achieved 1.98 >= 1.6, p99 0.8 s -> holds
    rate 4: achieved 3.0 < 3.2 -> fell behind
    r* = 2 req/s -> 22 tok/s; nodes = ceil(7 / 2) = 4; utilization 7 / 8 = 0.875
    $/month = 4 x 0.5 x 730 = 1460; $/1M = 4 x 0.5 / (7 x 11 x 3600) x 1e6 = 7.2150
    """
    curves = read_capacity_curves(_write(tmp_path, BASE))
    r = size_fleet_measured(curves.side("baseline"), qps=7, p99_s=1.0, output_len=11,
                            price_per_hour=0.5)
    assert r.node_capacity_rps == 2 and r.node_throughput_tok_s == 22
    assert r.nodes == 4 and r.p99_s == pytest.approx(0.8)
    assert r.utilization == pytest.approx(0.875)
    assert r.usd_per_month == pytest.approx(1460)
    assert r.usd_per_million_tokens == pytest.approx(7.2150, rel=1e-4)
    assert [s.formula.rsplit(": ", 1)[1] for s in r.steps[:3]] == [
        "holds", "holds", "fell behind"]


def test_without_e2el_the_latency_is_ttft_plus_decode_p99(tmp_path):
    """Plan, SLA 1 s: rate 2: 0.1 + 10 x 0.03 = 0.4 s; rate 4: 0.15 + 10 x 0.05 = 0.65 s;
    rate 8: 0.3 + 10 x 0.1 = 1.3 s > 1 -> r* = 4; 7 req/s -> ceil(1.75) = 2 nodes;
    an exact multiple (8 req/s) -> 2 nodes, not 3."""
    plan = read_capacity_curves(_write(tmp_path, PLAN)).side("baseline")
    r = size_fleet_measured(plan, qps=7, p99_s=1.0, output_len=11, price_per_hour=1.0)
    assert r.node_capacity_rps == 4 and r.nodes == 2
    assert r.p99_s == pytest.approx(0.65)
    assert "TTFT p99 + (out-1) x TPOT p99" in r.steps[0].formula
    assert size_fleet_measured(plan, qps=8, p99_s=1.0, output_len=11,
                               price_per_hour=1.0).nodes == 2


def test_no_rate_within_the_sla_is_infeasible_not_an_error(tmp_path):
    plan = read_capacity_curves(_write(tmp_path, PLAN)).side("baseline")
    r = size_fleet_measured(plan, qps=7, p99_s=0.3, output_len=11, price_per_hour=1.0)
    assert r.nodes is None and "no measured rate holds" in r.reason


def test_rate_inf_counts_its_achieved_throughput(tmp_path):
    pts = read_capacity_curves(_write(tmp_path, [_pt(math.inf, 5.0, 100, 20, e2el_ms=600)])).side(
        "baseline")
    r = size_fleet_measured(pts, qps=12, p99_s=1.0, output_len=11, price_per_hour=1.0)
    assert r.node_capacity_rps == 5 and r.nodes == 3


def test_reads_both_serving_benchmarks(tmp_path):
    vllm = read_capacity_curves(_serve_vllm(tmp_path))
    llama = read_capacity_curves(_serve_llamacpp(tmp_path))
    assert set(vllm.sides) == {"baseline", "plan"} and vllm.output_len == 11
    assert set(llama.sides) == {"original", "plan_tpot"}
    assert llama.side("plan_tpot") == vllm.side("plan")


def test_bad_files_are_one_line(tmp_path):
    with pytest.raises(UserInputError, match="cannot read"):
        read_capacity_curves(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(UserInputError, match="not JSON"):
        read_capacity_curves(tmp_path / "x.json")
    (tmp_path / "y.json").write_text(json.dumps({"plans": {}}))
    with pytest.raises(UserInputError, match="no capacity curve"):
        read_capacity_curves(tmp_path / "y.json")
    with pytest.raises(UserInputError, match="no side 'nope'"):
        read_capacity_curves(_serve_vllm(tmp_path)).side("nope")


def _plan(tmp_path: Path, choice: str = "q8_0") -> Path:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"model_id": "smollm2-135m", "decisions": {"lm_head": choice}}))
    return path


def test_cli_prints_analytic_and_measured_side_by_side(tmp_path):
    args = ["fleet", "--plan", str(_plan(tmp_path)), "--model", "smollm2-135m", "--node",
            "local", "--qps", "7", "--p99-ms", "1000", "--measured", str(_serve_llamacpp(tmp_path))]
    res = CliRunner().invoke(cli, [*args, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["workload"]["input_len"] == 100 and doc["workload"]["output_len"] == 11
    assert doc["measured"]["sides"] == {"baseline": "original", "plan": "plan_tpot"}
    assert doc["measured"]["baseline"]["nodes"] == 4 and doc["measured"]["plan"]["nodes"] == 2
    assert doc["plan"]["steps"][0]["label"] == "memory per replica"  # the analytic side too
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert "baseline measured" in res.output and "plan analytic" in res.output


def test_cli_refuses_a_workload_the_curve_was_not_measured_at(tmp_path):
    res = CliRunner().invoke(cli, ["fleet", "--plan", str(_plan(tmp_path, "int8")), "--node",
                                   "local", "--qps", "7", "--p99-ms", "1000", "--output-len", "64",
                                   "--measured", str(_serve_vllm(tmp_path))])
    assert res.exit_code == 2
    assert "--output-len 64 differs from the measured workload's 11" in res.output
    assert "Traceback" not in res.output
    res = CliRunner().invoke(cli, ["fleet", "--plan", str(_plan(tmp_path, "int8")), "--node",
                                   "local", "--qps", "7", "--p99-ms", "1000", "--measured-sides", "a,b",
                                   "--measured", str(_serve_vllm(tmp_path))])
    assert res.exit_code == 2 and "no side 'a'" in res.output


def _fleet(plan: Path, node: str, measured: Path | None = None, *extra: str):  # noqa: ANN202
    args = ["fleet", "--plan", str(plan), "--model", "smollm2-135m", "--node", node, "--qps",
            "2", "--p99-ms", "60000", *extra]
    return CliRunner().invoke(cli, args + (["--measured", str(measured)] if measured else []))


def test_a_curve_from_another_machine_or_engine_is_refused(tmp_path):
    """The committed llama.cpp curve (a 2-core VM) once sized Xeon 8480 nodes, and a vLLM
    curve an ONNX Runtime plan, without a word."""
    committed = Path(__file__).resolve().parents[2] / "benchmarks/results/serve_llamacpp.json"
    res = _fleet(_plan(tmp_path), "xeon-8480", committed)
    assert res.exit_code == 2, res.output
    assert "not --node xeon-8480" in res.stderr and "AMD EPYC" in res.stderr
    res = _fleet(_plan(tmp_path), "local",
                 _serve_llamacpp(tmp_path, {"cpu": "Intel Xeon Platinum 8480+", "cores": 224}))
    assert res.exit_code == 2 and "measured on another machine" in res.stderr, res.output
    res = _fleet(_plan(tmp_path), "local", _serve_llamacpp(tmp_path, {}))
    assert res.exit_code == 2 and "does not record the machine" in res.stderr
    # a CPU plan for ONNX Runtime against vLLM's curve
    plans = Path(__file__).resolve().parents[2] / "benchmarks/results/cpu_plans"
    res = _fleet(plans / "int8_kl0.05.json", "local", _serve_vllm(tmp_path))
    assert res.exit_code == 2 and "curve is vllm's" in res.stderr and "onnxruntime" in res.stderr
    # a curve measured on a real Xeon 8480 sizes xeon-8480 nodes
    res = _fleet(_plan(tmp_path), "xeon-8480",
                 _serve_llamacpp(tmp_path, {"cpu": "Intel(R) Xeon(R) Platinum 8480+",
                                            "cores": 224}), "--json")
    assert res.exit_code == 0, res.output


def test_fleet_says_where_the_plan_was_searched_and_refuses_what_the_node_cannot_run(tmp_path):
    plans = Path(__file__).resolve().parents[2] / "benchmarks/results/cpu_plans"
    res = _fleet(plans / "int8_kl0.05.json", "xeon-8480", None, "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["searched_for"] == {"target": "local", "runtime": "onnxruntime"}
    assert "searched for local, not xeon-8480" in doc["notes"][0]
    assert "note: the plan was searched for local" in res.stderr
    # an H100 / vLLM plan on a Xeon node: FP8 is refused, naming the runtime and the fix
    gpu = json.loads((plans / "int8_kl0.05.json").read_text())
    gpu = {**gpu, "target": {**gpu["target"], "name": "h100-sxm"},
           "runtime": {"name": "vllm", "version": "0.32"},
           "decisions": dict.fromkeys(gpu["decisions"], "dense+fp8_e4m3")}
    (tmp_path / "gpu.json").write_text(json.dumps(gpu))
    res = _fleet(tmp_path / "gpu.json", "xeon-8480")
    assert res.exit_code == 2, res.output
    assert "cannot run 211 planned layer(s)" in res.stderr
    assert "re-plan with `autoplan search --target xeon-8480`" in res.stderr


def test_the_local_runtime_version_is_the_installed_one(tmp_path):
    from importlib.metadata import version

    plans = Path(__file__).resolve().parents[2] / "benchmarks/results/cpu_plans"
    res = _fleet(plans / "int8_kl0.05.json", "local", None, "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["runtime"] == {"name": "onnxruntime", "version": version("onnxruntime")}
    res = _fleet(plans / "int8_kl0.05.json", "xeon-8480", None, "--json")
    assert json.loads(res.stdout)["runtime"]["version"] == "1.22"  # the catalog's, elsewhere
