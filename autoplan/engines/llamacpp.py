"""Run GGUF files in llama.cpp (the engine venv, as a subprocess): generate, logits, KL.

autoplan's own environment never imports llama_cpp: ``LlamaCppWorker`` starts
``llamacpp_worker.py`` with the interpreter of the llama.cpp engine
(``autoplan.engines.engine_python("llama.cpp")``; a missing engine is a one-line error
naming ``autoplan engines install llama.cpp``) and speaks its JSON-lines protocol. Logits
travel through a ``.npy`` file in a private temp folder (a 256-token block is 50 MB of
float32 over a pipe otherwise).

``llamacpp_quality`` measures a GGUF the way ``QualityEvaluator`` measures a torch model
(``autoplan.quality.metrics``: mean per-position KL(P_ref || P) with fp16 reference
log-probs, perplexity over the positions that have a target), except that both
distributions are llama.cpp's own: ``llamacpp_reference`` runs the original GGUF once.
"""

from __future__ import annotations

import json
import math
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from autoplan.errors import AutoplanError, UserInputError

WORKER = Path(__file__).with_name("llamacpp_worker.py")


def _default_threads() -> int:
    from autoplan.backends.cpu.ort_runtime import physical_cores

    return physical_cores()


class LlamaCppWorker:
    """One GGUF loaded in a llama.cpp worker process (close it, or use it as a context).

    Args:
        gguf: the model file.
        threads: llama.cpp threads (default: physical cores, as autoplan's ORT sessions).
        n_ctx: context length; one evaluation is at most this many tokens.
        logits_all: keep every position's logits (needed by ``logits``).
        kv_f32: an fp32 KV cache instead of llama.cpp's default fp16 (closer to autoplan's
            fp32 simulation; the KL measurements keep llama.cpp's default).
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
                 python: str | Path | None = None) -> None:
        from autoplan.engines import engine_python

        self.gguf = Path(gguf)
        if not self.gguf.is_file():
            raise UserInputError(f"no GGUF file at '{self.gguf}': pass the file "
                                 "`autoplan export --format gguf` wrote")
        exe = Path(python) if python else engine_python("llama.cpp")
        self.threads = threads or _default_threads()
        cfg = {"model": str(self.gguf), "threads": self.threads, "n_ctx": n_ctx,
               "logits_all": logits_all, "kv_f32": kv_f32, "extra_bufts": extra_bufts}
        self._tmp = tempfile.TemporaryDirectory(prefix="autoplan-llamacpp-")
        self._stderr = open(Path(self._tmp.name) / "stderr.txt", "w+")  # noqa: SIM115
        self.proc = subprocess.Popen([str(exe), str(WORKER), json.dumps(cfg)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr, text=True, bufsize=1)
        hello = self._read()
        self.n_vocab = int(hello["n_vocab"])
        self.n_ctx = n_ctx
        self.peak_rss_bytes = 0

    def _read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            self.proc.wait(timeout=30)
            self._stderr.seek(0)
            tail = [x for x in self._stderr.read().strip().splitlines() if x.strip()][-1:]
            raise AutoplanError(f"llama.cpp could not run '{self.gguf.name}' (exit "
                                f"{self.proc.returncode}): {' '.join(tail) or 'no output'}")
        out = json.loads(line)
        if "error" in out:
            raise AutoplanError(f"llama.cpp failed on '{self.gguf.name}': {out['error']}")
        return out

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None  # noqa: S101 - set by Popen(stdin=PIPE)
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def generate(self, input_ids: np.ndarray, max_new_tokens: int):  # noqa: ANN201
        """Greedy generation of one prompt ([1, n] ids), timed per step in the worker.

        Returns:
            ``autoplan.backends.cpu.ort_runtime.GenerationResult``.
        """
        from autoplan.backends.cpu.ort_runtime import GenerationResult

        if input_ids.shape[0] != 1:
            raise UserInputError("llama.cpp runs batch 1 here: use --concurrency 1")
        out = self._ask({"op": "generate", "ids": np.asarray(input_ids).tolist(),
                         "n": int(max_new_tokens)})
        self.peak_rss_bytes = max(self.peak_rss_bytes, int(out["peak_rss_bytes"]))
        return GenerationResult(np.asarray([out["tokens"]], np.int64), input_ids.shape[1],
                                out["ttft_s"], out["step_s"])

    def logits(self, ids: np.ndarray | list[int]) -> np.ndarray:
        """float32 [len(ids), vocab]: llama.cpp's logits at every position of one sequence."""
        ids = [int(i) for i in np.asarray(ids).reshape(-1)]
        if len(ids) > self.n_ctx:
            raise UserInputError(f"{len(ids)} tokens do not fit n_ctx={self.n_ctx}")
        path = Path(self._tmp.name) / "logits.npy"
        self._ask({"op": "logits", "ids": ids, "out": str(path)})
        return np.load(path)

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
        self._tmp.cleanup()

    def __enter__(self) -> LlamaCppWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class LlamaCppReference:
    """The original GGUF's llama.cpp log-probs on the evaluation tokens (fp16, as
    ``autoplan.quality.metrics.ReferenceLogprobs``) and its mean next-token NLL."""

    tokens: torch.Tensor = field(repr=False)  # int64 [n_blocks, seq_len]
    logprobs: torch.Tensor = field(repr=False)  # fp16 [n_blocks, seq_len, vocab]
    nll: float
    gguf: str

    @property
    def ppl(self) -> float:
        return math.exp(self.nll)


def _block_logprobs(worker: LlamaCppWorker, block: torch.Tensor) -> torch.Tensor:
    logits = torch.from_numpy(worker.logits(block.numpy()))
    return torch.log_softmax(logits.float(), dim=-1)[None]


def _check_tokens(tokens: torch.Tensor) -> torch.Tensor:
    if tokens.ndim != 2 or tokens.shape[0] == 0 or tokens.shape[1] < 2:
        raise UserInputError("evaluation tokens must be a non-empty [n_blocks, seq_len>=2] "
                             "tensor; build them with load_text_dataset(n_eval>=1)")
    return tokens.long()


def llamacpp_reference(gguf: str | Path, tokens: torch.Tensor, *,
                       threads: int | None = None) -> LlamaCppReference:
    """Run the reference GGUF once over every evaluation block (one sequence per block)."""
    from autoplan.quality.metrics import nll_sum

    tokens = _check_tokens(tokens)
    chunks, nll = [], 0.0
    with LlamaCppWorker(gguf, threads=threads, n_ctx=tokens.shape[1], logits_all=True) as w:
        for block in tokens:
            lp = _block_logprobs(w, block)
            nll += nll_sum(lp, block[None])
            chunks.append(lp.half())
    n_targets = tokens.shape[0] * (tokens.shape[1] - 1)
    return LlamaCppReference(tokens, torch.cat(chunks), nll / n_targets, str(gguf))


def llamacpp_quality(gguf: str | Path, reference: LlamaCppReference, *,
                     threads: int | None = None) -> dict[str, float]:
    """KL to the reference and perplexity of a GGUF, both through llama.cpp's logits.

    Returns:
        ``{"kl", "ppl", "ppl_ref", "n_tokens"}``: mean per-position KL(P_ref || P) in
        nats (0 for the reference file itself), perplexities of the model and reference.
    """
    from autoplan.quality.metrics import kl_sum, nll_sum

    tokens = reference.tokens
    nll, kl = 0.0, 0.0
    with LlamaCppWorker(gguf, threads=threads, n_ctx=tokens.shape[1], logits_all=True) as w:
        for i, block in enumerate(tokens):
            lq = _block_logprobs(w, block)
            nll += nll_sum(lq, block[None])
            kl += kl_sum(reference.logprobs[i:i + 1], lq)
    n_targets = tokens.shape[0] * (tokens.shape[1] - 1)
    return {"kl": kl / tokens.numel(), "ppl": math.exp(nll / n_targets),
            "ppl_ref": reference.ppl, "n_tokens": int(tokens.numel())}


__all__ = ["WORKER", "LlamaCppReference", "LlamaCppWorker", "llamacpp_quality",
           "llamacpp_reference"]
