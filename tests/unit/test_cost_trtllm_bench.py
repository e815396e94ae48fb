"""trtllm-bench's own engine settings (autoplan/cost/trtllm_bench.py) and their use by the
validation (prefill steps of whole prompts within max_num_tokens, batch <= max_batch_size)."""

from __future__ import annotations

import pytest

from autoplan.cost import validate as validate_module
from autoplan.cost.configs import resolve_config
from autoplan.cost.model import PREFILL_CHUNK, CostModel
from autoplan.cost.trtllm_bench import (
    BenchSettings,
    bench_settings,
    checkpoint_elements,
    finetune_setting,
)
from autoplan.cost.validate import _bench, _max_batch, _prefill_chunk, _side, load_measurements
from autoplan.errors import UnsupportedFormatError, UserInputError
from autoplan.formats import Choice
from autoplan.targets import get_target
from autoplan.workload import Workload

FP8, NVFP4 = Choice.parse("fp8_e4m3"), Choice.parse("nvfp4")


@pytest.mark.parametrize(("requests", "isl", "osl", "expected"), [
    # raw_bs < 256: 32-multiples, at least 64; raw_token < 4096: 256-multiples, at least 2048
    (40.0, 128, 128, (64, 2048)),
    (200.0, 1000, 1000, (224, 2048)),
    # 256 <= raw_bs < 1024: 128-multiples
    (900.8, 128, 2048, (1024, 2048)),
    (260.0, 2048, 2048, (384, 2048)),
    # raw_bs >= 1024: 256-multiples; 4096 <= raw_token < 8192: 512-multiples
    (3000.0, 128, 128, (3072, 6144)),
    # raw_token >= 8192: 1024-multiples (489 * (1 + 2048 / 128) = 8313)
    (489.0, 2048, 128, (512, 9216)),
    # the caps: raw_bs <= 4096, raw_token <= 32768
    (7656.0, 128, 128, (4096, 8192)),
    (5000.0, 2048, 128, (4096, 32768)),
])
def test_finetune_setting_is_tuning_py(requests: float, isl: int, osl: int,
                                       expected: tuple[int, int]) -> None:
    assert finetune_setting(requests, isl, osl) == expected


def test_checkpoint_elements() -> None:
    spec = resolve_config("llama-3.1-70b")
    assert checkpoint_elements(spec, FP8) == spec.total_params  # one FP8 element per weight
    quantized = spec.linear_params - spec.vocab * spec.hidden  # lm_head stays BF16
    # NVFP4: two values per uint8 element, one FP8 scale per 16 weights
    assert checkpoint_elements(spec, NVFP4) == (spec.total_params - quantized
                                                + quantized // 2 + quantized // 16)


def test_settings_of_the_h200_8b_row() -> None:
    """calc_engine_setting by hand: (NVML total GiB - param_count x 1 B / GiB) x 0.90 over
    (2 x 32 layers x 8 KV heads x 128 x 1 B) x (ISL + OSL) per request."""
    spec, h200 = resolve_config("llama-3.1-8b"), get_target("h200")
    free_gib = 143771 / 1024 - spec.total_params / 1024**3
    per_request_gib = 2 * 32 * 8 * 128 * (128 + 2048) / 1024**3
    s = bench_settings(spec, h200, FP8, 128, 2048, kv_bytes=1)
    assert s.kv_cache_max_requests == pytest.approx(0.90 * free_gib / per_request_gib)
    assert round(s.kv_cache_max_requests) == 901
    assert (s.max_batch_size, s.max_num_tokens, s.prompts_per_step) == (1024, 2048, 16)
    # 2048/128: raw_token 901 x 17 -> 15,360 tokens: 7 whole 2,048-token prompts per step
    s = bench_settings(spec, h200, FP8, 2048, 128, kv_bytes=1)
    assert (s.max_num_tokens, s.prompts_per_step) == (15360, 7)
    # H100: 489 requests -> 9,216 tokens, 4 prompts
    s = bench_settings(spec, get_target("h100-sxm"), FP8, 2048, 128, kv_bytes=1)
    assert (s.max_batch_size, s.max_num_tokens, s.prompts_per_step) == (512, 9216, 4)


def test_chunking_off_floor() -> None:
    """Chunked prefill is off: max_num_tokens >= max ISL + max batch size, so one 20,000-token
    prompt fits a step (the heuristic alone would give 2,048)."""
    spec = resolve_config("llama-3.1-8b")
    s = bench_settings(spec, get_target("h200"), FP8, 20000, 2000, kv_bytes=1)
    assert s.max_batch_size == 96 and s.max_num_tokens == 20000 + 96
    assert s.prompts_per_step == 1


def test_untuned_formats_are_refused() -> None:
    spec = resolve_config("llama-3.1-8b")
    with pytest.raises(UnsupportedFormatError, match="no tuning heuristic"):
        bench_settings(spec, get_target("h200"), Choice.parse("int4_g128"), 128, 128, 1)


def test_prefill_chunk_sets_the_prefill_steps() -> None:
    spec, h100 = resolve_config("llama-3.1-8b"), get_target("h100-sxm")
    wl = Workload(batch=16, input_len=128, output_len=128)  # 2,048 prompt tokens

    def overhead(chunk: int) -> float:
        cm = CostModel(spec, h100, wl, kv_bytes=1, prefill_chunk=chunk)
        return cm.evaluate(FP8).fixed["kernel_overhead"].prefill_s

    one_step = overhead(PREFILL_CHUNK)
    assert overhead(2048) == pytest.approx(one_step)
    assert overhead(128) == pytest.approx(16 * one_step)  # one prompt per step
    assert overhead(512) == pytest.approx(4 * one_step)
    # each linear layer runs one GEMM of M = chunk per step: 16 calls of M = 128, which is
    # what one decode step at batch 128 costs the layer
    layer = next(x for x in spec.layers if x.role != "lm_head")
    per_prompt = CostModel(spec, h100, wl, prefill_chunk=128).layer_time(layer, FP8).prefill_s
    m128 = CostModel(spec, h100, Workload(batch=128, input_len=128, output_len=128))
    assert per_prompt == pytest.approx(16 * m128.layer_time(layer, FP8).decode_s)
    slow = CostModel(spec, h100, wl, kv_bytes=1, prefill_chunk=128).step_times(FP8)
    fast = CostModel(spec, h100, wl, kv_bytes=1).step_times(FP8)
    assert slow.prefill_s > fast.prefill_s and slow.decode_s == pytest.approx(fast.decode_s)
    with pytest.raises(UserInputError):
        CostModel(spec, h100, wl, prefill_chunk=0)


def test_validation_uses_trtllm_bench_settings_on_its_points_only(monkeypatch) -> None:
    points = {p["id"]: p for p in load_measurements()}
    point = points["P1-8b-h200fp8-h100fp8-2048-128"]
    for side_name, prompts in (("candidate", 7), ("baseline", 4)):
        side = _side(point, side_name)
        bench = _bench(point["model"], side)
        assert bench is not None and bench.prompts_per_step == prompts
        assert _prefill_chunk(side, bench) == prompts * 2048
        assert _max_batch(point["model"], side) <= bench.max_batch_size
    # a point without TensorRT-LLM settings keeps the model's default chunk and batch rule
    vllm = next(p for p in load_measurements() if "kv_pool_fraction" not in p
                and p.get("batch") == "max")
    side = _side(vllm, "candidate")
    assert _bench(vllm["model"], side) is None and _prefill_chunk(side, None) == PREFILL_CHUNK
    # trtllm-bench's max_batch_size caps the batch (on the published rows it binds only where
    # the 4096 cap did: its estimate ignores activations and rounds up; forced low here)
    side = _side(points["P1-8b-h200fp8-h100fp8-128-2048"], "candidate")
    real = _bench("llama-3.1-8b", side)
    assert real is not None and _max_batch("llama-3.1-8b", side) < real.max_batch_size
    monkeypatch.setattr(validate_module, "bench_settings",
                        lambda *a, **k: BenchSettings(100.0, 100, 2048, 16))
    assert _max_batch("llama-3.1-8b", side) == 100
