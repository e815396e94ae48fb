"""Layer-shape microbenchmarks and the measured cost table they produce.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from autoplan.atomic import write_json_atomic
from autoplan.backends.base import sparsity_token
from autoplan.errors import AutoplanError, UnsupportedFormatError, UserInputError
from autoplan.formats import Choice, Precision, format_spec, registered_formats
from autoplan.prune import PruneScore, compute_mask
from autoplan.quant import QuantizedWeight, quantize_weight

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


# ---- kernels: each packs and launches what autoplan.prune and autoplan.quant made --------
Layer = Callable[[torch.Tensor], torch.Tensor]
Mask = torch.Tensor | None


@dataclass(frozen=True)
class Kernel:
    """A timed linear kernel, named by FormatSpec.kernels.

    ``pack(choice, q, mask, dev)`` turns the layer's QuantizedWeight (masked, quantized) and
    its keep-mask (None when dense) into a callable ``x -> y``. ``cpu_name``: the name of
    its CPU reference path, or None when the kernel needs CUDA.
    """

    name: str
    pack: Callable[[Choice, QuantizedWeight, Mask, torch.device], Layer]
    cpu_name: str | None = None


_KERNELS: dict[str, Kernel] = {}


def _float_dtype(choice: Choice) -> torch.dtype:
    """The dtype an unquantized format's values are held in (its FormatSpec's)."""
    dtype = format_spec(choice.precision).float_dtype
    if dtype is None:
        raise AutoplanError(f"{choice.precision.value} is quantized; a float kernel cannot run "
                            "it (please report: its FormatSpec names this kernel)")
    return dtype


def _kernel(name: str, cpu_name: str | None = None):  # noqa: ANN202 - a decorator
    def register(pack: Callable[..., Layer]):  # noqa: ANN202
        if name in _KERNELS:
            raise AutoplanError(f"microbenchmark kernel {name} is registered twice")
        _KERNELS[name] = Kernel(name, pack, cpu_name)
        return pack
    return register


@_kernel("torch.linear", cpu_name="torch.linear")
def _dense_float(choice: Choice, q: QuantizedWeight, mask: Mask, dev: torch.device) -> Layer:
    wd = q.dequant.to(_float_dtype(choice))
    return lambda x: torch.nn.functional.linear(x.to(wd.dtype), wd)


@_kernel("triton_bsr", cpu_name="bsr_reference")
def _block_sparse(choice: Choice, q: QuantizedWeight, mask: Mask, dev: torch.device) -> Layer:
    from autoplan.backends.amd import triton_bsr as B

    block = choice.sparsity.block
    tiles = B.block_mask_of(mask.float(), block)  # the tiles autoplan.prune kept
    if q.codes is None:  # 16/32-bit values
        bsr = B.BsrWeight.from_dense(q.dequant.to(_float_dtype(choice)), block,
                                     block_mask=tiles)
    else:
        bsr = B.BsrWeight.from_quantized(q, block, block_mask=tiles)
    fn = B.bsr_linear if dev.type == "cuda" else B.bsr_linear_reference
    return lambda x: fn(x if q.codes is not None else x.to(bsr.values.dtype), bsr)


@_kernel("torch._scaled_mm")
def _fp8_dense(choice: Choice, q: QuantizedWeight, mask: Mask, dev: torch.device) -> Layer:
    from autoplan.backends.nvidia import kernels as N

    return lambda x: N.fp8_linear(x, q)


@_kernel("semi_structured")
def _sparse_2_4_float(choice: Choice, q: QuantizedWeight, mask: Mask, dev: torch.device) -> Layer:
    from autoplan.backends.nvidia import kernels as N

    dtype = _float_dtype(choice)
    ws = N.to_semi_structured(q.dequant.to(dtype))
    return lambda x: torch.nn.functional.linear(x.to(dtype), ws)


@_kernel("cusparselt")
def _sparse_2_4_fp8(choice: Choice, q: QuantizedWeight, mask: Mask, dev: torch.device) -> Layer:
    from autoplan.backends.nvidia import kernels as N

    ws = N.compress_2_4_fp8(q)
    return lambda x: N.fp8_sparse_linear(x, ws)


@_kernel("torch._scaled_mm_fp4")
def _nvfp4_dense(choice: Choice, q: QuantizedWeight, mask: Mask, dev: torch.device) -> Layer:
    from autoplan.backends.nvidia import kernels as N

    packed = N.pack_nvfp4(q)
    return lambda x: N.nvfp4_linear(x, packed)


def compress_for(choice: Choice, w: torch.Tensor) -> tuple[QuantizedWeight, torch.Tensor | None]:
    """The weight a kernel for `choice` runs, and its keep-mask (None when dense):
    autoplan.prune's magnitude mask of the choice's pattern, then autoplan.quant's
    round-to-nearest of the kept weights."""
    mask = None
    if choice.sparsity.kind != "dense":
        mask = compute_mask(w, choice.sparsity, score=PruneScore.MAGNITUDE).mask
    return quantize_weight(w.float(), choice.precision, mask=mask), mask


def prepare_linear(
    choice: Choice, dev: torch.device
) -> tuple[Callable[[torch.Tensor], Layer], str]:
    """For a choice, (build, kernel name): build(float weight [N, K]) -> prepared x -> y.

    On a GPU the kernel is the first of the backend's ordered kernels whose requirements
    hold (``Backend.select_kernel``); on CPU, the reference path of the kernel the choice's
    FormatSpec names for its sparsity pattern. build
    prunes and quantizes the weight with autoplan.prune / autoplan.quant (``compress_for``)
    and the kernel only packs the result. Used by the sweep here and to swap real layers in
    end-to-end checks.

    Raises:
        UnsupportedFormatError: no kernel for the choice, or it needs CUDA and `dev` is CPU.
    """
    if dev.type == "cuda":
        # The GPU backend's ordered kernel list picks: the first kernel whose requirements
        # (the FormatSpec names it; the GPU's compute capability) all hold.
        from autoplan.backends.registry import get_backend

        backend = get_backend("amd" if torch.version.hip else "nvidia")
        kernel = _KERNELS[backend.select_kernel(choice).name]
        name = kernel.name
    else:
        name = format_spec(choice.precision).kernels.get(sparsity_token(choice))
        if name is None:
            raise UnsupportedFormatError(f"no microbenchmark for '{choice}': kernels exist for "
                                         f"{', '.join(sorted(_timed_choices()))}")
        kernel = _KERNELS[name]
        if kernel.cpu_name is None:
            cpu = sorted(c for c, k in _timed_choices().items() if _KERNELS[k].cpu_name)
            raise UnsupportedFormatError(
                f"'{choice}' has no CPU microbenchmark path ({name} needs CUDA): on CPU use "
                f"{', '.join(cpu)}")
    shown = name if dev.type == "cuda" else kernel.cpu_name
    return (lambda w: kernel.pack(choice, *compress_for(choice, w.to(dev)), dev)), shown


def _timed_choices() -> dict[str, str]:
    """'{sparsity token}+{precision}' -> kernel name, for every registered format."""
    return {f"{token}+{spec.name}": name for spec in registered_formats()
            for token, name in spec.kernels.items()}


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


def run_rows(rows: Iterable[tuple[int, int, int, Choice]], device: str = "cuda",
             repeats: int = 20, warmup: int = 3) -> dict[str, Any]:
    """Time (m, n, k, choice) rows on ``device``: the cost table of ``Backend.microbench``."""
    timed: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for m, n, k, choice in rows:
        got, miss = run_microbench([(m, n, k)], [choice], device, repeats, warmup)
        timed += got
        skipped += miss
    return cost_table(timed, device, skipped)


def unavailable_table(rows: Iterable[tuple[int, int, int, Choice]], reason: str) -> dict[str, Any]:
    """A cost table with every row skipped for one reason (the hardware is absent)."""
    skipped = [{"m": int(m), "n": int(n), "k": int(k), "choice": str(c), "reason": reason}
               for m, n, k, c in rows]
    return {"schema_version": SCHEMA_VERSION, "device": "unavailable", "torch": torch.__version__,
            "rows": [], "skipped": skipped}


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
    return write_json_atomic(path, table, indent=1)


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
    "Kernel",
    "compress_for",
    "make_layer_op",
    "prepare_linear",
    "read_cost_table",
    "run_microbench",
    "time_callable",
    "write_cost_table",
]
