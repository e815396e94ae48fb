"""The engine settings `trtllm-bench throughput` derives for itself, as its source does.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoplan.errors import AutoplanError, UnsupportedFormatError
from autoplan.formats import Choice
from autoplan.modelspec import ModelSpec
from autoplan.targets import Target

GIB = 1024**3
# tuning.py BYTES_PER_ELEM: QuantAlgo.NO_QUANT 2.0, FP8 1.0, FP8_BLOCK_SCALES 1.0, NVFP4 .5.
# Keyed here by the format that runs (autoplan precision names).
_BYTES_PER_ELEM = {"bf16": 2.0, "fp16": 2.0, "fp8_e4m3": 1.0, "nvfp4": 0.5}
BATCH_CAP = 4096  # "raw_bs = min(kv_cache_max_requests, 4096) / pp_size"
TOKEN_CAP = 32768  # "raw_token = min(raw_bs * (1 + input_len / output_len), 32768)"
KV_FREE_FRACTION = 0.90  # throughput --kv_cache_free_gpu_mem_fraction "default=.90"


@dataclass(frozen=True)
class BenchSettings:
    """What trtllm-bench runs a (model, GPU, dataset) with."""

    kv_cache_max_requests: float  # its own estimate (weights + KV only)
    max_batch_size: int
    max_num_tokens: int  # after the chunking-off floor (max ISL + max batch size)
    prompts_per_step: int  # whole prompts one context step holds (chunked prefill off)


def finetune_setting(kv_cache_max_requests: float, input_len: int, output_len: int,
                     pp_size: int = 1) -> tuple[int, int]:
    """(max_batch_size, max_num_tokens) exactly as tuning.py's `finetune_setting` (optimistic
    tuning on, the default for every model but Mamba hybrids)."""
    raw_bs = min(kv_cache_max_requests, BATCH_CAP) / pp_size
    raw_token = min(raw_bs * (1 + input_len / output_len), TOKEN_CAP)
    if raw_bs < 256:
        max_bs = max(64, 32 * math.ceil(raw_bs / 32))
    elif raw_bs < 1024:
        max_bs = 128 * math.ceil(raw_bs / 128)
    else:
        max_bs = 256 * math.ceil(raw_bs / 256)
    if raw_token < 4096:
        max_token = max(2048, 256 * math.ceil(raw_token / 256))
    elif raw_token < 8192:
        max_token = 512 * math.ceil(raw_token / 512)
    else:
        max_token = 1024 * math.ceil(raw_token / 1024)
    return max_bs, max_token


def checkpoint_elements(spec: ModelSpec, choice: Choice) -> int:
    """Elements in the checkpoint's safetensors (what trtllm-bench calls param_count)."""
    if choice.precision.value != "nvfp4":
        return spec.total_params
    quantized = sum(layer.params for layer in spec.layers if layer.role != "lm_head")
    return spec.total_params - quantized + quantized // 2 + quantized // 16


def bench_settings(spec: ModelSpec, target: Target, choice: Choice, input_len: int,
                   output_len: int, kv_bytes: float,
                   kv_fraction: float = KV_FREE_FRACTION) -> BenchSettings:
    """trtllm-bench's settings for one GPU (TP1, PP1) and a uniform ISL/OSL dataset.

    Raises:
        UnsupportedFormatError: a format trtllm-bench does not tune (it then falls back to
            BuildConfig's defaults, which this module does not describe).
        AutoplanError: no KV cache is left for one request (trtllm-bench refuses too).
    """
    bytes_per_elem = _BYTES_PER_ELEM.get(choice.precision.value)
    if bytes_per_elem is None or choice.sparsity.density != 1.0:
        raise UnsupportedFormatError(f"trtllm-bench has no tuning heuristic for {choice}")
    engine_gib = checkpoint_elements(spec, choice) * bytes_per_elem / GIB
    # byte_per_token = 2 * num_attention_layers * kv_heads * head_size * byte_per_kv_elem / GiB
    per_token_gib = spec.kv_bytes_per_token(kv_bytes) / GIB
    available = target.memory_bytes / GIB - engine_gib  # get_device_memory(): NVML total
    requests = available * kv_fraction / (per_token_gib * (input_len + output_len))
    if requests < 1:
        raise AutoplanError(f"{spec.name} {choice} leaves no KV cache on {target.name}")
    max_bs, max_token = finetune_setting(requests, input_len, output_len)
    max_token = max(max_token, input_len + max_bs)  # chunked prefill off
    return BenchSettings(requests, max_bs, max_token, max_token // input_len)


__all__ = ["BATCH_CAP", "KV_FREE_FRACTION", "TOKEN_CAP", "BenchSettings", "bench_settings",
           "checkpoint_elements", "finetune_setting"]
