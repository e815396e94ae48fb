"""A plan's `deploy` section: the engine's launch line with the plan's formats and batch."""

from __future__ import annotations

import pytest

from autoplan.deploy import MODEL, Deploy, deploy_for
from autoplan.formats.kv import KvFormat
from autoplan.targets import get_target


def _d(runtime: str, target: str, kv: KvFormat, **kw) -> Deploy:  # noqa: ANN003
    args = dict(batch=48, input_len=2048, output_len=256, kv_bytes_per_sequence=64e6) | kw
    return deploy_for(runtime, get_target(target), kv=kv, **args)


def test_vllm_gpu_line_names_the_cache_the_batch_and_the_context() -> None:
    """... and bf16, the plan's baseline: vLLM's "auto" serves a float32 checkpoint (what
    autoplan exports) in fp16."""
    d = _d("vllm", "h100", KvFormat.FP8_E4M3)
    assert d.command == ("vllm", "serve", MODEL, "--kv-cache-dtype", "fp8", "--max-num-seqs",
                         "48", "--max-model-len", "2304", "--dtype", "bfloat16",
                         "--gpu-memory-utilization", "0.9")
    assert d.with_model("/srv/plan").shell().startswith("vllm serve /srv/plan --kv-cache-dtype fp8")
    assert d.settings == {"batch": 48, "max_model_len": 2304, "kv_cache": "fp8_e4m3",
                          "kv_cache_dtype": "fp8"}


def test_vllm_cpu_sizes_its_kv_space_for_the_batch() -> None:
    d = _d("vllm", "xeon-8480", KvFormat.BF16)
    # 48 sequences x 64 MB x 1.1 = 3.38 GB -> 4 GiB
    assert d.env == {"VLLM_CPU_KVCACHE_SPACE": "4"}
    assert "--kv-cache-dtype" in d.command and "auto" in d.command
    assert d.shell().startswith("VLLM_CPU_KVCACHE_SPACE=4 vllm serve")


def test_llama_cpp_line_takes_both_cache_types_flash_attention_and_all_slots() -> None:
    d = _d("llama.cpp", "xeon-8480", KvFormat.Q8_0)
    assert d.command == ("llama-server", "-m", MODEL, "-c", str(48 * 2304), "-np", "48",
                         "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on")


def test_tensorrt_llm_writes_its_options_file() -> None:
    d = _d("tensorrt-llm", "b200", KvFormat.NVFP4)
    assert "--extra_llm_api_options" in d.command
    assert d.files["llm_options.yml"].startswith("kv_cache_config:\n  dtype: nvfp4")


def test_sglang_and_engines_without_a_server() -> None:
    assert "fp8_e4m3" in _d("sglang", "h200", KvFormat.FP8_E4M3).command
    ort = _d("onnxruntime", "xeon-8480", KvFormat.FP32)
    assert ort.command == () and "no serving command" in ort.note


def test_round_trip_and_refusal() -> None:
    d = _d("vllm", "h100", KvFormat.FP8_E5M2)
    assert Deploy.from_json(d.to_json()) == d
    with pytest.raises(ValueError, match="serves no int8"):
        _d("vllm", "h100", KvFormat.INT8)
