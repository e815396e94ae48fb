"""Measured ONNX Runtime kernel times for linear-layer shapes: the `local` cost table.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import os
import re
import statistics
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from autoplan.backends.cpu.cost_cache import Row, cached_table, key_of, nearest_rank, row_key
from autoplan.errors import UserInputError
from autoplan.formats import Choice

SCHEMA_VERSION = 1
# How rows are timed; a cached table timed another way is re-measured.
METHOD = "rotate-copies+flush-96MB/v2"  # v2: accuracy_level follows the format
ROTATE_BYTES = 64 * 2**20  # > 2x the L3 of the dev box (32 MB)
FLUSH_BYTES = 96 * 2**20  # read before each timed run: evicts L2/L3
MAX_COPIES = 8
BUILD_BYTES = 256 * 2**20  # fp32 weights held while building one graph


def copies_for(n: int, k: int, choice: Choice) -> int:
    """Weight copies that exceed ROTATE_BYTES (so calls stream from memory), within limits."""
    stored = max(1.0, n * k * choice.precision.info.weight_bits / 8)
    fp32 = n * k * 4
    want = -(-ROTATE_BYTES // stored)
    return int(max(1, min(MAX_COPIES, want, BUILD_BYTES // fp32)))


def build_graph(m: int, n: int, k: int, choice: Choice | str, copies: int = 1, seed: int = 0,
                data: Any = None):
    """ONNX model with `copies` independent [m, k] x [k, n] linear nodes in the given format
    (`data`: an onnx_data.TensorFile the fp32 weights go to as they are drawn, not kept)."""
    import onnx
    from autoplan.backends.cpu.onnx_graph import OPSET
    from autoplan.backends.cpu.ort_quant import ort_node, quantize_graph
    from onnx import TensorProto, helper, numpy_helper

    c = Choice.parse(choice) if isinstance(choice, str) else choice
    rng = np.random.default_rng(seed)
    base = (rng.standard_normal((k, n), dtype=np.float32) * 0.02).astype(np.float32)
    nodes, inits, inputs, outputs = [], [], [], []
    for i in range(copies):
        name = f"linear{i}"
        w = base if i == 0 else np.roll(base, i, axis=0)
        inits.append(numpy_helper.from_array(np.ascontiguousarray(w), f"{name}.weight_t")
                     if data is None else data.add(f"{name}.weight_t", w))
        nodes.append(helper.make_node("MatMul", [f"x{i}", f"{name}.weight_t"], [f"y{i}"],
                                      name=name))
        inputs.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, [m, k]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [m, n]))
    graph = helper.make_graph(nodes, "linear_microbench", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = min(model.ir_version, 9)
    node = ort_node(c.precision)
    decisions = {f"linear{i}": c for i in range(copies)} if node.op != "MatMul" else {}
    records = quantize_graph(model, decisions, base_dir=None if data is None else data.path.parent)
    kernel = records[0].op_type if records else "MatMul"
    if node.op == "MatMulInteger":
        kernel = "DynamicQuantizeMatMul"  # what ORT fuses the int8 pattern into
    del onnx
    return model, kernel


def _session(model, threads: int | None, spinning: bool):
    import onnxruntime as ort
    from autoplan.backends.cpu.ort_runtime import session_options

    opts = session_options(threads, spinning=spinning)
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def _row_session(m: int, n: int, k: int, c: Choice, copies: int, threads: int | None,
                 spinning: bool):
    """The row's session, built from files: its weights are never held in a ModelProto or
    its serialization (a 262k-vocabulary lm_head row is a 0.67 GB fp32 weight)."""
    import tempfile

    import onnx
    import onnxruntime as ort
    from autoplan.backends.cpu.onnx_data import TensorFile
    from autoplan.backends.cpu.ort_runtime import session_options

    with tempfile.TemporaryDirectory(prefix="autoplan-row-") as tmp:
        data = TensorFile(Path(tmp) / "weights.data")
        try:
            model, kernel = build_graph(m, n, k, c, copies, data=data)
        finally:
            data.close()
        onnx.save_model(model, str(Path(tmp) / "row.onnx"))
        del model
        opts = session_options(threads, spinning=spinning)
        sess = ort.InferenceSession(str(Path(tmp) / "row.onnx"), opts,
                                    providers=["CPUExecutionProvider"])
    return sess, kernel


def time_row(m: int, n: int, k: int, choice: Choice | str, threads: int | None = None,
             repeats: int | None = None, warmup: int = 3, min_seconds: float = 0.3,
             flush_cache: bool = True, spinning: bool = True) -> dict[str, Any]:
    """Build, run and time one row; per-call microseconds (median, p10, p90), each timed run
    starting from evicted caches (flush_cache).

    A row whose fp32 weight is over BUILD_BYTES (a 262k-vocabulary lm_head: 0.67 GB) is
    timed in column slices of at most BUILD_BYTES, one session at a time, and their times
    summed (`slices` in the row): the session and its prepacked copy of a whole weight
    held it twice on top of the process (bench peaked there). A GEMM that large streams
    its weight from memory, so its time is the sum of its column slices'."""
    c = Choice.parse(choice) if isinstance(choice, str) else choice
    slices = max(1, -(-(n * k * 4) // BUILD_BYTES))
    width = -(-n // slices)
    parts = [_time_part(m, min(width, n - start), k, c, threads, repeats, warmup, min_seconds,
                        flush_cache, spinning) for start in range(0, n, width)]
    kernel, copies, repeats = parts[0]["kernel"], parts[0]["copies"], parts[0]["repeats"]
    from autoplan.backends.cpu.ort_quant import ort_node

    level = ort_node(c.precision).accuracy_level if kernel == "MatMulNBits" else None
    m_, n_, k_, choice_s = row_key(m, n, k, c)
    row = {"m": m_, "n": n_, "k": k_, "choice": choice_s, "accuracy_level": level,
           "kernel": kernel, "copies": copies, "repeats": repeats,
           **{f"{q}_us": sum(part[q] for part in parts) for q in ("median", "p10", "p90")}}
    if len(parts) > 1:
        row["slices"] = len(parts)
    return row


def _time_part(m: int, n: int, k: int, c: Choice, threads: int | None, repeats: int | None,
               warmup: int, min_seconds: float, flush_cache: bool, spinning: bool
               ) -> dict[str, Any]:
    """One [m, k] x [k, n] GEMM timed in its own session (released on return)."""
    copies = copies_for(n, k, c)
    sess, kernel = _row_session(m, n, k, c, copies, threads, spinning)
    io = sess.io_binding()
    x = (np.random.default_rng(1).standard_normal((m, k), dtype=np.float32) * 0.5)
    for i in range(copies):
        io.bind_cpu_input(f"x{i}", x)
        io.bind_output(f"y{i}", "cpu")
    flush = np.ones(FLUSH_BYTES // 8, dtype=np.float64) if flush_cache else None
    for _ in range(max(1, warmup)):
        sess.run_with_iobinding(io)
    if repeats is None:  # enough runs for ~min_seconds, within [5, 50]
        t0 = time.perf_counter()
        sess.run_with_iobinding(io)
        once = time.perf_counter() - t0
        repeats = int(min(50, max(5, min_seconds / max(once, 1e-6))))
    samples = []
    for _ in range(repeats):
        if flush is not None:
            flush.sum()
        t0 = time.perf_counter()
        sess.run_with_iobinding(io)
        samples.append((time.perf_counter() - t0) * 1e6 / copies)
    return {"kernel": kernel, "copies": copies, "repeats": repeats,
            "median": statistics.median(samples), "p10": nearest_rank(samples, 0.1),
            "p90": nearest_rank(samples, 0.9)}


def machine_key(threads: int | None = None, spinning: bool = True) -> str:
    """CPU model, cores, ORT version, threads and spinning: what a cached table is valid for."""
    import onnxruntime as ort
    from autoplan.backends.cpu.ort_runtime import physical_cores
    from autoplan.backends.cpu.probe import cpu_info

    info = cpu_info()
    slug = re.sub(r"[^a-z0-9]+", "-", info.model.lower()).strip("-") or "cpu"
    spin = "" if spinning else "-nospin"
    return f"ort-{ort.__version__}-{slug}-{info.cores}c-{threads or physical_cores()}t{spin}"


def cache_path(threads: int | None = None, spinning: bool = True) -> Path:
    from autoplan.cache_dir import cache_root

    return cache_root() / "cost_tables" / f"{machine_key(threads, spinning)}.json"


def empty_table(threads: int | None = None, spinning: bool = True) -> dict[str, Any]:
    import onnxruntime as ort
    from autoplan.backends.cpu.ort_runtime import physical_cores
    from autoplan.backends.cpu.probe import cpu_info

    info = cpu_info()
    n_threads = threads or physical_cores()
    return {"schema_version": SCHEMA_VERSION, "device": f"{info.model} ({n_threads} threads)",
            "runtime": "onnxruntime", "onnxruntime": ort.__version__, "threads": n_threads,
            "includes_dispatch": True, "method": METHOD, "spinning": spinning, "rows": [],
            "skipped": []}


def measure_rows(wanted: Iterable[Row], threads: int | None = None, *,
                 path: str | Path | None = None, refresh: bool = False,
                 progress=None, spinning: bool = True) -> dict[str, Any]:
    """The cost table holding every wanted row: cached rows are reused, missing ones timed
    and the table written back (path: default cache_path(threads, spinning))."""
    p = Path(path) if path is not None else cache_path(threads, spinning)
    return cached_table(
        p, empty_table(threads, spinning), wanted,
        lambda row: time_row(*row, threads, spinning=spinning),
        match=("runtime", "threads", "onnxruntime", "method", "spinning"), refresh=refresh,
        progress=progress, label="ORT kernel")


def select(table: dict[str, Any], wanted: Iterable[Row]) -> dict[str, Any]:
    """A copy of the table with only the wanted rows (so one artifact's fusion never
    borrows another's row)."""
    keep = set(wanted)
    rows = [r for r in table["rows"] if key_of(r) in keep]
    if len({key_of(r) for r in rows}) < len(keep):
        missing = keep - {key_of(r) for r in rows}
        raise UserInputError(f"cost table lacks {len(missing)} measured row(s), e.g. "
                             f"{min(missing, key=str)}")
    return {**table, "rows": rows}


def _decoder_session(path: Path, threads: int | None, spinning: bool):
    import onnxruntime as ort
    from autoplan.backends.cpu.ort_runtime import session_options

    opts = session_options(threads, spinning=spinning)
    opts.add_session_config_entry("optimization.disable_specified_optimizers", "ConstantFolding")
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _external_files(tensors: list) -> set[str]:
    """The data files (relative to the model) that these initializers' weights lie in."""
    from onnx import TensorProto

    return {entry.value for t in tensors if t.data_location == TensorProto.EXTERNAL
            for entry in t.external_data if entry.key == "location"}


def non_gemm_decode_seconds(model_path: str | Path, context: int, threads: int | None = None,
                            window: int = 64, repeats: int = 3, spinning: bool = True) -> float:
    """Seconds per decode step of an exported decoder with its linear layers taken out.

    Every linear node (a MatMul whose weight is an initializer: the fp32 baseline export) is
    replaced by a constant zero output of its shape at decode ([1, 1, n]), so what is left
    -- embedding gather, norms, rotary + GroupQueryAttention over the KV cache, residual adds,
    the SiLU gate, the executor's per-node dispatch, the Python loop with its argmax -- runs
    exactly as in the decoder, through the same OrtGenerator. Timed over `window` decode
    steps centred on `context` (prompt of one token, so the constants' shapes fit), median
    of `repeats`. This is the measured counterpart of the cost model's analytic fixed terms.
    """
    import tempfile

    import onnx
    from autoplan.backends.cpu.onnx_graph import TIED_OP
    from autoplan.backends.cpu.ort_runtime import OrtGenerator
    from onnx import numpy_helper

    path = Path(model_path)
    path = path / "model.onnx" if path.is_dir() else path
    # the graph without its weights: the kept ones stay in the export's data file (hard-
    # linked below; ORT refuses a symlink out of the model's folder), so the model is not
    # copied into protobuf (a 262k-vocabulary export's embedding and lm_head are 1.3 GB:
    # loading and re-saving them peaked bench at 7 GB). Across file systems: loaded.
    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    removed, nodes, consts = set(), [], []
    for node in graph.node:
        # a MatMul's weight is [k, n]; a tied lm_head reads the embedding [n, k] transposed
        tied = node.op_type == TIED_OP
        if (node.op_type == "MatMul" or tied) and node.input[1] in inits:
            n = int(inits[node.input[1]].dims[0 if tied else -1])
            name = f"{node.name}.const_out"
            consts.append(numpy_helper.from_array(np.zeros((1, 1, n), np.float32), name))
            nodes.append(onnx.helper.make_node("Identity", [name], list(node.output),
                                               name=node.name))
            removed.add(node.input[1])
        else:
            nodes.append(node)
    if not removed:
        raise UserInputError(f"{path} has no fp32 linear MatMul nodes: pass the baseline export")
    removed -= {i for node in nodes for i in node.input}  # the tied table: still gathered
    del graph.node[:]
    graph.node.extend(nodes)
    keep = [t for t in graph.initializer if t.name not in removed]
    del graph.initializer[:]
    graph.initializer.extend(keep + consts)
    start = max(1, context - window // 2)
    with tempfile.TemporaryDirectory(prefix="autoplan-nongemm-") as tmp:
        try:
            for location in _external_files(keep):  # the kept weights, read where they lie
                os.link(path.parent / location, Path(tmp) / location)
        except OSError:  # another file system: the weights travel inside the model
            onnx.load_external_data_for_model(model, str(path.parent))
        onnx.save(model, str(Path(tmp) / "model.onnx"))
        gen = OrtGenerator(Path(tmp) / "model.onnx", threads=threads, spinning=spinning)
        # Same options, but no constant folding: otherwise the zero q/k/v and gate/up outputs
        # would fold the Split and the SiLU gate away, which the decoder does run. (The first
        # session goes before the second is built: two would hold the weights twice.)
        gen.session = None
        gen.session = _decoder_session(Path(tmp) / "model.onnx", threads, spinning)
        ids = np.ones((1, 1), dtype=np.int64)
        gen.generate(ids, 8)  # warm-up
        runs = []
        for _ in range(repeats):
            res = gen.generate(ids, start + window)
            runs.append(float(np.mean(res.step_s[start - 1:])))
        del gen
    return statistics.median(runs)


__all__ = ["Row", "build_graph", "cache_path", "copies_for", "empty_table", "machine_key",
           "measure_rows", "non_gemm_decode_seconds", "row_key", "select", "time_row"]
