"""The client side of a peer-engine worker: a subprocess in the engine's own venv that speaks
one JSON object per line, shared by the llama.cpp and OpenVINO sides of cpu_bench.py.

Protocol (every worker):
  argv: whatever the worker needs (model path, threads, ...)
  out:  {"ready": true, ...}                                   once, after loading
  in:   {"ids": [[prompt token ids]], "n": new_tokens}          (batch 1)
  out:  {"tokens": [...], "ttft_s": s, "step_s": [...], "peak_rss_bytes": n}
Workers may answer other requests (the OpenVINO worker's logits); `request` sends any.
A failed request is answered {"error": "..."} and raised here as one line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import numpy as np

from autoplan.backends.cpu.ort_runtime import GenerationResult
from autoplan.bench import Side
from autoplan.errors import AutoplanError, UserInputError


class WorkerGenerator:
    """generate(ids, n) through a worker subprocess; batch 1 only.

    Args:
        label: the engine's name in messages (``llama.cpp``, ``OpenVINO``).
        argv: the worker's command line, interpreter first.
        hint: what to try when the worker does not start (one clause).
    """

    def __init__(self, label: str, argv: list[str], hint: str) -> None:
        self.label, self.hint = label, hint
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=sys.stderr, text=True, bufsize=1)
        try:
            self.hello = self._read()
        except BaseException:
            self.close()
            raise
        if not self.hello.get("ready"):
            self.close()
            raise UserInputError(f"the {label} worker did not start: {hint}")
        self.peak_rss_bytes = 0

    def _read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline()
        if not line:
            raise UserInputError(f"the {self.label} worker exited early: {self.hint}")
        doc = json.loads(line)
        if "error" in doc:
            raise AutoplanError(f"the {self.label} worker failed: {doc['error']}")
        return doc

    def request(self, doc: dict[str, Any]) -> dict[str, Any]:
        """Send one request and return the worker's answer."""
        self.proc.stdin.write(json.dumps(doc) + "\n")
        return self._read()

    def generate(self, input_ids: np.ndarray, max_new_tokens: int) -> GenerationResult:
        if input_ids.shape[0] != 1:
            raise UserInputError(f"the {self.label} peer runs batch 1 only: use --concurrency 1")
        out = self.request({"ids": input_ids.tolist(), "n": max_new_tokens})
        self.peak_rss_bytes = max(self.peak_rss_bytes, out["peak_rss_bytes"])
        return GenerationResult(np.asarray([out["tokens"]], np.int64), input_ids.shape[1],
                                out["ttft_s"], out["step_s"])

    def close(self) -> None:
        """End the worker (EOF on its stdin); kill it if it does not exit in 30 s."""
        if self.proc.poll() is not None:
            return
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


def worker_side(name: str, runtime: str, gen: WorkerGenerator,
                weight_bytes: int | None) -> Side:
    """A bench Side over a started worker, warmed up by one short request (its memory lives
    in the worker: rss_load is the worker's own peak RSS)."""
    gen.generate(np.zeros((1, 4), np.int64), 2)
    return Side(name, runtime, gen, gen.peak_rss_bytes, weight_bytes=weight_bytes)


__all__ = ["WorkerGenerator", "worker_side"]
