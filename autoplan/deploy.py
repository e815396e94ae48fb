"""What an operator pastes: a plan's serving command for its engine, with the formats and the
batch the plan assumed.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field
from typing import Any

from autoplan.formats.kv import KvFormat, kv_spec
from autoplan.runtimes import kv_supports
from autoplan.targets import Target

MODEL = "{MODEL}"  # the artifact's path, filled in by whoever knows it (export, show)
USABLE_MEMORY = 0.90  # the share of device memory the cost model plans with (cost/model.py)


@dataclass(frozen=True)
class Deploy:
    """A launch command and what it assumes.

    Attributes:
        runtime: the engine.
        command: argv; ``{MODEL}`` stands for the exported artifact until ``with_model``.
        env: environment variables the command needs (vLLM CPU's KV-cache space).
        files: files the command reads, by name (TensorRT-LLM's options YAML).
        settings: the plan's operating point as the engine is told it.
        note: one line an operator needs (or why there is no command).
    """

    runtime: str
    command: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    note: str = ""

    def shell(self) -> str:
        """The command as one line for a POSIX shell (environment first)."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        line = shlex.join(self.command)
        return f"{env} {line}" if env and line else line

    def with_model(self, path: str) -> Deploy:
        """The same with ``{MODEL}`` replaced by the artifact's path."""
        cmd = tuple(path if a == MODEL else a for a in self.command)
        return Deploy(self.runtime, cmd, dict(self.env), dict(self.files), dict(self.settings),
                      self.note)

    def to_json(self) -> dict[str, Any]:
        return {"runtime": self.runtime, "command": list(self.command), "shell": self.shell(),
                "env": dict(self.env), "files": dict(self.files),
                "settings": dict(self.settings), "note": self.note}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Deploy:
        return cls(doc["runtime"], tuple(doc.get("command", ())), dict(doc.get("env", {})),
                   dict(doc.get("files", {})), dict(doc.get("settings", {})),
                   doc.get("note", ""))


def _flag(target: Target, runtime: str, kv: KvFormat) -> str:
    answer = kv_supports(target, runtime, kv)
    if answer.rule is None:  # the search only plans served formats: a hand-made plan
        raise ValueError(f"{runtime} serves no {kv.value} KV cache on {target.name}: "
                         f"{answer.reason}")
    return answer.rule.flag or str(kv_spec(kv).gguf)


def deploy_for(runtime: str, target: Target, *, kv: KvFormat, batch: int, input_len: int,
               output_len: int, kv_bytes_per_sequence: float = 0.0) -> Deploy:
    """The launch command serving a plan's artifact at the batch it was planned for.

    Args:
        runtime: the plan's engine.
        target: the hardware (vLLM on a CPU sizes its KV space by bytes, not by share).
        kv: the plan's KV-cache format (one for the model: no engine takes a mix).
        batch: concurrent sequences the cost model planned for.
        input_len, output_len: tokens per request; the context is their sum.
        kv_bytes_per_sequence: the cache of one sequence (for vLLM CPU's KV space).

    Raises:
        ValueError: the engine does not serve ``kv`` on ``target`` (a hand-made plan).
    """
    ctx = input_len + output_len
    settings: dict[str, Any] = {"batch": batch, "max_model_len": ctx, "kv_cache": kv.value}
    if runtime == "vllm":
        flag = _flag(target, runtime, kv)
        cmd = ["vllm", "serve", MODEL, "--kv-cache-dtype", flag, "--max-num-seqs", str(batch),
               "--max-model-len", str(ctx)]
        # the plan's baseline and activations are bf16; vLLM's "auto" serves a float32
        # checkpoint (autoplan loads and exports in fp32) in fp16 instead
        cmd += ["--dtype", "bfloat16"]
        env: dict[str, str] = {}
        if target.platform == "cpu":
            gib = max(1, math.ceil(batch * kv_bytes_per_sequence * 1.1 / 2**30))
            env["VLLM_CPU_KVCACHE_SPACE"] = str(gib)  # GiB for the planned batch, +10 %
        else:
            cmd += ["--gpu-memory-utilization", f"{USABLE_MEMORY:g}"]
        return Deploy(runtime, tuple(cmd), env, {}, settings | {"kv_cache_dtype": flag},
                      "static K/V scales, where the format has them, are read from the "
                      "checkpoint (compressed-tensors kv_cache_scheme)")
    if runtime == "sglang":
        flag = _flag(target, runtime, kv)
        cmd = ["python", "-m", "sglang.launch_server", "--model-path", MODEL,
               "--kv-cache-dtype", flag, "--max-running-requests", str(batch),
               "--context-length", str(ctx), "--mem-fraction-static", f"{USABLE_MEMORY:g}"]
        return Deploy(runtime, tuple(cmd), {}, {}, settings | {"kv_cache_dtype": flag})
    if runtime == "tensorrt-llm":
        flag = _flag(target, runtime, kv)
        options = "llm_options.yml"
        yaml = f"kv_cache_config:\n  dtype: {flag}\n  free_gpu_memory_fraction: {USABLE_MEMORY:g}\n"
        cmd = ["trtllm-serve", MODEL, "--backend", "pytorch", "--max_batch_size", str(batch),
               "--max_seq_len", str(ctx), "--extra_llm_api_options", options]
        return Deploy(runtime, tuple(cmd), {}, {options: yaml},
                      settings | {"kv_cache_dtype": flag},
                      "the ModelOpt checkpoint's kv_cache_quant_algo and K/V scales set the "
                      "cache; the options file says so to the server as well")
    if runtime == "llama.cpp":
        flag = _flag(target, runtime, kv)
        cmd = ["llama-server", "-m", MODEL, "-c", str(batch * ctx), "-np", str(batch),
               "-ctk", flag, "-ctv", flag, "-fa", "on"]
        return Deploy(runtime, tuple(cmd), {}, {}, settings | {"cache_type": flag},
                      "-c is the context of all -np slots together (each slot gets "
                      f"{ctx} tokens); a quantized V cache needs flash attention (-fa on)")
    return Deploy(runtime, (), {}, {}, settings,
                  f"{runtime} has no serving command: run the exported artifact in-process "
                  f"(autoplan bench measures it) at batch {batch}")


__all__ = ["MODEL", "Deploy", "deploy_for"]
