"""Export a planned model for CPU: ONNX decoder + per-layer ORT quantization + manifest.

`export_cpu_model` writes, atomically (a temp folder renamed into place):
    model.onnx, model.onnx.data   the decoder (onnx_graph.py) with weights as external data
    tokenizer files               from tokenizer.save_pretrained
    manifest.json                 which node computes which layer in which format, with the
                                  sha256 of every weight and scale tensor (the audit)
    any `extra_files`             e.g. the plan, written in the same atomic step
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from autoplan.atomic import atomic_dir
from autoplan.backends.cpu.manifest import (
    MANIFEST,
    MANIFEST_FORMAT,
    MANIFEST_VERSION,
    require_manifest,
)
from autoplan.backends.cpu.onnx_data import TensorFile, save_streamed
from autoplan.backends.cpu.onnx_graph import OPSET, TIED_OP, build_decoder
from autoplan.backends.cpu.ort_quant import QuantizedNode, ort_node, quantize_graph, tensor_sha256
from autoplan.errors import UserInputError
from autoplan.formats import DENSE, Choice, Precision

SCRATCH = "weights.scratch"  # the build's data file, inside the temporary folder
_FP32 = Choice(DENSE, Precision.FP32)
INT8_ACTIVATIONS = "dynamic per-tensor uint8 asymmetric (ORT DynamicQuantizeLinear)"


@dataclass(frozen=True)
class CpuArtifact:
    """A runnable CPU export on disk."""

    path: Path
    manifest: dict[str, Any]

    @property
    def model_path(self) -> Path:
        return self.path / self.manifest["files"]["model"]

    @classmethod
    def load(cls, path: str | Path) -> CpuArtifact:
        """Open an artifact folder written by export_cpu_model."""
        folder = require_manifest(path)
        try:
            manifest = json.loads((folder / MANIFEST).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            manifest = None
        if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
            raise UserInputError(f"'{path}/{MANIFEST}' is not an autoplan CPU manifest")
        version = manifest.get("schema_version", 0)
        if version > MANIFEST_VERSION:
            raise UserInputError(f"'{path}' was written by a newer autoplan: upgrade autoplan")
        if version < MANIFEST_VERSION:
            raise UserInputError(f"'{path}' was written by an older autoplan whose manifest does "
                                 "not record each layer's kernel settings: re-run `autoplan apply`")
        return cls(folder, manifest)


def export_cpu_model(model: torch.nn.Module, tokenizer: Any, decisions: Mapping[str, Choice],
                     out_dir: str | Path, *, masks: Mapping[str, torch.Tensor] | None = None,
                     weights: Mapping[str, torch.Tensor] | None = None,
                     quantized: Mapping[str, Any] | None = None,
                     extra_files: Mapping[str, str] | None = None) -> CpuArtifact:
    """Export `model` with each layer in its planned format, runnable by ONNX Runtime on CPU.

    Args:
        model: a transformers Llama-family causal LM (fp32 or any float dtype; exported fp32).
        tokenizer: its tokenizer (saved beside the model), or None.
        decisions: layer name -> Choice; unlisted layers stay dense fp32.
        out_dir: folder to create; an existing artifact there is replaced, anything else refused.
        masks: optional layer -> {0,1} mask ([out, in]) multiplied into the weights. A layer
            planned sparse without a mask must already hold its zeros (checked).
        weights: optional layer -> replacement weight [out, in] (the plan's own weights,
            e.g. SparseGPT-updated), used instead of the module's.
        quantized: optional layer -> autoplan.quant.QuantizedWeight of the plan (e.g. GPTQ
            codes), packed verbatim; other layers are rounded to nearest.
        extra_files: name -> text written into the folder in the same atomic step.

    Returns:
        The CpuArtifact at `out_dir`.

    This writer packs any format that has an ONNX name; whether ONNX Runtime *accelerates*
    it is the runtime matrix's question, asked by `autoplan apply` and `autoplan export`
    (autoplan.export._prepare.check_runtime) before they call here.
    """
    _check_sparsity(model, decisions, {**(weights or {}), **(masks or {})})
    # an existing folder is replaced only when it is an autoplan artifact (holds a manifest)
    with atomic_dir(Path(out_dir), is_ours=lambda d: (d / MANIFEST).is_file(),
                    what="autoplan artifact") as tmp:
        # weights go to a scratch file as the graph is built (the proto holds references),
        # then into model.onnx.data tensor by tensor: the export never holds the model's
        # fp32 weights a second time (onnx_data)
        scratch = TensorFile(tmp / SCRATCH)
        try:
            proto = build_decoder(
                model, masks=masks, weights=weights, data=scratch,
                fuse_qkv=lambda i: _same_choice(decisions, i, "self_attn", "qkv"),
                fuse_gate_up=lambda i: _same_choice(decisions, i, "mlp", ("gate", "up")),
                tie_lm_head=decisions.get("lm_head", _FP32) == _FP32)
        finally:
            scratch.close()
        records = quantize_graph(proto, decisions, quantized=quantized, base_dir=tmp)
        records += _tied_records(proto)
        manifest = _manifest(model, proto, records, tmp)
        save_streamed(proto, tmp / "model.onnx", "model.onnx.data", base_dir=tmp)
        (tmp / SCRATCH).unlink()
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return CpuArtifact(Path(out_dir), manifest)


def _same_choice(decisions: Mapping[str, Choice], block: int, module: str,
                 projections: Sequence[str]) -> bool:
    """Whether these projections of `block` (q/k/v, or gate/up) share a format, so they can
    run as one packed GEMM."""
    names = [f"model.layers.{block}.{module}.{n}_proj" for n in projections]
    return len({str(decisions.get(n, "dense+fp32")) for n in names}) == 1


def _check_sparsity(model: torch.nn.Module, decisions: Mapping[str, Choice],
                    given: Mapping[str, torch.Tensor]) -> None:
    modules = dict(model.named_modules())
    for name, choice in decisions.items():
        if choice.sparsity.kind == "dense" or name in given:
            continue
        if name not in modules:
            raise UserInputError(f"planned layer '{name}' is not a module of this model")
        zeros = float((modules[name].weight == 0).float().mean())
        # 1% slack: a masked weight may hold a few extra exact zeros, never fewer.
        if zeros + 0.01 < choice.sparsity.ratio:
            raise UserInputError(
                f"layer '{name}' is planned {choice.sparsity} but only {zeros:.0%} of its "
                "weights are zero: apply the pruning masks before export (or pass masks=)"
            )


def _tied_records(proto: onnx.ModelProto) -> list[QuantizedNode]:
    """The lm_head computed from the embedding table (build_decoder's tie_lm_head), if so."""
    return [QuantizedNode("lm_head", str(_FP32), node.op_type, node.name,
                          {"weight": node.input[1]})
            for node in proto.graph.node if node.name == "lm_head" and node.op_type == TIED_OP]


def _manifest(model: torch.nn.Module, proto: onnx.ModelProto,
              records: list[QuantizedNode], base_dir: Path) -> dict[str, Any]:
    import onnxruntime

    layers: dict[str, Any] = {}
    for rec in records:
        hashes = tensor_sha256(proto, list(rec.tensors.values()), base_dir)
        layers[rec.layer] = {
            "choice": rec.choice, "op_type": rec.op_type, "node": rec.node,
            # MatMulNBits compute type, implied by the format (its FormatSpec's ONNX name)
            "accuracy_level": (ort_node(Choice.parse(rec.choice).precision).accuracy_level
                               if rec.op_type == "MatMulNBits" else None),
            "columns": list(rec.columns) if rec.columns else None,
            "tensors": {role: {"name": n, "sha256": hashes[n]} for role, n in rec.tensors.items()},
        }
    cfg = model.config
    return {
        "format": MANIFEST_FORMAT,
        "schema_version": MANIFEST_VERSION,
        "files": {"model": "model.onnx", "weights": "model.onnx.data"},
        "model": {"model_type": cfg.model_type, "n_layers": cfg.num_hidden_layers,
                  "vocab": cfg.vocab_size, "hidden": cfg.hidden_size},
        "runtime": {"onnxruntime": onnxruntime.__version__, "opset": OPSET},
        "int8_activations": INT8_ACTIVATIONS,
        "weight_bytes": int(sum(_init_bytes(t) for t in proto.graph.initializer)),
        "streamed_weight_bytes": _streamed_bytes(proto),
        "layers": layers,
    }


def _streamed_bytes(proto: onnx.ModelProto) -> int:
    """Initializer bytes a decode step reads: all but tables only indexed by Gather (the
    embedding reads one row per token)."""
    gathered = {n.input[0] for n in proto.graph.node if n.op_type == "Gather"}
    other = {i for n in proto.graph.node if n.op_type != "Gather" for i in n.input}
    return int(sum(_init_bytes(t) for t in proto.graph.initializer
                   if t.name not in gathered or t.name in other))


def _init_bytes(tensor: onnx.TensorProto) -> int:
    itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return int(np.prod(tensor.dims)) * itemsize


__all__ = ["CpuArtifact", "MANIFEST", "export_cpu_model"]
