"""Greedy generation with a KV cache, timed: ONNX Runtime for artifacts, PyTorch eager as reference.

Both generators run the same loop: one prefill call over the whole prompt batch, then one
decode call per new token, feeding the cache back. A batch of B prompts is one static batch
(equal-length prompts, every sequence decodes until the longest is done), so TTFT and TPOT
are shared by the B requests of the batch. Times are wall-clock (time.perf_counter) around
each call, including the host-side argmax, which is what a client would see.
"""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from autoplan.errors import AutoplanError


def physical_cores() -> int:
    """Physical cores (hyper-threads share the FPUs and slow GEMV down), falling back to logical."""
    try:
        import psutil

        return psutil.cpu_count(logical=False) or os.cpu_count() or 1
    except ImportError:
        return os.cpu_count() or 1


def session_options(threads: int | None = None, *, spinning: bool = True):
    """The ONNX Runtime session options every autoplan CPU session uses (generation and the
    kernel microbenchmark must match): `threads` intra-op threads (default: physical cores),
    one inter-op thread, sequential execution, all graph optimizations, and pool threads
    that spin between ops (ORT's default, what a dedicated serving node runs) unless
    `spinning=False` (sleeping threads leave the cores to other jobs on a shared machine)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads or physical_cores()
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    return opts


@dataclass
class GenerationResult:
    """Tokens and timings of one static batch."""

    tokens: np.ndarray  # [B, n_new] int64
    prompt_len: int
    ttft_s: float  # prefill + first token
    step_s: list[float] = field(default_factory=list)  # each later decode step

    @property
    def batch(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def tpot_s(self) -> float:
        """Mean time per output token after the first (0 when only one token was generated)."""
        return float(np.mean(self.step_s)) if self.step_s else 0.0

    @property
    def prefill_tok_s(self) -> float:
        return self.batch * self.prompt_len / self.ttft_s

    @property
    def decode_tok_s(self) -> float:
        """Generated tokens per second over the decode steps (all sequences of the batch)."""
        total = sum(self.step_s)
        return self.batch * len(self.step_s) / total if total else 0.0


class OrtGenerator:
    """Greedy generation through an InferenceSession over an autoplan-exported decoder.

    With GroupQueryAttention (the fused export) the KV cache stays in place: one buffer per
    layer and kind, sized for prompt + new tokens, is bound through IOBinding as both the
    `past_key_values` input and the `present` output, which is GQA's shared-buffer mode (the
    kernel appends the new token's K/V into the same memory instead of copying the whole
    cache into a fresh output every step), and logits land in a pre-allocated buffer. The
    primitive-attention export (Concat grows the cache) runs the plain copy-per-step loop.
    """

    def __init__(self, model_path: str | Path, threads: int | None = None,
                 spinning: bool = True,
                 shared: Mapping[str, np.ndarray] | None = None) -> None:
        """`spinning`: let idle pool threads spin between ops (ORT's default). A decode step
        is ~150 small kernels; sleeping workers pay a futex wake-up on each. Measured on the
        2-core dev box, quiet (SmolLM2-135M, 4 sessions interleaved in one process, 128 in /
        48 out): fp32 64 -> 70 tok/s and int4 (MatMulNBits level 4) 197 -> 267 tok/s with
        spinning on. On a machine busy with other jobs it goes the other way (spinning
        workers steal the cores: fp32 37 vs 57, int4 107 vs 181 tok/s measured under load
        average 5), hence `autoplan bench --no-spin`.

        `shared`: initializer name -> an array already in this process holding the same
        values (bench's PyTorch model's fp32 embedding table): the session computes from
        that memory instead of loading its own copy (SessionOptions.add_initializer), and
        does not prepack weights, which would copy a shared table again. Each array must
        match the graph's initializer in shape and dtype and outlive the session."""
        import onnxruntime as ort

        path = Path(model_path)
        if path.is_dir():
            path = path / "model.onnx"
        if not path.is_file():
            raise AutoplanError(f"no ONNX model at '{model_path}': run `autoplan apply` first")
        opts = session_options(threads, spinning=spinning)
        self._shared = _share(opts, path, shared) if shared else []
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self._past = [i for i in self.session.get_inputs() if i.name.startswith("past_key_values")]
        if not self._past:
            raise AutoplanError(f"{path} has no past_key_values inputs: not an autoplan decoder")
        _, self._kv_heads, _, self._head_dim = self._past[0].shape
        self._outputs = [o.name for o in self.session.get_outputs()]
        self._vocab = next(o.shape[-1] for o in self.session.get_outputs() if o.name == "logits")
        self.shared_kv = _has_op(path, "GroupQueryAttention")

    def generate(self, input_ids: np.ndarray, max_new_tokens: int) -> GenerationResult:
        """Greedy-decode `max_new_tokens` tokens for a [B, S] prompt batch (no early stop)."""
        ids = np.ascontiguousarray(input_ids, dtype=np.int64)
        if self.shared_kv:
            return self._generate_bound(ids, max_new_tokens)
        return self._generate_copying(ids, max_new_tokens)

    def _generate_bound(self, ids: np.ndarray, max_new_tokens: int) -> GenerationResult:
        from onnxruntime import OrtValue

        batch, prompt_len = ids.shape
        max_len = prompt_len + max_new_tokens
        io = self.session.io_binding()
        # OrtValue.ortvalue_from_numpy wraps the numpy memory (CPU), so these arrays are the
        # cache and the logits themselves; `keep` holds them alive for the loop.
        keep = []
        for inp in self._past:
            buf = np.zeros((batch, self._kv_heads, max_len, self._head_dim), np.float32)
            value = OrtValue.ortvalue_from_numpy(buf)
            keep.append((buf, value))
            io.bind_ortvalue_input(inp.name, value)
            io.bind_ortvalue_output(inp.name.replace("past_key_values", "present"), value)
        logits = np.empty((batch, 1, self._vocab), np.float32)
        logits_value = OrtValue.ortvalue_from_numpy(logits)
        io.bind_ortvalue_output("logits", logits_value)
        # The mask is all ones (GQA takes no padding); a flat buffer gives contiguous
        # [B, total] views of any length without allocating per step.
        ones = np.ones(batch * max_len, np.int64)
        io.bind_cpu_input("logits_to_keep", np.ones(1, np.int64))
        io.bind_cpu_input("input_ids", ids)
        io.bind_cpu_input("position_ids", np.tile(np.arange(prompt_len, dtype=np.int64),
                                                  (batch, 1)))
        io.bind_cpu_input("attention_mask", ones[: batch * prompt_len].reshape(batch, prompt_len))

        def step() -> np.ndarray:
            self.session.run_with_iobinding(io)
            return logits[:, -1].argmax(-1)

        def advance(total: int, new: np.ndarray) -> None:
            io.bind_cpu_input("input_ids", new[:, None].copy())
            io.bind_cpu_input("position_ids", np.full((batch, 1), total - 1, dtype=np.int64))
            io.bind_cpu_input("attention_mask", ones[: batch * total].reshape(batch, total))

        result = timed_greedy(batch, prompt_len, max_new_tokens, step, advance)
        del keep, logits_value
        return result

    def _empty_cache(self, batch: int) -> dict[str, np.ndarray]:
        shape = (batch, self._kv_heads, 0, self._head_dim)
        return {i.name: np.zeros(shape, dtype=np.float32) for i in self._past}

    def _generate_copying(self, ids: np.ndarray, max_new_tokens: int) -> GenerationResult:
        batch, prompt_len = ids.shape
        feeds = {"input_ids": ids, "attention_mask": np.ones((batch, prompt_len), np.int64),
                 "position_ids": np.tile(np.arange(prompt_len, dtype=np.int64), (batch, 1)),
                 "logits_to_keep": np.ones(1, np.int64), **self._empty_cache(batch)}
        out: dict[str, np.ndarray] = {}

        def step() -> np.ndarray:
            out.update(zip(self._outputs, self.session.run(self._outputs, feeds)))
            return out["logits"][:, -1].argmax(-1)

        def advance(total: int, new: np.ndarray) -> None:
            feeds["input_ids"] = new[:, None].copy()
            feeds["position_ids"] = np.full((batch, 1), total - 1, dtype=np.int64)
            feeds["attention_mask"] = np.ones((batch, total), np.int64)
            for inp in self._past:  # present.i.kind becomes past_key_values.i.kind
                feeds[inp.name] = out[inp.name.replace("past_key_values", "present")]

        return timed_greedy(batch, prompt_len, max_new_tokens, step, advance)


def timed_greedy(batch: int, prompt_len: int, max_new_tokens: int,
                 step: Callable[[], np.ndarray], advance: Callable[[int, np.ndarray], None]
                 ) -> GenerationResult:
    """The timed loop every generator shares: `step()` runs the model once and returns the
    argmax tokens [B] (timed: what a client waits for); `advance(total, tokens)` feeds them
    back for a sequence of `total` tokens (not timed). The first step, from the start of the
    loop, is the TTFT; each later one a decode step."""
    tokens = np.empty((batch, max_new_tokens), dtype=np.int64)
    steps: list[float] = []
    ttft = 0.0
    start = time.perf_counter()
    for n in range(max_new_tokens):
        t0 = time.perf_counter()
        tokens[:, n] = step()
        t1 = time.perf_counter()
        if n:
            steps.append(t1 - t0)
        else:
            ttft = t1 - start
        advance(prompt_len + n + 1, tokens[:, n])
    return GenerationResult(tokens, prompt_len, ttft, steps)


def _share(opts, path: Path, arrays: Mapping[str, np.ndarray]) -> list:  # noqa: ANN001
    """Hand `arrays` to the session as its initializers (checked against the graph); the
    OrtValues returned must live as long as the session."""
    import onnx
    from onnxruntime import OrtValue

    graph = onnx.load(str(path), load_external_data=False).graph
    inits = {t.name: t for t in graph.initializer}
    values = []
    for name, arr in arrays.items():
        t = inits.get(name)
        if t is None or tuple(t.dims) != arr.shape or (
                onnx.helper.tensor_dtype_to_np_dtype(t.data_type) != arr.dtype):
            raise AutoplanError(f"cannot share '{name}' with {path}: the graph's initializer "
                                "differs in name, shape or dtype")
        if not arr.flags.c_contiguous:
            raise AutoplanError(f"cannot share '{name}': the array is not contiguous")
        value = OrtValue.ortvalue_from_numpy(arr)  # wraps the array's memory, no copy
        opts.add_initializer(name, value)
        values.append((arr, value))
    # prepacking copies a weight into the kernel's layout (the shared table included)
    opts.add_session_config_entry("session.disable_prepacking", "1")
    return values


def _has_op(path: Path, op_type: str) -> bool:
    """Whether the graph at `path` uses `op_type` (reads the graph, not the weights)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return any(node.op_type == op_type for node in graph.node)


class TorchGenerator:
    """The same greedy loop on the PyTorch eager model (fp32 reference path)."""

    def __init__(self, model, threads: int | None = None) -> None:
        import torch

        # torch's thread count is process-global; this sets it for the whole process.
        torch.set_num_threads(threads or physical_cores())
        self.model = model.eval().float()
        # transformers 5 renamed the cache argument `past_key_values` -> `cache`.
        params = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    def generate(self, input_ids: np.ndarray, max_new_tokens: int) -> GenerationResult:
        """Greedy-decode `max_new_tokens` tokens for a [B, S] prompt batch (no early stop)."""
        import torch

        ids = torch.as_tensor(np.asarray(input_ids, dtype=np.int64))
        batch, prompt_len = ids.shape
        state = {"ids": ids, "past": None}

        def step() -> np.ndarray:
            out = self.model(input_ids=state["ids"], use_cache=True, logits_to_keep=1,
                             **{self._cache_arg: state["past"]})
            state["past"] = out.get("cache", None) or out.get("past_key_values")
            return out.logits[:, -1].argmax(-1).numpy()

        def advance(_total: int, new: np.ndarray) -> None:
            state["ids"] = torch.from_numpy(new[:, None].copy())

        with torch.inference_mode():
            return timed_greedy(batch, prompt_len, max_new_tokens, step, advance)


__all__ = ["GenerationResult", "OrtGenerator", "TorchGenerator", "physical_cores"]
