"""Run real generation for several configurations side by side, interleaved, in one process.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoplan.backends.cpu.onnx_export import CpuArtifact
from autoplan.backends.cpu.ort_runtime import (GenerationResult, OrtGenerator, TorchGenerator,
                                               physical_cores)
from autoplan.bench.report import BenchReport, summarize
from autoplan.bench.system import current_rss_bytes, peak_rss_bytes
from autoplan.errors import UserInputError

WARMUP_TOKENS = 4


@dataclass
class Side:
    """One configuration under test."""

    name: str
    runtime: str
    generator: Any  # OrtGenerator | TorchGenerator: .generate(ids, n) -> GenerationResult
    rss_load: int
    weight_bytes: int | None = None
    streamed_bytes: int | None = None


def ort_side(name: str, artifact: CpuArtifact, threads: int | None = None,
             spinning: bool = True, shared: Mapping[str, np.ndarray] | None = None) -> Side:
    """Open an artifact in an InferenceSession, measuring the memory the session adds
    (`shared`: initializers computed from memory this process holds, OrtGenerator's)."""
    before = current_rss_bytes()
    gen = OrtGenerator(artifact.model_path, threads=threads, spinning=spinning, shared=shared)
    gen.generate(np.zeros((1, 4), np.int64), 2)  # arenas are sized on the first run
    m = artifact.manifest
    return Side(name, "onnxruntime", gen, current_rss_bytes() - before, m.get("weight_bytes"),
                m.get("streamed_weight_bytes"))


def shared_weights(model: Any, artifact: CpuArtifact) -> dict[str, np.ndarray]:
    """One copy of the fp32 weights for the PyTorch `model` and the fp32 `artifact` exported
    from it, for ``ort_side(artifact, shared=...)``: the embedding table as a view of the
    model's own (a tied lm_head reads it too: ``onnx_graph.TIED_OP``), and each linear node's
    [in, out] weight read from the artifact, the model's layers then computing from views of
    it (``weight = W[:, cols].T``: the same values, stored transposed). For Gemma-3-270M's
    shape that is 1.0 GiB the ONNX Runtime session would otherwise hold a second time beside
    the PyTorch side. Every weight is checked equal before it is shared; {} unless the model
    is fp32 on the CPU."""
    import torch
    from onnx import TensorProto
    from onnx import load as onnx_load

    from autoplan.backends.cpu.onnx_data import read_array
    from autoplan.backends.cpu.onnx_graph import FUSED_KEY

    table = model.get_input_embeddings().weight
    if table.dtype != torch.float32 or table.device.type != "cpu":
        return {}
    shared = {"model.embed_tokens.weight": table.detach().numpy()}
    proto = onnx_load(str(artifact.model_path), load_external_data=False)
    inits = {t.name: t for t in proto.graph.initializer}
    packed = json.loads({p.key: p.value for p in proto.metadata_props}.get(FUSED_KEY, "{}"))
    modules = dict(model.named_modules())
    for node in proto.graph.node:
        weight = inits.get(node.input[1]) if node.op_type == "MatMul" else None
        if weight is None or weight.data_type != TensorProto.FLOAT:
            continue
        members = packed.get(node.name) or [[node.name, None]]
        if any(layer not in modules for layer, _ in members):
            continue
        arr = read_array(weight, artifact.path)
        views = {}
        for layer, cols in members:
            view = torch.from_numpy(arr if cols is None else arr[:, cols[0]:cols[1]]).T
            if not torch.equal(view, modules[layer].weight.detach()):
                break  # not this model's weight (a plan's): left alone
            views[layer] = view
        else:
            shared[weight.name] = arr
            for layer, view in views.items():
                modules[layer].weight = torch.nn.Parameter(view, requires_grad=False)
    return shared


def torch_side(model: Any, threads: int | None = None) -> Side:
    """The PyTorch eager fp32 model (its weights are already resident: rss_load is 0)."""
    return Side("pytorch-eager-fp32", "pytorch", TorchGenerator(model, threads=threads), 0)


def run_bench(sides: list[Side], *, requests: int, concurrency: int, input_len: int,
              output_len: int, vocab: int, seed: int = 0,
              bandwidth: float | Callable[[], float] | None = None,
              threads: int | None = None,
              progress: Callable[[str], None] | None = None) -> BenchReport:
    """Time every side on the same prompt batches, interleaved; docs/modules.md says why.

    `bandwidth`: bytes/s for the roofline fraction, or a probe (e.g. read_bandwidth) called
    once per batch round, whose median is used.
    """
    if min(requests, concurrency, input_len, output_len) < 1:
        raise UserInputError("--requests, --concurrency, --input-len and --output-len must be >= 1")
    if requests % concurrency:
        raise UserInputError(f"--requests {requests} is not a multiple of --concurrency "
                             f"{concurrency}: static batching runs whole batches")
    rng = np.random.default_rng(seed)
    batches = [rng.integers(0, vocab, size=(concurrency, input_len), dtype=np.int64)
               for _ in range(requests // concurrency)]
    for side in sides:
        side.generator.generate(batches[0], min(WARMUP_TOKENS, output_len))
    results: dict[str, list[GenerationResult]] = {s.name: [] for s in sides}
    samples: list[float] = []
    for i, prompts in enumerate(batches):
        if callable(bandwidth):
            time.sleep(0.05)  # let the last side's spinning pool threads go to sleep first
            samples.append(bandwidth())
        for side in sides[i % len(sides):] + sides[: i % len(sides)]:
            res = side.generator.generate(prompts, output_len)
            results[side.name].append(res)
            if progress:
                progress(f"batch {i + 1}/{len(batches)} {side.name}: "
                         f"decode {res.decode_tok_s:.1f} tok/s, TTFT {res.ttft_s * 1e3:.0f} ms")
    bw = float(np.median(samples)) if samples else bandwidth
    stats = [summarize(s.name, s.runtime, results[s.name], s.rss_load, s.weight_bytes,
                       s.streamed_bytes, bw) for s in sides]
    workload = {"requests": requests, "concurrency": concurrency, "input_len": input_len,
                "output_len": output_len}
    return BenchReport(workload, stats, threads or physical_cores(), peak_rss_bytes() / 1e6,
                       bw / 1e9 if bw else None, bandwidth_samples_gbps=[s / 1e9 for s in samples],
                       notes=["static batching: each batch of --concurrency prompts is one ONNX "
                              "session call; its requests share TTFT and TPOT"])


__all__ = ["Side", "ort_side", "run_bench", "shared_weights", "torch_side"]
