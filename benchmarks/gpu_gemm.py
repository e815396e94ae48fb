"""The GPU check's GEMM sweep: Llama-3.1-8B and 70B layer GEMMs, as the cost model prices them.

One row per (model, GEMM, M, choice): the packed q/k/v and gate/up GEMMs (CostModel looks a
fused group up by its summed width), o_proj and down_proj, at M in {1, 16, 128, 1024, 8192}
(decode batches to prefill chunks). Kernels: autoplan.backends.microbench's (dense bf16,
FP8 `_scaled_mm`, 2:4 bf16, 2:4 FP8 via cuSPARSELt, Triton block-sparse) and torch's own
INT8 / W4A16 ones (gpu_kernels.py). Each weight is pruned and quantized once per (shape,
choice) and timed at every M; small weights rotate through copies so decode-sized GEMMs do
not run out of L2 (60 MB on an H200). Times: CUDA events, median of `repeats`.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

import gpu_kernels
import torch
from _common import one_line
from autoplan.backends import microbench as MB

from autoplan.formats import Choice

MODELS = {
    # hidden, intermediate, heads, kv heads, head dim
    "llama-3.1-8b": dict(hidden=4096, inter=14336, heads=32, kv=8, head_dim=128),
    "llama-3.1-70b": dict(hidden=8192, inter=28672, heads=64, kv=8, head_dim=128),
}
TOKENS = (1, 16, 128, 1024, 8192)
CHOICES = ("dense+bf16", "dense+fp8_e4m3", "dense+int8", "dense+int4_g128", "2:4+bf16",
           "2:4+fp8_e4m3", "block64@50+bf16")
SMOKE = dict(models={"tiny": dict(hidden=64, inter=128, heads=4, kv=2, head_dim=16)},
             tokens=(1, 8), choices=("dense+bf16", "dense+int8", "dense+int4_g128",
                                     "dense+fp8_e4m3", "block16@50+bf16"))
ROTATE_BYTES = 128 * 2**20  # > 2x an H200's L2
MAX_COPIES = 8


def gemm_shapes(hidden: int, inter: int, heads: int, kv: int, head_dim: int
                ) -> dict[str, tuple[int, int]]:
    """(N out, K in) of each GEMM a decoder layer runs: fused qkv and gate_up, o, down."""
    return {
        "qkv_proj": ((heads + 2 * kv) * head_dim, hidden),
        "o_proj": (hidden, heads * head_dim),
        "gate_up_proj": (2 * inter, hidden),
        "down_proj": (hidden, inter),
    }


def _builder(choice: Choice, dev: torch.device) -> tuple[Callable[[torch.Tensor], Any], str]:
    """(build(weight) -> layer, kernel name): torch's int8/int4 kernels, else autoplan's."""
    if gpu_kernels.handles(choice):
        return (lambda w: gpu_kernels.build(choice, w)[0]), gpu_kernels.kernel_name(choice)
    return MB.prepare_linear(choice, dev)


def sweep(models: dict[str, dict[str, int]], tokens: tuple[int, ...], choices: tuple[str, ...],
          device: str, repeats: int, warmup: int, deadline: float,
          on_row: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Time every (model, GEMM, choice, M); stop before `deadline` (time.monotonic()).

    Returns {"rows": [...], "skipped": [...], "stopped": reason or None}: rows in the cost
    table format (plus model, gemm), skipped with a one-line reason each.
    """
    dev = torch.device(device)
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    gen = torch.Generator(device=dev).manual_seed(0)  # on the device: a 70B weight is 470M
    for model, dims in models.items():
        for gemm, (n, k) in gemm_shapes(**dims).items():
            base = torch.randn(n, k, generator=gen, device=dev) * 0.02
            for text in choices:
                choice = Choice.parse(text)
                if time.monotonic() > deadline:
                    return {"rows": rows, "skipped": skipped,
                            "stopped": f"time box reached before {model} {gemm} {text}"}
                key = {"model": model, "gemm": gemm, "n": n, "k": k, "choice": str(choice)}
                try:
                    build, kernel = _builder(choice, dev)
                    copies = _copies(n, k, choice, dev)
                    layers = [build(base if i == 0 else base.roll(i, dims=1))
                              for i in range(copies)]
                except Exception as err:  # noqa: BLE001 - a kernel this GPU lacks: say why
                    skipped += [{**key, "m": m, "reason": one_line(err)} for m in tokens]
                    continue
                for m in tokens:
                    x = (torch.randn(m, k, generator=gen, device=dev) * 0.5).bfloat16()
                    call = functools.partial(_next_layer, itertools.cycle(layers), x)
                    try:
                        t = MB.time_callable(call, device, repeats, warmup)
                    except Exception as err:  # noqa: BLE001 - e.g. a shape the kernel refuses
                        skipped.append({**key, "m": m, "reason": one_line(err)})
                        continue
                    name = kernel + ("+pad32" if kernel == "torch._int_mm"
                                     and m < gpu_kernels.INT_MM_MIN_M else "")
                    rows.append({**key, "m": m, "kernel": name, "median_us": t.median_us,
                                 "p10_us": t.p10_us, "p90_us": t.p90_us, "copies": copies})
                    on_row()
                del layers
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
    return {"rows": rows, "skipped": skipped, "stopped": None}


def _next_layer(layers: Iterator[Callable[[torch.Tensor], Any]], x: torch.Tensor) -> Any:
    return next(layers)(x)


def _copies(n: int, k: int, choice: Choice, dev: torch.device) -> int:
    if dev.type != "cuda":
        return 1
    per_copy = max(1.0, n * k * choice.bits_per_weight() / 8)
    return int(min(MAX_COPIES, max(1, -(-ROTATE_BYTES // per_copy))))


__all__ = ["CHOICES", "MODELS", "SMOKE", "TOKENS", "gemm_shapes", "sweep"]
