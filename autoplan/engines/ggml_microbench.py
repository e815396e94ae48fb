"""Measured llama.cpp kernel times: the `local` cost table for `--runtime llama.cpp`.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import functools
import os
import re
import statistics
import subprocess
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from autoplan.backends.cpu.cost_cache import Row, cached_table, row_key
from autoplan.backends.cpu.ort_microbench import FLUSH_BYTES, ROTATE_BYTES
from autoplan.errors import UserInputError
from autoplan.formats import Choice, Precision, registered_formats
from autoplan.formats.gguf_blocks import gguf_type_name

if TYPE_CHECKING:
    from autoplan.models import LoadedModel

SCHEMA_VERSION = 1
METHOD = "ggml-backend-cpu+no-extra-bufts+rotate-copies+flush-96MB/v1"
MAX_COPIES = 8
BUILD_BYTES = 256 * 2**20  # fp32 source of one weight copy, quantized by ggml one at a time


def _ggml_type_ids() -> dict[Precision, int]:
    from gguf import GGMLQuantizationType

    return {s.precision: int(GGMLQuantizationType[gguf_type_name(s.precision)])
            for s in registered_formats() if gguf_type_name(s.precision)}


# ggml_type ids (ggml.h) of the precisions a GGUF stores, from their FormatSpecs' GGUF names
GGML_TYPE_IDS = _ggml_type_ids()
# Rows of source-file types autoplan does not plan with (e.g. Q4_K) carry this prefix.
SOURCE_PREFIX = "gguf:"


def ggml_type_id(choice: str) -> int:
    """The ggml type a row's choice runs (``gguf:Q4_K`` rows name a GGUF type directly).

    Raises:
        UserInputError: the precision has no GGUF type.
    """
    if choice.startswith(SOURCE_PREFIX):
        from gguf import GGMLQuantizationType

        return int(GGMLQuantizationType[choice[len(SOURCE_PREFIX):]])
    precision = Choice.parse(choice).precision
    if precision not in GGML_TYPE_IDS:
        raise UserInputError(f"llama.cpp has no kernel for {precision.value}: use a GGUF type "
                             f"({', '.join(p.value for p in GGML_TYPE_IDS)})")
    return GGML_TYPE_IDS[precision]


def _stored_bytes(n: int, k: int, ggml_type: int) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    return n * k // block * size


def copies_for(n: int, k: int, ggml_type: int) -> int:
    """Weight copies that exceed ROTATE_BYTES (so calls stream from memory), within limits."""
    want = -(-ROTATE_BYTES // max(1, _stored_bytes(n, k, ggml_type)))
    return int(max(1, min(MAX_COPIES, want, BUILD_BYTES // (n * k * 4))))


@functools.lru_cache(maxsize=1)
def engine_version() -> str:
    """llama-cpp-python's version in the engine venv (part of what a cached table is for)."""
    from autoplan.engines import engine_python

    code = "import importlib.metadata as m; print(m.version('llama-cpp-python'))"
    proc = subprocess.run([str(engine_python("llama.cpp")), "-c", code], capture_output=True,
                          text=True, check=False)
    return proc.stdout.strip() or "unknown"


def machine_key(threads: int | None = None) -> str:
    """CPU model, cores, llama-cpp-python version and threads: what a cached table is valid for."""
    from autoplan.backends.cpu.probe import cpu_info
    from autoplan.engines.llamacpp import default_threads

    info = cpu_info()
    slug = re.sub(r"[^a-z0-9]+", "-", info.model.lower()).strip("-") or "cpu"
    return f"ggml-{engine_version()}-{slug}-{info.cores}c-{threads or default_threads()}t"


def cache_path(threads: int | None = None) -> Path:
    from autoplan.cache_dir import cache_root

    return cache_root() / "cost_tables" / f"{machine_key(threads)}.json"


def empty_table(threads: int | None = None) -> dict[str, Any]:
    """The table's header on this machine (no rows)."""
    from autoplan.backends.cpu.probe import cpu_info
    from autoplan.engines.llamacpp import default_threads

    n_threads = threads or default_threads()
    return {"schema_version": SCHEMA_VERSION, "device": f"{cpu_info().model} ({n_threads} threads)",
            "runtime": "llama.cpp", "llama_cpp_python": engine_version(), "threads": n_threads,
            "includes_dispatch": True, "method": METHOD}


def measure_rows(wanted: Iterable[Row], threads: int | None = None, *,
                 path: str | Path | None = None, refresh: bool = False,
                 progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The cost table holding every wanted row (cached rows reused, missing ones timed in one
    ggml worker, the table written back; path default cache_path(threads))."""
    from autoplan.engines.llamacpp import GgmlWorker

    worker: list[GgmlWorker] = []  # started on the first missing row only

    def time_row(row: Row) -> dict[str, Any]:
        m, n, k, choice = row
        if not worker:
            worker.append(GgmlWorker(threads))
        ggml_type = ggml_type_id(choice)
        timing = worker[0].time(m, n, k, ggml_type, copies=copies_for(n, k, ggml_type),
                                flush_bytes=FLUSH_BYTES)
        return {"m": m, "n": n, "k": k, "choice": choice, "kernel": "ggml_mul_mat",
                "ggml_type": ggml_type, "load_avg_1m": round(os.getloadavg()[0], 2), **timing}

    p = Path(path) if path is not None else cache_path(threads)
    try:
        return cached_table(p, empty_table(threads), wanted, time_row,
                            match=("runtime", "threads", "llama_cpp_python", "method"),
                            refresh=refresh, progress=progress, label="ggml kernel")
    finally:
        if worker:
            worker[0].close()


def source_decisions(loaded: LoadedModel) -> dict[str, str]:
    """layer -> the row choice of the tensor its source GGUF stores (a tied lm_head runs the
    token embedding); planned precisions by name, other GGUF types as ``gguf:TYPE``."""
    from gguf import GGUFReader

    from autoplan.export.gguf import source_gguf
    from autoplan.models.gguf_convert import hf_to_gguf_names

    reader = GGUFReader(str(source_gguf(loaded)))
    types = {t.name: int(t.tensor_type) for t in reader.tensors}
    names = {t.name: t.tensor_type.name for t in reader.tensors}
    hf_names = hf_to_gguf_names(loaded.model, loaded.spec.n_layers)
    by_id = {v: k for k, v in GGML_TYPE_IDS.items()}
    out: dict[str, str] = {}
    for layer in loaded.spec.layers:
        tensor = hf_names.get(f"{layer.name}.weight", "")
        tensor = tensor if tensor in types else "token_embd.weight"  # a tied lm_head
        precision = by_id.get(types[tensor])
        out[layer.name] = str(Choice.parse(precision.value)) if precision else \
            f"{SOURCE_PREFIX}{names[tensor]}"
    return out


def decode_rows(spec: Any, batch: int, decisions: Mapping[str, str]) -> list[Row]:
    """One decode-step row per linear layer (m = batch), as llama.cpp runs them."""
    rows = []
    for layer in spec.layers:
        choice = decisions[layer.name]
        key = (batch, layer.out_features, layer.in_features, choice)
        rows.append(key if choice.startswith(SOURCE_PREFIX) else row_key(*key))
    return rows


def decode_step_seconds(gguf: Path, input_len: int, output_len: int,
                        threads: int | None = None, repeats: int = 3) -> float:
    """Median over ``repeats`` of the mean greedy decode step of a GGUF in llama.cpp (a
    prompt of ``input_len`` tokens, ``output_len`` new tokens: the mean context of the
    workload's decode steps)."""
    from autoplan.engines.llamacpp import LlamaCppWorker

    ids = np.random.default_rng(0).integers(100, 20000, size=(1, input_len))
    with LlamaCppWorker(gguf, threads=threads, n_ctx=input_len + output_len + 8) as worker:
        worker.generate(ids[:, :8], 4)  # warm-up
        runs = [float(np.mean(worker.generate(ids, output_len).step_s))
                for _ in range(repeats)]
    return statistics.median(runs)


def _runs(layer: Any, spec: Any, batch: int) -> float:
    """How often a decode step runs a layer: a routed expert only when a token of the batch
    picks it (uniform routing: top_k / E per token), every other layer once."""
    if layer.expert < 0 or spec.moe is None:
        return 1.0
    from autoplan.cost.moe import touched

    return touched(spec.moe.top_k / spec.moe.n_experts, batch)


def non_gemm_decode(loaded: LoadedModel, workload: Any, threads: int | None = None,
                    progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measured non-GEMM seconds of a decode step: the source GGUF's decode step minus its
    own measured mul_mats (batch 1 only, like the ORT measurement)."""
    decisions = source_decisions(loaded)
    rows = decode_rows(loaded.spec, workload.batch, decisions)
    table = measure_rows(rows, threads, progress=progress)
    times = {(r["m"], r["n"], r["k"], r["choice"]): r["median_us"] * 1e-6 for r in table["rows"]}
    gemm = sum(times[r] * _runs(layer, loaded.spec, workload.batch)
               for r, layer in zip(rows, loaded.spec.layers))
    if progress:
        progress(f"timing the source GGUF's decode step in llama.cpp ({workload.input_len} in, "
                 f"{workload.output_len} out)")
    from autoplan.export.gguf import source_gguf

    step = decode_step_seconds(source_gguf(loaded), workload.input_len, workload.output_len,
                               threads)
    load = round(os.getloadavg()[0], 2)
    # A non-positive difference (kernels timed slower alone than inside the model) cannot
    # stand for the rest of the step: the analytic fixed terms are kept then.
    return {"non_gemm_decode_s": step - gemm if step > gemm else None,
            "source_decode_step_s": step, "source_gemm_s": gemm,
            "source_gguf": source_gguf(loaded).name, "source_load_avg_1m": load}


def search_kernel_table(loaded: LoadedModel, space: Any, workload: Any, threads: int | None = None,
                        progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measured ggml rows for every (layer, choice) a llama.cpp search may pick, at the
    workload's decode and prefill shapes (backends.cpu.predict.kernel_rows, unpacked), plus the
    measured non-GEMM decode step when the model came from a GGUF and the batch is 1."""
    from autoplan.backends.cpu.predict import kernel_rows

    wl = {"concurrency": workload.batch, "input_len": workload.input_len,
          "output_len": workload.output_len}
    rows: list[Row] = []
    for choice in dict.fromkeys((space.baseline, *space.all_choices)):
        decisions = {layer.name: choice for unit in space.units if choice in unit.choices
                     for layer in unit.layers}
        rows += kernel_rows(loaded.spec, wl, decisions)
    rows = list(dict.fromkeys(rows))
    table = measure_rows(rows, threads, progress=progress)
    keep = set(rows)
    doc = {**table, "rows": [r for r in table["rows"]
                             if (r["m"], r["n"], r["k"], r["choice"]) in keep]}
    source = getattr(loaded, "source", None)
    if workload.batch == 1 and source is not None and source.path.suffix.lower() == ".gguf":
        doc.update(non_gemm_decode(loaded, workload, threads, progress))
    return doc


__all__ = ["GGML_TYPE_IDS", "METHOD", "SOURCE_PREFIX", "cache_path", "copies_for",
           "decode_rows", "decode_step_seconds", "empty_table", "engine_version",
           "ggml_type_id", "machine_key", "measure_rows", "non_gemm_decode",
           "search_kernel_table", "source_decisions"]
