"""The cost model against published measurements (autoplan/data/measurements.toml)."""

from __future__ import annotations

from functools import cache

from autoplan.cost.report import Memory
from autoplan.cost.validate import _max_batch, _side, kv_pool_fits, load_measurements, validate

# Every point is predicted once per run of the module (152 points with their hold-outs).
report_once = cache(validate)


def test_measurements_are_complete() -> None:
    points = load_measurements()
    assert len(points) >= 15
    for p in points:
        assert p["source"] and p["published"] > 0 and p["metric"]
        assert p["candidate"]["target"] and p["baseline"]["target"]


def test_ort_mlas_table_is_whole_and_block_128() -> None:
    """ORT-24491's AVX512-VNNI table: all eight M x N x K rows, block 128 on both sides (the
    BlkLen its harness, bench_qnbitgemm.cpp, sweeps), published = 8-bit ns / 4-bit ns."""
    rows = [p for p in load_measurements() if p["source"] == "ORT-24491"]
    shapes = {(p["m"], p["n"], p["k"]) for p in rows}
    assert shapes == {(m, n, k) for m in (1, 4096) for n in (4096, 11008) for k in (4096, 11008)}
    assert all(p["candidate"]["choice"] == "int4a8_g128" and p["baseline"]["choice"] == "int8a8_g128"
               for p in rows)
    assert next(p for p in rows if (p["m"], p["n"], p["k"]) == (1, 4096, 4096))["published"] == \
        round(34145 / 27723, 3)


def test_every_point_cites_a_reference_once() -> None:
    from autoplan.targets import load_references

    points, refs = load_measurements(), load_references()
    assert len({p["id"] for p in points}) == len(points)
    assert {p["source"] for p in points} <= set(refs)


def test_trtllm_v017_table_is_whole() -> None:
    """TRT-PO-017: every TP 1 entry on a catalog GPU against its row's H100 FP8 entry (8B and
    Mistral 7B: H200, L40S, A100 x 9 rows; 70B: H200 x the 7 rows with an H100 entry), each
    published ratio the quotient of the two tok/s its `assumed` field quotes."""
    rows = [p for p in load_measurements() if p["source"] == "TRT-PO-017"
            and not p["id"].startswith("M0-")]  # the MoE rows: test_moe_points_follow_the_rule
    assert len(rows) == 2 * 3 * 9 + 7
    assert all(p["baseline"] == {"target": "h100-sxm", "choice": "fp8_e4m3", "kv_bytes": 1}
               and not p.get("tuned", True) for p in rows)
    for p in rows:
        cand, base = (float(x.replace(",", "")) for x in
                      p["assumed"].rsplit("; ", 1)[1].removesuffix(" tok/s").split(" / "))
        assert p["published"] == round(cand / base, 3), p["id"]


def _quoted(point: dict) -> float:
    """The published ratio recomputed from the two tok/s the point's `assumed` quotes."""
    cand, base = (float(x.replace(",", "")) for x in
                  point["assumed"].rsplit("; ", 1)[1].removesuffix(" tok/s").split(" / "))
    return round(cand / base, 3)


def test_moe_points_follow_the_rule() -> None:
    """The 57 MoE points (issue 26's rule, fixed before predicting): Mixtral TP1 H200 / H100
    and vs Mistral 7B per GPU (v0.17 table), Qwen3-30B-A3B TP1 FP4 GB200 / B200 and vs Llama
    3.3 70B per GPU; every one out of sample, each ratio the quotient of its quoted tok/s."""
    rows = [p for p in load_measurements() if p["id"].startswith(("M0-", "M1-"))]
    assert len(rows) == 9 + 18 + 10 + 20
    assert all(not p["tuned"] for p in rows)
    for p in rows:
        assert p["published"] == _quoted(p), p["id"]
    cross = [p for p in rows if "-vs-" in p["id"]]
    assert len(cross) == 38 and all(p["baseline"]["model"] in ("mistral-7b-v0.3", "llama-3.1-70b")
                                    and p["candidate"]["target"] == p["baseline"]["target"]
                                    for p in cross)
    report = report_once()
    moe = [p for p in report.points if p.moe]
    assert {p.id for p in moe} == {p["id"] for p in rows}
    assert all(p.predicted is not None for p in moe)


def test_mape_within_bound() -> None:
    report = report_once()
    evaluated = [p for p in report.points if p.predicted is not None]
    assert len(evaluated) >= 15
    assert report.mape <= 0.25, report.to_json()


def test_points_out_of_sample_and_leave_one_family_out() -> None:
    """Some points are kept out of sample (added after the constants were set, `tuned =
    false`), and each in-sample point is also predicted with its families' constants
    replaced by the other families' median: three MAPEs, reported apart."""
    from autoplan.cost.efficiency import _FAMILIES, family_efficiency, replaced_family, transfer_row
    from autoplan.targets import get_target

    report = report_once()
    held_out = [p for p in report.points if not p.tuned and p.predicted is not None]
    assert len(held_out) >= 10 and len(report.points) >= 40
    assert not any(p.lofo for p in held_out)  # out-of-sample points need no hold-out
    assert report.mape_in_sample <= 0.15, report.to_json()
    assert report.mape_out_of_sample <= 0.25, report.to_json()
    assert report.mape_lofo <= 0.16, report.to_json()
    assert {"hopper", "ampere", "blackwell"} <= set(report.lofo_by_family())
    # the hold-out really moves the prediction, and restores the family's own row after
    point = next(p for p in report.points if p.id == "F1-llama2-7b-fp8-bs1")
    assert point.lofo["hopper"] != point.predicted
    h100 = get_target("h100")
    row = transfer_row("hopper")
    assert row is not None and row.family == "hopper"
    assert "hopper" not in row.evidence.split(": ")[1]
    with replaced_family("hopper", row):
        assert family_efficiency(h100) is row
    assert family_efficiency(h100) is _FAMILIES["hopper"]
    assert transfer_row("cpu") is None  # no other CPU family to borrow from


def test_kv_pool_rules() -> None:
    """vLLM budgets 0.90 of the device for weights + KV + workspace; TensorRT-LLM gives the KV
    pool a share of what is FREE after weights and workspace (kv_cache_free_gpu_mem_fraction)."""
    device = 100e9
    def memory(kv: float) -> Memory:
        return Memory(50e9, kv, 0.0, device * 0.90)

    assert kv_pool_fits(memory(40e9), device, None) and kv_pool_fits(memory(40e9), device, 0.90)
    # 44 GB: over vLLM's 90 GB budget (50 + 44), within 0.90 x the 50 GB left free
    assert not kv_pool_fits(memory(44e9), device, None)
    assert kv_pool_fits(memory(44e9), device, 0.90)
    assert not kv_pool_fits(memory(46e9), device, 0.90)
    assert not kv_pool_fits(Memory(120e9, 1.0, 0.0, device * 0.9), device, 0.90)  # weights alone


def test_tensorrt_points_size_their_batch_by_the_free_memory_rule() -> None:
    point = next(p for p in load_measurements() if p["id"] == "P1-70b-b200fp4-h200fp8-128-2048")
    side = _side(point, "baseline")  # H200, Llama-70B FP8 weights, FP8 KV, 128 + 2048 tokens
    assert side["kv_pool_fraction"] == 0.90
    trt = _max_batch(point["model"], side)
    vllm = _max_batch(point["model"], {k: v for k, v in side.items() if k != "kv_pool_fraction"})
    assert trt > vllm > 0
