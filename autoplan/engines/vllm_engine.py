"""Run a checkpoint in vLLM (the engine's own venv) and build ``vllm serve`` command lines.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoplan.engines.serving import HOST, VLLM_CLI, log_tail, run_group
from autoplan.errors import AutoplanError, UserInputError

WORKER = Path(__file__).with_name("vllm_worker.py")
KV_CACHE_GIB = 1  # VLLM_CPU_KVCACHE_SPACE: vLLM CPU reserves 4 GiB by default


@dataclass(frozen=True)
class VllmRun:
    """What one vLLM run produced, or vLLM's reason for refusing the checkpoint.

    Attributes:
        ok: the checkpoint loaded and generated.
        stage: where it failed ("load" or "generate"); "" when ok.
        error: vLLM's own exception text (the innermost one), "" when ok.
        results: per prompt: greedy ``tokens``, their ``logprobs``, and the
            ``prompt_logprobs`` of each prompt token given the ones before it.
        load_s: seconds to build the ``LLM`` (load, compile, profile).
        versions: the engine's package versions.
        layers: per probed layer (``run_vllm(layers=...)``): ``y`` (vLLM's output, fp32),
            ``codes`` / ``scales`` (its int8 input quantization, W8A8 oneDNN layers only),
            and ``method`` / ``scheme`` / ``kernel`` / ``path`` (what vLLM ran it with).
        cpu: the vLLM C++ library this CPU loads and the ISA flags torch reports.
    """

    ok: bool
    stage: str = ""
    error: str = ""
    results: list[dict[str, Any]] = field(default_factory=list)
    load_s: float = 0.0
    versions: dict[str, str] = field(default_factory=dict)
    layers: dict[str, dict[str, Any]] = field(default_factory=dict)
    cpu: dict[str, Any] = field(default_factory=dict)


def run_vllm(model_dir: str | Path, prompts: Sequence[Sequence[int]], *, max_tokens: int,
             dtype: str = "bfloat16", logprobs: int = 1, max_model_len: int = 512,
             timeout_s: float = 900, python: str | Path | None = None,
             layers: dict[str, Any] | None = None, kv_cache_dtype: str = "auto") -> VllmRun:
    """Load ``model_dir`` with ``vllm.LLM`` and generate greedily from token-id prompts.

    ``kv_cache_dtype`` is vLLM's ``--kv-cache-dtype`` (auto, fp8, fp8_e4m3, fp8_e5m2).

    ``layers`` ({module name: input tensor [tokens, in]}) also runs each of those linear
    layers once on its input through vLLM's own kernel for it (vllm_worker.py's layer
    probe); vLLM fuses q/k/v and gate/up, so only o_proj and down_proj are addressable.

    A checkpoint vLLM refuses is not an error here: the run comes back with ``ok=False``
    and vLLM's words, so callers can tabulate what the engine accepts.

    Raises:
        UserInputError: the engine is not installed (names the install command), or no
            checkpoint folder at ``model_dir``.
        AutoplanError: the worker died without reporting (its stderr's last lines), or ran
            past ``timeout_s``.
    """
    from autoplan.engines import engine_python

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise UserInputError(f"no checkpoint at '{model_dir}' (no config.json): pass the "
                             "folder `autoplan export --format compressed-tensors` wrote")
    exe = Path(python) if python else engine_python("vllm")
    cfg = {"model": str(model_dir.resolve()), "dtype": dtype, "max_model_len": max_model_len,
           "prompts": [list(map(int, p)) for p in prompts], "max_tokens": int(max_tokens),
           "logprobs": logprobs, "prompt_logprobs": logprobs, "kv_cache_gib": KV_CACHE_GIB,
           "kv_cache_dtype": kv_cache_dtype}
    with tempfile.TemporaryDirectory(prefix="autoplan-vllm-") as tmp:
        out, log = Path(tmp) / "out.jsonl", Path(tmp) / "stderr.txt"
        if layers:
            cfg["layers"], cfg["layers_out"] = _write_layer_inputs(layers, Path(tmp))
        code = run_group([str(exe), str(WORKER), json.dumps(cfg)], log, timeout_s,
                         what=f"vLLM on '{model_dir.name}'", stdout=out, check=False)
        lines = [x for x in out.read_text().splitlines() if x.startswith("{")]
        if not lines:
            raise AutoplanError(f"vLLM on '{model_dir.name}' exited (code {code}) without "
                                f"a result: {log_tail(log)}")
        doc = json.loads(lines[-1])
        if not doc.get("ok"):
            return VllmRun(False, doc.get("stage", "load"), doc.get("error", "unknown error"))
        probed = _read_layer_outputs(doc.get("layers", {}), cfg.get("layers_out"))
    return VllmRun(True, results=doc["results"], load_s=float(doc["load_s"]),
                   versions=doc.get("versions", {}), layers=probed, cpu=doc.get("cpu", {}))


def _write_layer_inputs(layers: dict[str, Any], folder: Path) -> tuple[dict[str, str], str]:
    from safetensors.torch import save_file

    paths = {}
    for i, (name, x) in enumerate(layers.items()):
        paths[name] = str(folder / f"x{i}.safetensors")
        save_file({"x": x.detach().contiguous()}, paths[name])
    return paths, str(folder / "layers_out.safetensors")


def _read_layer_outputs(info: dict[str, dict], path: str | None) -> dict[str, dict[str, Any]]:
    if not info or not path:
        return {}
    from safetensors.torch import load_file

    tensors = load_file(path)
    return {name: {**meta, "y": tensors.get(f"y:{name}"), "codes": tensors.get(f"codes:{name}"),
                   "scales": tensors.get(f"scales:{name}")} for name, meta in info.items()}


def serve_command(model_dir: str | Path, port: int, *, served_name: str,
                  dtype: str = "bfloat16", max_model_len: int = 1024, max_num_seqs: int = 16,
                  python: str | Path | None = None) -> list[str]:
    """``vllm serve`` for one checkpoint on 127.0.0.1:port (remote code off; vLLM 0.32 logs no
    requests unless ``--enable-log-requests``, and no longer accepts ``--disable-log-requests``).

    Raises:
        UserInputError: the engine is not installed.
    """
    from autoplan.engines import engine_python

    exe = Path(python) if python else engine_python("vllm")
    return [str(exe), str(VLLM_CLI), "serve", str(model_dir),
            "--host", HOST, "--port", str(port), "--served-model-name", served_name,
            "--dtype", dtype, "--max-model-len", str(max_model_len),
            "--max-num-seqs", str(max_num_seqs), "--seed", "0",
            "--no-trust-remote-code"]  # request logging is off by default since vLLM 0.11


def serve_env() -> dict[str, str]:
    """Environment for ``vllm serve`` on CPU: a KV cache sized for this machine."""
    return {"VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB)}


__all__ = ["KV_CACHE_GIB", "WORKER", "VllmRun", "run_vllm", "serve_command", "serve_env"]
