"""What this CPU is and how fast it really is: flags, cores, caches, memory, and two short
measurements (memory bandwidth, GEMM rate per dtype) that become the `local` target.

Reading is Linux-first (/proc, /sys) with portable fallbacks; torch is imported only when
measuring, so probing flags stays cheap. Measurements are time-boxed (about 2 s on 2 cores).
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# Flags that change which kernels a runtime can use (x86 names from /proc/cpuinfo, Arm
# names from the `Features` line).
RELEVANT_FLAGS = (
    "avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8",
    "amx_fp16", "amx_tile", "asimd", "asimddp", "sve", "sve2", "bf16", "i8mm",
)
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
INT8_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8", "i8mm", "asimddp")
# Without a dot-product instruction, x86 int8 GEMMs still run natively on AVX2 (MLAS's
# vpmaddubsw/vpmaddwd kernels, ggml's AVX2 dot products) -- but torch's CPU `_int_mm` has no
# such kernel and measures an emulation ~50x slower, so on these CPUs the int8 rate is taken
# from ONNX Runtime's MatMulInteger, the kernel our CPU runtimes actually call.
INT8_AVX2_FLAGS = ("avx2",)


@dataclass(frozen=True)
class CpuInfo:
    """Static facts about this CPU (no measurement)."""

    model: str
    arch: str
    cores: int
    threads: int
    flags: frozenset[str]
    caches_kb: dict[str, int] = field(default_factory=dict)
    memory_gb: float = 0.0
    clock_ghz: float | None = None
    # x86: "family F model M stepping S", which tells CPU generations apart where a VM's
    # model name does not ("AMD EPYC"); ARM: implementer and part; else empty
    cpuid: str = ""

    def has_any(self, flags: tuple[str, ...]) -> bool:
        """True when any of `flags` is present."""
        return not self.flags.isdisjoint(flags)


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _cpuinfo_fields(text: str) -> tuple[dict[str, str], set[tuple[str, str]]]:
    first: dict[str, str] = {}
    cores: set[tuple[str, str]] = set()
    physical = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        first.setdefault(key, value)
        if key == "physical id":
            physical = value
        elif key == "core id":
            cores.add((physical, value))
    return first, cores


def _cpuid(fields: dict[str, str]) -> str:
    keys = (("cpu family", "family"), ("model", "model"), ("stepping", "stepping"))
    if all(fields.get(k) for k, _ in keys):
        return " ".join(f"{name} {fields[k]}" for k, name in keys)
    arm = (("CPU implementer", "implementer"), ("CPU part", "part"))
    if all(fields.get(k) for k, _ in arm):
        return " ".join(f"{name} {fields[k]}" for k, name in arm)
    return ""


def _caches_kb() -> dict[str, int]:
    caches: dict[str, int] = {}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        level = _read(str(index / "level")).strip()
        kind = _read(str(index / "type")).strip()
        size = _read(str(index / "size")).strip().upper()
        if not (level and size):
            continue
        label = f"L{level}" + {"Data": "d", "Instruction": "i"}.get(kind, "")
        scale = 1024 if size.endswith("M") else 1
        caches[label] = int(size.rstrip("KM")) * scale
    return caches


def _memory_gb() -> float:
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024 / 1e9
    return 0.0


def cpu_info() -> CpuInfo:
    """Read this machine's CPU facts; missing sources give empty fields, never errors."""
    fields, core_ids = _cpuinfo_fields(_read("/proc/cpuinfo"))
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = threads or 1
    siblings, per_socket = int(fields.get("siblings", 0) or 0), int(fields.get("cpu cores", 0) or 0)
    # A VM may expose SMT siblings as separate CPUs; count physical cores where we can.
    smt = siblings // per_socket if siblings and per_socket and siblings > per_socket else 1
    cores = min(len(core_ids) or threads, max(1, threads // smt))
    mhz = fields.get("cpu MHz")
    return CpuInfo(
        model=fields.get("model name") or platform.processor() or platform.machine(),
        arch=platform.machine(),
        cores=cores,
        threads=threads,
        flags=frozenset(flags.intersection(RELEVANT_FLAGS)),
        caches_kb=_caches_kb(),
        memory_gb=_memory_gb(),
        clock_ghz=float(mhz) / 1000 if mhz else None,
        cpuid=_cpuid(fields),
    )


def _best_seconds(step: Callable[[], object], budget_s: float, min_reps: int = 2) -> float:
    """Fastest of repeated runs of `step` within a time budget (after one warm-up)."""
    step()
    best, start, reps = float("inf"), time.perf_counter(), 0
    while reps < min_reps or time.perf_counter() - start < budget_s:
        t0 = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - t0)
        reps += 1
    return best


def measure_bandwidth(mbytes: int = 256, budget_s: float = 0.6) -> tuple[float, str]:
    """Read bandwidth in GB/s from a reduction over an array larger than typical caches.

    Decode streams weights, so a read-dominated sum is the relevant number; a copy (read
    plus write) is measured too and the higher of the two is kept.

    Returns:
        (GB/s, description of the method that produced it).
    """
    import torch

    src = torch.ones(mbytes * 2**20 // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    nbytes = src.numel() * 4
    read = nbytes / _best_seconds(src.sum, budget_s / 2) / 1e9
    copy = 2 * nbytes / _best_seconds(lambda: dst.copy_(src), budget_s / 2) / 1e9
    method = "sum (read)" if read >= copy else "copy (read + write)"
    return max(read, copy), f"torch {method} over {mbytes} MiB, best of repeated runs"


def _ort_int8_gemm(n: int) -> Callable[[], object]:
    """One n x n x n uint8 GEMM through ONNX Runtime's MatMulInteger (u8u8: no saturation)."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.integers(0, 255, (n, n), dtype=np.uint8), "B"),
             numpy_helper.from_array(np.array(128, np.uint8), "AZ"),
             numpy_helper.from_array(np.array(128, np.uint8), "BZ")]
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["A", "B", "AZ", "BZ"], ["Y"])], "int8_gemm",
        [helper.make_tensor_value_info("A", TensorProto.UINT8, [n, n])],
        [helper.make_tensor_value_info("Y", TensorProto.INT32, [n, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {"A": rng.integers(0, 255, (n, n), dtype=np.uint8)}
    return lambda: session.run(None, feed)


def measure_matmul(kind: str, budget_s: float = 0.4) -> tuple[float, int]:
    """Dense GEMM rate in TFLOP/s (TOP/s for int8) for "fp32", "bf16", "int8" (torch) or
    "int8_ort" (ONNX Runtime's MatMulInteger, for CPUs where torch has no int8 kernel).

    The square size grows from 512 until one multiply takes at least 20 ms, so small and
    large CPUs are both measured near their sustained rate within the budget.

    Returns:
        (rate in TFLOP/s, matrix size used).

    Raises:
        RuntimeError: torch has no kernel for the dtype on this CPU (e.g. int8).
    """
    import torch

    def make(n: int) -> Callable[[], object]:
        if kind == "int8_ort":
            return _ort_int8_gemm(n)
        if kind == "int8":
            a = torch.randint(-64, 64, (n, n), dtype=torch.int8)
            return lambda: torch._int_mm(a, a)
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[kind]
        a = torch.randn(n, n, dtype=dtype)
        return lambda: a @ a

    n = 512
    while True:
        step = make(n)
        step()  # the first call pays one-off kernel selection/JIT; time the second
        t0 = time.perf_counter()
        step()
        if time.perf_counter() - t0 >= 0.02 or n >= 4096:
            break
        n *= 2
    seconds = _best_seconds(step, budget_s)
    return 2 * n**3 / seconds / 1e12, n


__all__ = ["BF16_FLAGS", "CpuInfo", "INT8_AVX2_FLAGS", "INT8_FLAGS", "cpu_info", "measure_bandwidth", "measure_matmul"]
