"""Measured llama.cpp kernel times: the `local` cost table for `--runtime llama.cpp`.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import functools
import os
import re
import statistics
import subprocess
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from autoplan.backends.cpu.cost_cache import Row, cached_table, nearest_rank, row_key
from autoplan.backends.cpu.ort_microbench import FLUSH_BYTES, ROTATE_BYTES
from autoplan.errors import AutoplanError, UserInputError
from autoplan.formats import Choice, Precision, registered_formats
from autoplan.formats.gguf_blocks import gguf_type_name

if TYPE_CHECKING:
    from autoplan.models import LoadedModel

SCHEMA_VERSION = 1
# v2: interleaved trials, a row's time is its quiet trials' median run (v1: the median of
# back-to-back runs, which a loaded machine inflated up to 135x; such tables are re-measured)
# v3: a shape's rows are timed in one session (cost_cache.cached_table); v2 tables grew
# across sessions
METHOD = "ggml-backend-cpu+no-extra-bufts+rotate-copies-m1+flush-96MB+quiet-trial-median+cpu-clock-1t/v3"
MAX_COPIES = 8
BUILD_BYTES = 256 * 2**20  # fp32 source of one weight copy, quantized by ggml one at a time
QUIET_RANK = 2  # the time is the QUIET_RANK-th lowest trial median
TRIALS = 8  # trials per attempt, each row's interleaved with the other rows of its group
ATTEMPTS = 4  # attempts (TRIALS more trials each) before a row is refused
SPREAD_BOUND = 0.25  # the two interleaved halves' times may differ by this (relative) ...
SPREAD_FLOOR_US = 2.0  # ... or by this many microseconds
GROUP_BYTES = 768 * 2**20  # weight copies built at once for interleaving
GROUP_ROWS = 8


def _ggml_type_ids() -> dict[Precision, int]:
    from gguf import GGMLQuantizationType

    return {s.precision: int(GGMLQuantizationType[gguf_type_name(s.precision)])
            for s in registered_formats() if gguf_type_name(s.precision)}


# ggml_type ids (ggml.h) of the precisions a GGUF stores, from their FormatSpecs' GGUF names
GGML_TYPE_IDS = _ggml_type_ids()
_PLANNED_OF_TYPE = {v: k for k, v in GGML_TYPE_IDS.items()}  # ggml type id -> Precision
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
            "includes_dispatch": True, "method": METHOD, "clock": clock_for(n_threads),
            "time": "the second lowest of interleaved trials' median runs (median_us); "
                    "halves_us: the same over even and odd trials",
            "spread_bound": SPREAD_BOUND}


def quiet_time(trials: list[list[float]]) -> dict[str, Any]:
    """A kernel's time from trials of timed runs (microseconds, trials in the order they ran).

    The time is the median run of the quietest trials: the second lowest of the trials'
    medians (QUIET_RANK). Contention only ever adds time, and a dedicated machine sees the
    uncontended time; a median within the trial keeps one lucky run from setting it, and the
    second lowest keeps one lucky trial from it. Its repeatability is the same statistic
    over the even and over the odd trials (``halves_us``: interleaved in time, so a burst of
    load hits both alike); ``spread`` is their relative difference. The distribution of
    every run is kept beside it (``p10_us``, ``p90_us``, ``samples_median_us``): on a loaded
    machine it is far wider than the time's spread.
    """
    if len(trials) < 2 * QUIET_RANK or any(not t for t in trials):
        raise ValueError(f"quiet_time needs at least {2 * QUIET_RANK} non-empty trials")
    medians = [statistics.median(t) for t in trials]

    def low(values: list[float]) -> float:
        return sorted(values)[QUIET_RANK - 1]

    halves = sorted((low(medians[0::2]), low(medians[1::2])))
    runs = [x for t in trials for x in t]
    return {"median_us": low(medians), "halves_us": halves,
            "spread": halves[1] / halves[0] - 1 if halves[0] > 0 else float("inf"),
            "p10_us": nearest_rank(runs, 0.1), "p90_us": nearest_rank(runs, 0.9),
            "samples_median_us": statistics.median(runs),
            "trial_medians_us": [round(x, 3) for x in medians], "trials": len(trials),
            "runs_per_trial": len(trials[0])}


def repeatable(timing: Mapping[str, Any]) -> bool:
    """The halves agree within SPREAD_BOUND (relative) or SPREAD_FLOOR_US."""
    lo, hi = timing["halves_us"]
    return hi - lo <= max(SPREAD_BOUND * lo, SPREAD_FLOOR_US)


def _refusal(what: str, timing: Mapping[str, Any], threads: int) -> UserInputError:
    lo, hi = timing["halves_us"]
    fewer = f" or with fewer threads (--threads {threads - 1})" if threads > 1 else ""
    return UserInputError(
        f"ggml timings of {what} did not repeat on this machine (quiet trials "
        f"{lo:.1f} vs {hi:.1f} us, {timing['spread']:.0%} apart > {SPREAD_BOUND:.0%} after "
        f"{timing['trials']} trials; load average {os.getloadavg()[0]:.1f}): rerun on a "
        f"quieter machine{fewer}")


def _groups(rows: list[tuple[Row, int, int]]) -> Iterator[list[tuple[Row, int, int]]]:
    """Rows (row, ggml type, copies) in groups built at once (GROUP_BYTES, GROUP_ROWS)."""
    group: list[tuple[Row, int, int]] = []
    size = 0
    for item in rows:
        (_, n, k, _), ggml_type, copies = item
        nbytes = copies * _stored_bytes(n, k, ggml_type)
        if group and (len(group) >= GROUP_ROWS or size + nbytes > GROUP_BYTES):
            yield group
            group, size = [], 0
        group.append(item)
        size += nbytes
    if group:
        yield group


def clock_for(threads: int) -> str:
    """What a run's time is read from: the process's CPU time with one thread (its run
    without the waits for a core a loaded machine adds), wall time with more (their
    barriers spin, so CPU time would count a peer's wait as work)."""
    return "cpu" if threads == 1 else "wall"


def _time_group(worker: Any, group: list[tuple[Row, int, int]], threads: int,
                progress: Callable[[str], None] | None) -> Iterator[dict[str, Any]]:
    """Each row of a group timed in trials interleaved with the group's other rows; a row
    whose halves disagree gets TRIALS more trials, up to ATTEMPTS; then it is refused (the
    group's repeatable rows are yielded first)."""
    built = {}
    try:
        for row, ggml_type, copies in group:
            m, n, k, _ = row
            info = worker.build(m, n, k, ggml_type, copies=copies)
            runs = 5 if info["once_us"] * info["copies"] < 20_000 else 3
            built[row] = (info["id"], runs, ggml_type, info["copies"])
        trials: dict[Row, list[list[float]]] = {row: [] for row, _, _ in group}
        loads: list[float] = []
        pending = list(trials)
        timing: dict[Row, dict[str, Any]] = {}
        for attempt in range(ATTEMPTS):
            for _ in range(TRIALS):
                loads.append(os.getloadavg()[0])
                for row in pending:
                    graph_id, runs, _, _ = built[row]
                    trials[row].append(worker.trial(graph_id, runs, FLUSH_BYTES,
                                                    clock=clock_for(threads)))
            for row in pending:
                timing[row] = quiet_time(trials[row])
            pending = [row for row in pending if not repeatable(timing[row])]
            if not pending:
                break
            if progress:
                progress(f"{len(pending)} ggml kernel rows not repeatable after attempt "
                         f"{attempt + 1}: timing them again")
        for row, _, _ in group:
            if row in pending:
                continue
            m, n, k, choice = row
            _, _, ggml_type, copies = built[row]
            yield {"m": m, "n": n, "k": k, "choice": choice, "kernel": "ggml_mul_mat",
                   "ggml_type": ggml_type, "copies": copies, "clock": clock_for(threads),
                   "load_avg_1m": round(statistics.median(loads), 2), **timing[row]}
        if pending:
            m, n, k, choice = pending[0]
            raise _refusal(f"m={m} n={n} k={k} {choice}", timing[pending[0]], threads)
    finally:
        for graph_id, _, _, _ in built.values():
            worker.drop(graph_id)


def measure_rows(wanted: Iterable[Row], threads: int | None = None, *,
                 path: str | Path | None = None, refresh: bool = False,
                 progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The cost table holding every wanted row (cached rows reused, missing ones timed in one
    ggml worker in interleaved trials, the table written back; path default
    cache_path(threads)).

    Raises:
        UserInputError: a row's time did not repeat (see quiet_time, repeatable) after
            ATTEMPTS x TRIALS trials; the rows timed before it are kept in the cache.
    """
    from autoplan.engines.llamacpp import GgmlWorker, default_threads

    n_threads = threads or default_threads()

    def time_rows(missing: list[Row]) -> Iterator[dict[str, Any]]:
        if not missing:
            return
        items = []
        for row in missing:
            m, n, k, choice = row
            ggml_type = ggml_type_id(choice)
            # m > 1 (prefill): each weight serves m rows, so the call is compute-bound and
            # one cold copy (the flush evicts it) is what a prefill reads; rotating copies
            # would only make the run longer than a scheduler slice on a loaded machine
            copies = copies_for(n, k, ggml_type) if m == 1 else 1
            items.append((row, ggml_type, copies))
        with GgmlWorker(threads) as worker:
            done = 0
            for group in _groups(items):
                for out in _time_group(worker, group, n_threads, progress):
                    done += 1
                    yield out
                if progress:
                    progress(f"ggml kernel {done}/{len(missing)} timed")

    p = Path(path) if path is not None else cache_path(threads)
    return cached_table(p, empty_table(threads), wanted, None,
                        match=("runtime", "threads", "llama_cpp_python", "method"),
                        refresh=refresh, progress=progress, label="ggml kernel",
                        time_rows=time_rows)


def source_decisions(loaded: LoadedModel) -> dict[str, str]:
    """layer -> the row choice of the tensor its source GGUF stores (a tied lm_head runs the
    token embedding); planned precisions by name, other GGUF types as ``gguf:TYPE``."""
    from autoplan.export.gguf import source_gguf
    from autoplan.models.gguf_convert import hf_to_gguf_names
    from autoplan.models.gguf_gptoss import gate_up_tensors
    from autoplan.models.gguf_read import gguf_reader

    reader = gguf_reader(source_gguf(loaded))
    by_name = {t.name: t for t in reader.tensors}
    types = {n: int(t.tensor_type) for n, t in by_name.items()}
    names = {n: t.tensor_type.name for n, t in by_name.items()}
    hf_names = hf_to_gguf_names(loaded.model, loaded.spec.n_layers)
    out: dict[str, str] = {}
    for layer in loaded.spec.layers:
        tensor = hf_names.get(f"{layer.name}.weight", "")
        if layer.expert >= 0 and layer.name.endswith(".gate_up_proj"):
            # gpt-oss's interleaved gate_up: one fused stack, or the gate and up stacks
            # llama.cpp's converter splits it into. One decision holds both, so stacks of two
            # types are no planned choice (timed as the gate's type, a ``gguf:`` row, which
            # also keeps the file from being the "as is" candidate)
            found = [t.name for t in gate_up_tensors(by_name, layer.block, "weight")
                     if t is not None]
            if len({types[t] for t in found}) > 1:
                out[layer.name] = f"{SOURCE_PREFIX}{names[found[0]]}"
                continue
            tensor = found[0]
        if tensor not in types:
            tensor = _missing_tensor(layer, tensor, types)
        precision = _PLANNED_OF_TYPE.get(types[tensor])
        out[layer.name] = str(Choice.parse(precision.value)) if precision else \
            f"{SOURCE_PREFIX}{names[tensor]}"
    return out


def _missing_tensor(layer: Any, tensor: str, types: Mapping[str, int]) -> str:
    """The tensor llama.cpp runs for `layer` when the GGUF has none of its own name: the
    token embedding for an lm_head without ``output.weight`` (llama.cpp ties them then).

    Raises:
        AutoplanError: any other layer; timing it as some other tensor's type would price
            the plan's source wrongly.
    """
    if layer.role == "lm_head" and "token_embd.weight" in types:
        return "token_embd.weight"
    raise AutoplanError(f"the source GGUF holds no tensor for {layer.name} "
                        f"({tensor or 'no llama.cpp name'}): re-convert the model with "
                        "llama.cpp's convert_hf_to_gguf.py")


def decode_rows(spec: Any, batch: int, decisions: Mapping[str, str]) -> list[Row]:
    """One decode-step row per linear layer (m = batch), as llama.cpp runs them."""
    rows = []
    for layer in spec.layers:
        choice = decisions[layer.name]
        key = (batch, layer.out_features, layer.in_features, choice)
        rows.append(key if choice.startswith(SOURCE_PREFIX) else row_key(*key))
    return rows


def decode_step_seconds(gguf: Path, input_len: int, output_len: int,
                        threads: int | None = None, repeats: int = 4) -> dict[str, Any]:
    """The greedy decode step of a GGUF in llama.cpp (a prompt of ``input_len`` tokens,
    ``output_len`` new tokens: their median step is at the workload's mean context), timed
    as the kernels are: each generation a trial, the step its median, the second lowest of
    those
    (quiet_time), ``repeats`` more generations while the halves disagree, ATTEMPTS at most.

    Returns:
        quiet_time's fields in microseconds, plus ``step_s`` (the step in seconds).

    Raises:
        UserInputError: the step did not repeat (see repeatable).
    """
    from autoplan.engines.llamacpp import LlamaCppWorker, default_threads

    ids = np.random.default_rng(0).integers(100, 20000, size=(1, input_len))
    n_threads = threads or default_threads()
    field = "step_cpu_s" if clock_for(n_threads) == "cpu" else "step_s"
    trials: list[list[float]] = []
    with LlamaCppWorker(gguf, threads=threads, n_ctx=input_len + output_len + 8) as worker:
        worker.generate(ids[:, :8], 4)  # warm-up
        for _ in range(ATTEMPTS):
            for _ in range(repeats):
                out = worker.ask({"op": "generate", "ids": ids.tolist(), "n": output_len})
                trials.append([s * 1e6 for s in out[field]])
            timing = quiet_time(trials)
            if repeatable(timing):
                return {**timing, "step_s": timing["median_us"] * 1e-6,
                        "clock": clock_for(n_threads)}
    raise _refusal(f"the decode step of {gguf.name}", timing, n_threads)


def _runs(layer: Any, spec: Any, batch: int) -> float:
    """How often a decode step runs a layer: a routed expert only when a token of the batch
    picks it (uniform routing: top_k / E per token), every other layer once."""
    if layer.expert < 0 or spec.moe is None:
        return 1.0
    from autoplan.cost.moe import touched

    return touched(spec.moe.top_k / spec.moe.n_experts, batch)


def source_embedding(loaded: LoadedModel) -> dict[str, Any]:
    """How the model's source GGUF stores the input embedding (gguf_embedding)."""
    from autoplan.export.gguf import source_gguf

    return gguf_embedding(source_gguf(loaded))


def gguf_embedding(path: Path) -> dict[str, Any]:
    """How a GGUF stores the input embedding (token_embd), which a GGUF export copies as it
    is: its ggml type, bits per weight, and the planned choice of that type (None for a type
    autoplan does not plan, e.g. Q6_K); {} when the file has none. Header only."""
    from gguf import GGML_QUANT_SIZES

    from autoplan.models.gguf_read import gguf_reader

    tensor = next((t for t in gguf_reader(path).tensors if t.name == "token_embd.weight"), None)
    if tensor is None:
        return {}
    block, size = GGML_QUANT_SIZES[tensor.tensor_type]
    precision = _PLANNED_OF_TYPE.get(int(tensor.tensor_type))
    return {"ggml_type": tensor.tensor_type.name, "bits": 8.0 * size / block,
            "choice": f"dense+{precision.value}" if precision is not None else None}


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

    timing = decode_step_seconds(source_gguf(loaded), workload.input_len, workload.output_len,
                                 threads)
    step = timing["step_s"]
    load = round(os.getloadavg()[0], 2)
    # A non-positive difference (kernels timed slower alone than inside the model) cannot
    # stand for the rest of the step: the analytic fixed terms are kept then.
    return {"non_gemm_decode_s": step - gemm if step > gemm else None,
            "source_decode_step_s": step, "source_gemm_s": gemm,
            "source_decode_step_spread": timing["spread"],
            "source_decode_step_trials": timing["trials"], "source_decode_clock": timing["clock"],
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
    if source is not None and source.path.suffix.lower() == ".gguf":
        doc["embedding"] = source_embedding(loaded)  # a GGUF export keeps it: memory
        if workload.batch == 1:
            doc.update(non_gemm_decode(loaded, workload, threads, progress))
    return doc


__all__ = ["GGML_TYPE_IDS", "METHOD", "SOURCE_PREFIX", "SPREAD_BOUND", "cache_path",
           "copies_for", "decode_rows", "decode_step_seconds", "empty_table", "engine_version",
           "ggml_type_id", "gguf_embedding", "machine_key", "measure_rows", "non_gemm_decode",
           "quiet_time", "repeatable", "search_kernel_table", "source_decisions",
           "source_embedding", "clock_for"]
