"""KV-cache formats in the cost model: bytes per token, the batch they allow, the decode read,
sliding windows, and `autoplan estimate --kv-cache`."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from autoplan.cli import cli
from autoplan.cost import CostModel, resolve_config
from autoplan.cost.kv import KvLayout, bytes_per_token, cache_bytes
from autoplan.cost.operating import OperatingRequest, resolve_operating_point
from autoplan.errors import UserInputError
from autoplan.formats.kv import KvFormat
from autoplan.modelspec import ModelSpec
from autoplan.targets import get_target
from autoplan.workload import Workload

LLAMA8B = resolve_config("llama-3.1-8b")


def test_llama_3_8b_stores_128_kib_per_token_in_bf16() -> None:
    # hw-facts §3.3: 2 * 32 layers * 8 KV heads * 128 * 2 bytes
    assert bytes_per_token(LLAMA8B, KvLayout.of(LLAMA8B, "bf16")) == 128 * 1024
    assert bytes_per_token(LLAMA8B, KvLayout.of(LLAMA8B, "fp8_e4m3")) == 64 * 1024
    assert bytes_per_token(LLAMA8B, KvLayout.of(LLAMA8B, "q8_0")) == 68 * 1024


def test_layouts_per_block_and_refusals() -> None:
    mixed = {i: ("fp8" if i % 2 else "bf16") for i in range(LLAMA8B.n_layers)}
    layout = KvLayout.of(LLAMA8B, mixed)
    assert layout.label() == "mixed" and layout.uniform is None
    assert bytes_per_token(LLAMA8B, layout) == 96 * 1024
    with pytest.raises(UserInputError, match="blocks 0"):
        KvLayout.of(LLAMA8B, {0: "fp8"})


def _config(model_type: str, **extra: object) -> dict:
    return {"model_type": model_type, "hidden_size": 256, "intermediate_size": 512,
            "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 1000, **extra}


@pytest.mark.parametrize(("cfg", "windows"), [
    (_config("llama"), ()),
    (_config("mistral", sliding_window=64), (64,) * 6),
    (_config("mistral", sliding_window=None), ()),
    (_config("gemma2", sliding_window=64), (64, 0, 64, 0, 64, 0)),
    (_config("gemma3_text", sliding_window=64, sliding_window_pattern=3), (64, 64, 0) * 2),
    (_config("qwen2", sliding_window=64, use_sliding_window=False), ()),
    (_config("qwen2", sliding_window=64, use_sliding_window=True, max_window_layers=4),
     (0, 0, 0, 0, 64, 64)),
    (_config("llama", sliding_window=64,
             layer_types=["sliding_attention", "full_attention"] * 3), (64, 0) * 3),
])
def test_sliding_windows_follow_transformers_layer_types(cfg: dict, windows: tuple) -> None:
    assert ModelSpec.from_config(cfg).windows == windows


def test_sliding_window_blocks_cache_at_most_the_window() -> None:
    full = ModelSpec.from_config(_config("gemma2"))
    half = ModelSpec.from_config(_config("gemma2", sliding_window=64))
    layout = KvLayout.of(full, "bf16")
    per_block = 2 * 2 * 64 * 2  # K and V, 2 KV heads, head_dim 64, 2 bytes
    assert cache_bytes(full, layout, 1, 1000) == 6 * per_block * 1000
    assert cache_bytes(half, layout, 1, 1000) == 3 * per_block * 1000 + 3 * per_block * 64
    wl = Workload(batch=4, input_len=1000, output_len=10)
    t = get_target("h100")
    full_read = CostModel(full, t, wl).evaluate().kv.read_bytes
    half_read = CostModel(half, t, wl).evaluate().kv.read_bytes
    assert half_read == pytest.approx(full_read / 2 + 3 * 4 * per_block * 64, rel=1e-9)


def test_fp8_cache_halves_the_read_and_doubles_the_batch_that_fits() -> None:
    h100 = get_target("h100")
    req = OperatingRequest("max", 8192, 1024)
    points = {kv: resolve_operating_point(
        LLAMA8B, h100, None, req, model_for=lambda w, kv=kv: CostModel(LLAMA8B, h100, w, kv=kv))
        for kv in ("bf16", "fp8_e4m3")}
    b16, b8 = points["bf16"].workload.batch, points["fp8_e4m3"].workload.batch
    assert 1.9 <= b8 / b16 <= 2.1
    wl = Workload(batch=b16, input_len=8192, output_len=1024)
    e16 = CostModel(LLAMA8B, h100, wl, kv="bf16").evaluate()
    e8 = CostModel(LLAMA8B, h100, wl, kv="fp8_e4m3").evaluate()
    assert e8.kv.read_bytes == pytest.approx(e16.kv.read_bytes / 2)
    assert e8.metrics.decode_s < e16.metrics.decode_s  # at the same batch, fewer bytes read
    big = CostModel(LLAMA8B, h100, Workload(batch=b8, input_len=8192, output_len=1024),
                    kv="fp8_e4m3")
    assert big.evaluate().metrics.throughput > 1.3 * e16.metrics.throughput


def test_per_block_rows_add_up_to_the_attention_part() -> None:
    est = CostModel(LLAMA8B, get_target("h200"), Workload(batch=8, input_len=2048,
                                                          output_len=128), kv="fp8").evaluate()
    assert len(est.kv.blocks) == LLAMA8B.n_layers
    assert sum(b.decode_s for b in est.kv.blocks) == pytest.approx(
        est.fixed["attention"].decode_s)
    assert sum(b.read_bytes for b in est.kv.blocks) == pytest.approx(est.kv.read_bytes)


def test_kv_bytes_and_the_same_format_agree() -> None:
    wl = Workload(batch=16, input_len=4096, output_len=256)
    t = get_target("h100")
    by_bytes = CostModel(LLAMA8B, t, wl, kv_bytes=1.0).evaluate().metrics
    by_format = CostModel(LLAMA8B, t, wl, kv=KvFormat.FP8_E4M3).evaluate().metrics
    assert by_bytes == by_format


# ---- autoplan estimate --kv-cache ------------------------------------------------------------
_EST = ["estimate", "--model", "llama-3.1-8b", "--target", "h100", "--input-len", "8192",
        "--output-len", "1024", "--batch", "max"]


def test_estimate_kv_cache_json_shows_the_batch_it_allows() -> None:
    result = CliRunner().invoke(cli, [*_EST, "--kv-cache", "fp8", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["kv_cache"] == "fp8_e4m3" and doc["baseline_kv_cache"] == "bf16"
    cand, base = doc["candidate"], doc["baseline"]
    assert cand["kv"]["bytes_per_token"] == 64 * 1024
    assert base["kv"]["bytes_per_token"] == 128 * 1024
    assert cand["workload"]["batch"] >= 1.9 * base["workload"]["batch"]
    assert doc["speedup"]["throughput"] > 1.3


def test_estimate_breakdown_lists_every_blocks_cache() -> None:
    result = CliRunner().invoke(cli, [*_EST, "--kv-cache", "fp8", "--breakdown"])
    assert result.exit_code == 0, result.output
    assert "KV cache per block" in result.output and "fp8_e4m3" in result.output


@pytest.mark.parametrize(("args", "needle"), [
    (["--kv-cache", "int8"], "serves no int8 KV cache"),
    (["--kv-cache", "nvfp4", "--runtime", "tensorrt-llm"], "Blackwell"),
    (["--kv-cache", "q9"], "unknown KV-cache format"),
    (["--kv-cache", "fp8@0-15,bf16@16-31"], "one KV-cache type for the whole model"),
    (["--kv-cache", "fp8@0-15"], "not a mix per layer (bf16, fp8_e4m3)"),
    (["--kv-cache", "fp8@0-40"], "has blocks 0-31"),
])
def test_estimate_refuses_a_cache_the_runtime_does_not_serve(args: list[str],
                                                             needle: str) -> None:
    result = CliRunner().invoke(cli, [*_EST, *args])
    assert result.exit_code == 2, result.output
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0]
