"""Talk to the llama.cpp engine (its own venv) through worker subprocesses.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from autoplan.errors import AutoplanError, UserInputError

WORKER = Path(__file__).with_name("llamacpp_worker.py")
GGML_WORKER = Path(__file__).with_name("ggml_worker.py")


def default_threads() -> int:
    """Physical cores: the thread count autoplan's CPU sessions use."""
    from autoplan.backends.cpu.ort_runtime import physical_cores

    return physical_cores()


class EngineWorker:
    """A worker script run by the llama.cpp engine's Python, spoken to in JSON lines.

    Raises:
        UserInputError: the engine is not installed.
        AutoplanError: the worker exited or reported an error (its last stderr line).
    """

    def __init__(self, script: Path, config: dict[str, Any], what: str,
                 python: str | Path | None = None) -> None:
        from autoplan.engines import engine_python

        exe = Path(python) if python else engine_python("llama.cpp")
        self.what = what
        self.tmp = tempfile.TemporaryDirectory(prefix="autoplan-llamacpp-")
        self._stderr = open(Path(self.tmp.name) / "stderr.txt", "w+")  # noqa: SIM115
        self.proc = subprocess.Popen([str(exe), str(script), json.dumps(config)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr, text=True, bufsize=1)
        try:
            self.hello = self._read()
        except BaseException:
            self.close()
            raise

    def _read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            self.proc.wait(timeout=30)
            self._stderr.seek(0)
            tail = [x for x in self._stderr.read().strip().splitlines() if x.strip()][-1:]
            raise AutoplanError(f"llama.cpp could not run {self.what} (exit "
                                f"{self.proc.returncode}): {' '.join(tail) or 'no output'}")
        out = json.loads(line)
        if "error" in out:
            raise AutoplanError(f"llama.cpp failed on {self.what}: {out['error']}")
        return out

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send one request and return its answer."""
        if self.proc.stdin is None or self.proc.poll() is not None:
            raise AutoplanError(f"the llama.cpp worker for {self.what} is not running")
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        """Stop the worker (it exits when its stdin closes) and remove the temp folder."""
        if self.proc.poll() is None:
            if self.proc.stdin:
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()
        self.tmp.cleanup()

    def __enter__(self):  # noqa: ANN204 - the subclass itself
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LlamaCppWorker(EngineWorker):
    """One GGUF loaded in a llama.cpp worker process (close it, or use it as a context).

    Args:
        gguf: the model file.
        threads: llama.cpp threads (default: physical cores, as autoplan's ORT sessions).
        n_ctx: context length; one evaluation is at most this many tokens.
        logits_all: keep every position's logits (needed by ``logits``).
        kv_f32: an fp32 KV cache instead of llama.cpp's default fp16.
        kv_type: the K and V cache type (llama.cpp's -ctk/-ctv name: f16, q8_0, q4_0, ...),
            run with flash attention on (a quantized V cache needs it); None: the default.
        extra_bufts: let llama.cpp repack weights into its extra CPU buffer types (AMX,
            CPU_REPACK). Off by default: see llamacpp_worker.py (the AMX path crashes on
            multi-token batches here, and the kernel table times the plain kernels).
        python: the engine's interpreter (default: the installed llama.cpp engine).

    Raises:
        UserInputError: the engine is not installed, or the file is missing.
        AutoplanError: the worker could not load the model.
    """

    def __init__(self, gguf: str | Path, *, threads: int | None = None, n_ctx: int = 512,
                 logits_all: bool = False, kv_f32: bool = False, extra_bufts: bool = False,
                 kv_type: str | None = None, python: str | Path | None = None) -> None:
        self.gguf = Path(gguf)
        if not self.gguf.is_file():
            raise UserInputError(f"no GGUF file at '{self.gguf}': pass the file "
                                 "`autoplan export --format gguf` wrote")
        self.threads = threads or default_threads()
        cfg = {"model": str(self.gguf), "threads": self.threads, "n_ctx": n_ctx,
               "logits_all": logits_all, "kv_f32": kv_f32, "extra_bufts": extra_bufts,
               "kv_type": kv_type}
        super().__init__(WORKER, cfg, f"'{self.gguf.name}'", python)
        self.n_vocab = int(self.hello["n_vocab"])
        self.n_ctx = n_ctx
        self.peak_rss_bytes = 0

    def generate(self, input_ids: np.ndarray, max_new_tokens: int):  # noqa: ANN201
        """Greedy generation of one prompt ([1, n] ids), timed per step in the worker.

        Returns:
            ``autoplan.backends.cpu.ort_runtime.GenerationResult``.
        """
        from autoplan.backends.cpu.ort_runtime import GenerationResult

        if input_ids.shape[0] != 1:
            raise UserInputError("llama.cpp runs batch 1 here: use --concurrency 1")
        out = self.ask({"op": "generate", "ids": np.asarray(input_ids).tolist(),
                         "n": int(max_new_tokens)})
        self.peak_rss_bytes = max(self.peak_rss_bytes, int(out["peak_rss_bytes"]))
        return GenerationResult(np.asarray([out["tokens"]], np.int64), input_ids.shape[1],
                                out["ttft_s"], out["step_s"])

    def logits(self, ids: np.ndarray | list[int]) -> np.ndarray:
        """float32 [len(ids), vocab]: llama.cpp's logits at every position of one sequence."""
        ids = [int(i) for i in np.asarray(ids).reshape(-1)]
        if len(ids) > self.n_ctx:
            raise UserInputError(f"{len(ids)} tokens do not fit n_ctx={self.n_ctx}")
        path = Path(self.tmp.name) / "logits.npy"
        self.ask({"op": "logits", "ids": ids, "out": str(path)})
        return np.load(path)


class GgmlWorker(EngineWorker):
    """ggml_mul_mat through the engine's ggml libraries (see ggml_worker.py).

    Args:
        threads: compute threads (default: physical cores).
        python: the engine's interpreter (default: the installed llama.cpp engine).
    """

    def __init__(self, threads: int | None = None, python: str | Path | None = None) -> None:
        self.threads = threads or default_threads()
        super().__init__(GGML_WORKER, {"threads": self.threads}, "ggml_mul_mat", python)

    def build(self, m: int, n: int, k: int, ggml_type: int, *, copies: int = 1) -> dict[str, Any]:
        """Build (and warm) a graph of ``copies`` mul_mats x[m, k] @ W[n, k].T in
        ``ggml_type``; returns its ``id``, ``copies`` and one run's per-call ``once_us``."""
        return self.ask({"op": "build", "m": m, "n": n, "k": k, "type": ggml_type,
                         "copies": copies})

    def trial(self, graph_id: int, runs: int, flush_bytes: int = 0,
              clock: str = "wall") -> list[float]:
        """Per-call microseconds of ``runs`` timed runs of a built graph, each after reading
        a ``flush_bytes`` buffer (so the weights stream from memory); ``clock`` "cpu": the
        process's CPU time instead of wall time (one thread: no waits for a core)."""
        out = self.ask({"op": "trial", "id": graph_id, "runs": runs,
                        "flush_bytes": flush_bytes})
        return out["cpu_us" if clock == "cpu" else "samples_us"]

    def drop(self, graph_id: int) -> None:
        """Free a built graph."""
        self.ask({"op": "drop", "id": graph_id})

    def matmul(self, weight: np.ndarray, x: np.ndarray, ggml_type: int) -> np.ndarray:
        """What ggml computes for ``x @ weight.T`` with ``weight`` quantized by ggml to
        ``ggml_type`` (float32 [m, n])."""
        folder = Path(self.tmp.name)
        np.save(folder / "w.npy", np.ascontiguousarray(weight, dtype=np.float32))
        np.save(folder / "x.npy", np.ascontiguousarray(x, dtype=np.float32))
        self.ask({"op": "matmul", "type": int(ggml_type), "w": str(folder / "w.npy"),
                  "x": str(folder / "x.npy"), "out": str(folder / "y.npy")})
        return np.load(folder / "y.npy")

__all__ = ["GGML_WORKER", "WORKER", "EngineWorker", "GgmlWorker", "LlamaCppWorker",
           "default_threads"]
