"""ggml mat-mul worker: times (and computes) ggml_mul_mat through the ggml shared libraries
that llama-cpp-python installs. Runs in the llama.cpp engine's venv, started by
``autoplan.engines.ggml_microbench``; imports only the standard library, numpy and
ctypes (not llama_cpp's Python layer, not autoplan).

Reasoning and sources: docs/modules.md.
"""

import ctypes
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np

GGML_TYPE_F32 = 0
_GRAPH_NODES = 2048  # GGML_DEFAULT_GRAPH_SIZE: the most mul_mat copies one graph holds


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                ("no_alloc", ctypes.c_bool)]


class Ggml:
    """The few ggml entry points the worker needs, typed for ctypes."""

    def __init__(self, lib: Path, threads: int) -> None:
        mode = getattr(ctypes, "RTLD_GLOBAL", 0)
        self.base = ctypes.CDLL(str(lib / "libggml-base.so"), mode=mode)
        self.cpu = ctypes.CDLL(str(lib / "libggml-cpu.so"), mode=mode)
        vp, sz, i64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64
        sigs = {
            (self.base, "ggml_init"): (vp, [_InitParams]),
            (self.base, "ggml_free"): (None, [vp]),
            (self.base, "ggml_tensor_overhead"): (sz, []),
            (self.base, "ggml_graph_overhead"): (sz, []),
            (self.base, "ggml_row_size"): (sz, [ctypes.c_int, i64]),
            (self.base, "ggml_new_tensor_2d"): (vp, [vp, ctypes.c_int, i64, i64]),
            (self.base, "ggml_get_data"): (vp, [vp]),
            (self.base, "ggml_mul_mat"): (vp, [vp, vp, vp]),
            (self.base, "ggml_new_graph"): (vp, [vp]),
            (self.base, "ggml_build_forward_expand"): (None, [vp, vp]),
            (self.base, "ggml_quantize_chunk"): (sz, [ctypes.c_int, vp, vp, i64, i64, i64, vp]),
            (self.base, "ggml_backend_graph_compute"): (ctypes.c_int, [vp, vp]),
            (self.base, "ggml_backend_free"): (None, [vp]),
            (self.cpu, "ggml_cpu_init"): (None, []),
            (self.cpu, "ggml_backend_cpu_init"): (vp, []),
            (self.cpu, "ggml_backend_cpu_set_n_threads"): (None, [vp, ctypes.c_int]),
        }
        for (handle, name), (res, args) in sigs.items():
            fn = getattr(handle, name)
            fn.restype, fn.argtypes = res, args
            setattr(self, name, fn)
        self.ggml_cpu_init()
        self.backend = self.ggml_backend_cpu_init()
        self.ggml_backend_cpu_set_n_threads(self.backend, threads)


def _fill(g: Ggml, tensor: int, qtype: int, rows: np.ndarray) -> None:
    """Write float32 rows [n, k] into a ggml tensor of type qtype (ggml quantizes)."""
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    n, k = rows.shape
    dst = g.ggml_get_data(tensor)
    if qtype == GGML_TYPE_F32:
        ctypes.memmove(dst, rows.ctypes.data, rows.nbytes)
    else:
        g.ggml_quantize_chunk(qtype, rows.ctypes.data, dst, 0, n, k, None)


class _Graph:
    """A context holding R weights [n, k] of one type, an input [m, k] and R mul_mats."""

    def __init__(self, g: Ggml, qtype: int, m: int, n: int, k: int, copies: int,
                 weights) -> None:  # noqa: ANN001 - a callable i -> float32 [n, k]
        self.g = g
        size = copies * g.ggml_row_size(qtype, k) * n + (m * k + copies * m * n) * 4
        size += (2 * copies + 2) * g.ggml_tensor_overhead() + g.ggml_graph_overhead() + (1 << 20)
        self.ctx = g.ggml_init(_InitParams(size, None, False))
        if not self.ctx:
            raise MemoryError(f"ggml_init could not allocate {size} bytes")
        self.x = g.ggml_new_tensor_2d(self.ctx, GGML_TYPE_F32, k, m)
        self.graph = g.ggml_new_graph(self.ctx)
        self.outs = []
        for i in range(copies):
            w = g.ggml_new_tensor_2d(self.ctx, qtype, k, n)
            _fill(g, w, qtype, weights(i))
            out = g.ggml_mul_mat(self.ctx, w, self.x)
            g.ggml_build_forward_expand(self.graph, out)
            self.outs.append(out)

    def set_input(self, x: np.ndarray) -> None:
        x = np.ascontiguousarray(x, dtype=np.float32)
        ctypes.memmove(self.g.ggml_get_data(self.x), x.ctypes.data, x.nbytes)

    def run(self) -> None:
        status = self.g.ggml_backend_graph_compute(self.g.backend, self.graph)
        if status != 0:
            raise RuntimeError(f"ggml_backend_graph_compute returned status {status}")

    def output(self, i: int, m: int, n: int) -> np.ndarray:
        ptr = ctypes.cast(self.g.ggml_get_data(self.outs[i]), ctypes.POINTER(ctypes.c_float))
        return np.ctypeslib.as_array(ptr, shape=(m, n)).copy()

    def close(self) -> None:
        self.g.ggml_free(self.ctx)


class _Timer:
    """Graphs built for timing, by id: trials of different rows interleave (see
    autoplan/engines/ggml_microbench.py for how the samples become a kernel time)."""

    def __init__(self, g: Ggml) -> None:
        self.g = g
        self.graphs: dict[int, tuple[_Graph, int]] = {}
        self.flush = np.ones(1, dtype=np.float64)
        self.next_id = 0

    def build(self, req: dict) -> dict:
        m, n, k, qtype = int(req["m"]), int(req["n"]), int(req["k"]), int(req["type"])
        copies = max(1, min(int(req.get("copies", 1)), _GRAPH_NODES // 2))
        rng = np.random.default_rng(0)
        base = (rng.standard_normal((n, k), dtype=np.float32) * 0.02)
        graph = _Graph(self.g, qtype, m, n, k, copies, lambda i: np.roll(base, i, axis=1))
        graph.set_input(rng.standard_normal((m, k), dtype=np.float32) * 0.5)
        for _ in range(3):
            graph.run()
        t0 = time.perf_counter()
        graph.run()
        once = time.perf_counter() - t0
        self.next_id += 1
        self.graphs[self.next_id] = (graph, copies)
        return {"id": self.next_id, "copies": copies, "once_us": once * 1e6 / copies}

    def trial(self, req: dict) -> dict:
        graph, copies = self.graphs[int(req["id"])]
        words = max(1, int(req.get("flush_bytes", 0)) // 8)
        if self.flush.size != words:
            self.flush = np.ones(words, dtype=np.float64)
        samples, cpu = [], []
        for _ in range(max(1, int(req.get("runs", 5)))):
            self.flush.sum()
            c0, t0 = time.process_time(), time.perf_counter()
            graph.run()
            t1, c1 = time.perf_counter(), time.process_time()
            samples.append((t1 - t0) * 1e6 / copies)
            cpu.append((c1 - c0) * 1e6 / copies)
        # cpu_us: the process's CPU time per call (all threads): with one thread, the run's
        # time without the waits for a core that a loaded machine adds
        return {"samples_us": samples, "cpu_us": cpu}

    def drop(self, req: dict) -> dict:
        graph, _ = self.graphs.pop(int(req["id"]))
        graph.close()
        return {"dropped": int(req["id"])}


def _matmul(g: Ggml, req: dict) -> dict:
    w, x = np.load(req["w"]), np.load(req["x"])
    (n, k), m = w.shape, x.shape[0]
    graph = _Graph(g, int(req["type"]), m, n, k, 1, lambda i: w)
    try:
        graph.set_input(x)
        graph.run()
        np.save(req["out"], graph.output(0, m, n))
    finally:
        graph.close()
    return {"rows": m}


def main() -> int:
    cfg = json.loads(sys.argv[1])
    lib = Path(importlib.util.find_spec("llama_cpp").origin).parent / "lib"
    g = Ggml(lib, int(cfg["threads"]))
    timer = _Timer(g)
    ops = {"matmul": lambda req: _matmul(g, req), "build": timer.build, "trial": timer.trial,
           "drop": timer.drop}
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        try:
            out = ops[req.get("op", "")](req)
        except Exception as exc:  # noqa: BLE001 - reported to the client as one line
            out = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
        print(json.dumps(out), flush=True)
    g.ggml_backend_free(g.backend)
    return 0


if __name__ == "__main__":
    sys.exit(main())
