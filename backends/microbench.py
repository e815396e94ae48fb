"""Layer-shape microbenchmarks and the measured cost table they produce.

For a linear layer y[M, N] = x[M, K] @ W[N, K]^T and a Choice (autoplan.formats), build the
real kernel (dense F.linear, FP8 `_scaled_mm`, 2:4 bf16/fp8, Triton block-sparse, NVFP4) and
time it: CUDA events on a GPU, `time.perf_counter` on CPU, median of `repeats` calls after
`warmup` calls. On CPU only dense and the block-sparse *reference* run, which keeps the
harness testable; their rows say so in `kernel`.

Measured cost table (JSON, sorted keys), what the cost model ingests::

    {
      "schema_version": 1,
      "device": "NVIDIA H200",            # torch.cuda.get_device_name, or "cpu (N threads)"
      "torch": "2.13.0",
      "rows": [
        {"m": 16, "n": 4096, "k": 4096,    # tokens, out features, in features
         "choice": "2:4+fp8_e4m3",         # canonical Choice text
         "kernel": "cusparselt",           # which implementation was timed
         "median_us": 41.2, "p10_us": 40.8, "p90_us": 43.0}
      ],
      "skipped": [{"m": .., "n": .., "k": .., "choice": .., "reason": "one line"}]
    }

Times are per call in microseconds and include the per-call activation quantization of
W8A8 paths (a real layer pays it too). Decode-sized weights would sit in L2 if one copy were
reused, so on GPU the harness rotates through enough weight copies to exceed the cache.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from autoplan.errors import AutoplanError, UnsupportedFormatError, UserInputError
from autoplan.formats import Choice, Precision

SCHEMA_VERSION = 1
_ROTATE_BYTES = 256 * 2**20  # > 2x the L2 of current GPUs (H200: 50 MB, MI300X: 256 MB infinity cache)
_MAX_COPIES = 16


@dataclass(frozen=True)
class Timing:
    """Per-call time statistics in microseconds."""

    median_us: float
    p10_us: float
    p90_us: float
    repeats: int


def time_callable(fn: Callable[[], Any], device: str, repeats: int = 20, warmup: int = 3) -> Timing:
    """Time `fn` `repeats` times after `warmup` calls; CUDA events on GPU, perf_counter on CPU."""
    if repeats < 1 or warmup < 0:
        raise UserInputError(f"need repeats >= 1 and warmup >= 0, got {repeats} and {warmup}")
    for _ in range(warmup):
        fn()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        samples = [start.elapsed_time(end) * 1e3 for start, end in events]
    else:
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e6)
    samples.sort()
    pick = lambda q: samples[min(len(samples) - 1, int(q * len(samples)))]  # noqa: E731
    return Timing(statistics.median(samples), pick(0.1), pick(0.9), repeats)


def make_layer_op(
    choice: Choice | str, m: int, n: int, k: int, device: str = "cuda", seed: int = 0
) -> tuple[Callable[[], torch.Tensor], str]:
    """Build inputs and weights for one (shape, choice) and return (call, kernel name)."""
    choice = Choice.parse(choice) if isinstance(choice, str) else choice
    dev = torch.device(device)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    act_dtype = torch.float32 if choice.precision == Precision.FP32 else torch.bfloat16
    x = (torch.randn(m, k, generator=gen) * 0.5).to(device=dev, dtype=act_dtype)
    base = (torch.randn(n, k, generator=gen) * 0.02).to(dev)
    copies = _copies(n, k, choice, dev)
    build, kernel = prepare_linear(choice, dev)
    weights = [build(base if i == 0 else base.roll(i, dims=1)) for i in range(copies)]
    cycle = itertools.cycle(weights)
    return (lambda: next(cycle)(x)), kernel


def prepare_linear(
    choice: Choice, dev: torch.device
) -> tuple[Callable[[torch.Tensor], Callable[[torch.Tensor], torch.Tensor]], str]:
    """For a choice, (build, kernel name): build(float weight [N, K]) -> prepared x -> y.

    Used by the sweep here and to swap real layers in end-to-end checks.
    """
    sp, prec = choice.sparsity, choice.precision
    cuda = dev.type == "cuda"
    dense_dtype = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16, Precision.FP32: torch.float32}
    if sp.kind == "dense" and prec in dense_dtype:
        def build(w):
            wd = w.to(dense_dtype[prec])
            return lambda x: torch.nn.functional.linear(x.to(wd.dtype), wd)
        return build, "torch.linear"
    if sp.kind == "block" and prec in (*dense_dtype, Precision.FP8_E4M3, Precision.INT8):
        from autoplan.backends.amd import triton_bsr as B

        vdtype = {Precision.FP8_E4M3: torch.float8_e4m3fn, Precision.INT8: torch.int8}.get(prec)

        def build(w):
            wv = w if vdtype is not None else w.to(dense_dtype[prec])
            bsr = B.BsrWeight.from_dense(wv, sp.block, block_mask=B.block_mask_by_magnitude(w, sp.block, sp.ratio), dtype=vdtype)
            fn = B.bsr_linear if cuda else B.bsr_linear_reference
            return lambda x: fn(x if vdtype is not None else x.to(bsr.values.dtype), bsr)
        return build, "triton_bsr" if cuda else "bsr_reference"
    if not cuda:
        raise UnsupportedFormatError(
            f"'{choice}' has no CPU microbenchmark path: on CPU use dense+bf16/fp32 or blockB@P choices"
        )
    from autoplan.backends.nvidia import kernels as N

    if sp.kind == "dense" and prec == Precision.FP8_E4M3:
        def build(w):
            codes, scale = N.quantize_fp8_rowwise(w)
            return lambda x: N.fp8_linear(x, codes, scale)
        return build, "torch._scaled_mm"
    if sp.kind == "nm" and (sp.n, sp.m) == (2, 4) and prec in (Precision.BF16, Precision.FP16):
        def build(w):
            ws = N.to_semi_structured(N.prune_2_4(w.to(dense_dtype[prec])))
            return lambda x: torch.nn.functional.linear(x.to(dense_dtype[prec]), ws)
        return build, "semi_structured"
    if sp.kind == "nm" and (sp.n, sp.m) == (2, 4) and prec == Precision.FP8_E4M3:
        def build(w):
            ws = N.compress_2_4_fp8(N.prune_2_4(w))
            return lambda x: N.fp8_sparse_linear(x, ws)
        return build, "cusparselt"
    if sp.kind == "dense" and prec == Precision.NVFP4:
        def build(w):
            q = N.quantize_nvfp4(w)
            return lambda x: N.nvfp4_linear(x, q)
        return build, "torch._scaled_mm_fp4"
    raise UnsupportedFormatError(
        f"no microbenchmark for '{choice}': supported are dense+bf16/fp16/fp32, dense+fp8_e4m3, "
        "dense+nvfp4, 2:4+bf16/fp16, 2:4+fp8_e4m3 and blockB@P+bf16/fp16/fp32/fp8_e4m3/int8"
    )


def _copies(n: int, k: int, choice: Choice, dev: torch.device) -> int:
    if dev.type != "cuda":
        return 1
    bytes_per_copy = max(1.0, n * k * choice.bits_per_weight() / 8)
    return int(min(_MAX_COPIES, max(1, -(-_ROTATE_BYTES // bytes_per_copy))))


def run_microbench(
    shapes: Iterable[tuple[int, int, int]],
    choices: Iterable[Choice | str],
    device: str = "cuda",
    repeats: int = 20,
    warmup: int = 3,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Time every (m, n, k) x choice; returns (rows, skipped) in the cost-table format.

    A choice that cannot run here (no kernel, wrong GPU, a library error) becomes a `skipped`
    entry with a one-line reason instead of stopping the sweep.
    """
    choices = [Choice.parse(c) if isinstance(c, str) else c for c in choices]
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for m, n, k in shapes:
        for choice in choices:
            key = {"m": int(m), "n": int(n), "k": int(k), "choice": str(choice)}
            try:
                call, kernel = make_layer_op(choice, m, n, k, device)
                t = time_callable(call, device, repeats, warmup)
            except (AutoplanError, RuntimeError, ValueError, TypeError, NotImplementedError, ImportError) as err:
                skipped.append({**key, "reason": _one_line(err)})
                continue
            finally:
                if torch.device(device).type == "cuda":
                    torch.cuda.empty_cache()
            rows.append({**key, "kernel": kernel, "median_us": t.median_us, "p10_us": t.p10_us, "p90_us": t.p90_us})
    return rows, skipped


def device_name(device: str) -> str:
    """Human-readable device description for the cost table."""
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(torch.device(device))
    return f"cpu ({torch.get_num_threads()} threads)"


def cost_table(rows: list[dict[str, Any]], device: str, skipped: Iterable[dict[str, Any]] = ()) -> dict[str, Any]:
    """Wrap rows into the versioned cost-table document."""
    return {
        "schema_version": SCHEMA_VERSION,
        "device": device_name(device),
        "torch": torch.__version__,
        "rows": list(rows),
        "skipped": list(skipped),
    }


def write_cost_table(table: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write a cost table atomically (temp file + rename), keys sorted."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(table, fh, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return path


def read_cost_table(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load and check a cost table; refuses other schema versions and malformed rows."""
    data = json.loads(Path(path).read_text())
    if data.get("schema_version") != SCHEMA_VERSION:
        raise AutoplanError(
            f"{path}: cost table schema_version {data.get('schema_version')!r} is not {SCHEMA_VERSION}; "
            "re-run the microbenchmark or upgrade autoplan"
        )
    need = {"m", "n", "k", "choice", "median_us", "p10_us", "p90_us"}
    for i, row in enumerate(data.get("rows", [])):
        if need - row.keys():
            raise AutoplanError(f"{path}: row {i} lacks {sorted(need - row.keys())}")
        Choice.parse(row["choice"])  # names a real choice
    return data


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:300]


__all__ = [
    "SCHEMA_VERSION",
    "Timing",
    "cost_table",
    "device_name",
    "make_layer_op",
    "prepare_linear",
    "read_cost_table",
    "run_microbench",
    "time_callable",
    "write_cost_table",
]
