"""Per-layer weight quantization of an exported ONNX decoder, in the formats ONNX Runtime runs.

Each planned linear layer is one `MatMul` node named after the layer (see onnx_export.py).
This module rewrites that node in place, so the layer -> node mapping stays exact:

- `int8` (W8A8): the pattern ORT's own `quantize_dynamic` emits,
  `DynamicQuantizeLinear(x) -> MatMulInteger(x_q, W_q) -> Cast -> Mul(x_scale * w_scale)`,
  which ORT's optimizer fuses into one `DynamicQuantizeMatMul` kernel. Weights are int8 per
  output channel (autoplan.quant: symmetric, amax / 127). ORT quantizes activations per
  *tensor* (uint8, asymmetric) at run time, where autoplan.quant simulates vLLM's per-token
  int8: identical at decode batch 1, coarser for prefill and batched decode (the manifest
  records it).
- `int4_g32/g64/g128` (W4A16) and `int8_wo` (W8A16): com.microsoft `MatMulNBits` at
  accuracy_level 0 (fp32 math on the dequantized weights: exact weight-only numerics), codes
  stored with the op's default zero point 2**(bits-1). int4 groups run along K (codes
  -8..7, amax / 7.5); int8_wo is per output channel (the scale repeated for every block).
- `int4a8_g32/g64/g128` and `int8a8_g128`: the same MatMulNBits weights at accuracy_level 4,
  where MLAS quantizes each activation row to int8 per block (its fast VNNI/AVX2 path);
  autoplan.quant simulates that rounding exactly (BlockInt8ActScheme).

Codes and scales come from autoplan.quant.quantize_weight (or the plan's own GPTQ-rounded
QuantizedWeight), never from a second rounding rule, so the ONNX model holds exactly the
weights the PyTorch simulation measured. We pack them ourselves rather than calling ORT's
`MatMulNBitsQuantizer` (which rounds on its own and needs the optional `onnx_ir` package);
tests/unit/test_onnx_export.py checks the packing against ORT's kernels.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from autoplan.backends.cpu.onnx_graph import FUSED_KEY
from autoplan.errors import AutoplanError, UnsupportedFormatError
from autoplan.formats import DENSE, Choice, Precision
from autoplan.quant import QuantizedWeight, quantize_weight

MS_DOMAIN = "com.microsoft"
_FP32 = Choice(DENSE, Precision.FP32)
INT4 = {Precision.INT4_G32: 32, Precision.INT4_G64: 64, Precision.INT4_G128: 128,
        Precision.INT4A8_G32: 32, Precision.INT4A8_G64: 64, Precision.INT4A8_G128: 128}
INT8_NBITS = frozenset({Precision.INT8_WO, Precision.INT8A8_G128})
CPU_PRECISIONS = frozenset({Precision.FP32, Precision.INT8, *INT8_NBITS, *INT4})
# Sparsity has no CPU kernel: masked weights run dense. N:M exists only to feed sparse tensor
# cores, so a plan that asks for it on a CPU target was made for other hardware.
CPU_SPARSITY_KINDS = frozenset({"dense", "unstructured", "block", "channel"})
INT8_WO_BLOCK = 128  # MatMulNBits block for 8-bit layers; every block carries the channel's scale


def nbits_layout(precision: Precision) -> tuple[int, int, int]:
    """(bits, block_size, accuracy_level) of the MatMulNBits node running `precision`.

    The level follows the format, never a switch: level 4 rounds activations to int8, which
    only the *a8 formats simulate, so any other level would run numerics nobody measured.
    """
    bits = 8 if precision in INT8_NBITS else 4
    block = INT8_WO_BLOCK if bits == 8 else INT4[precision]
    return bits, block, 4 if precision.info.act_group else 0


@dataclass(frozen=True)
class QuantizedNode:
    """What one layer became: the ops that compute it and the tensors that store it."""

    layer: str
    choice: str
    op_type: str  # MatMul | MatMulInteger | MatMulNBits
    node: str
    tensors: dict[str, str]  # role (weight, scale, ...) -> initializer name
    columns: tuple[int, int] | None = None  # this layer's output columns in a packed node


def cpu_unsupported(decisions: Mapping[str, Choice]) -> dict[str, str]:
    """Layers whose choice ONNX Runtime on CPU cannot run, with the offending choice."""
    return {
        name: str(choice)
        for name, choice in decisions.items()
        if choice.precision not in CPU_PRECISIONS or choice.sparsity.kind not in CPU_SPARSITY_KINDS
    }


def check_cpu_choices(decisions: Mapping[str, Choice]) -> None:
    """Raise UnsupportedFormatError naming every layer ORT on CPU cannot run."""
    bad = cpu_unsupported(decisions)
    if bad:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(bad.items())[:6])
        more = f" and {len(bad) - 6} more" if len(bad) > 6 else ""
        raise UnsupportedFormatError(
            f"ONNX Runtime on CPU cannot run {len(bad)} planned layer(s): {shown}{more}; "
            f"CPU formats are {', '.join(sorted(p.value for p in CPU_PRECISIONS))} with dense, "
            "unstructured, block or channel sparsity: re-plan for a CPU target"
        )


# ---- packing (numpy; ONNX MatMul's B is [K, N] = the torch weight transposed) ---------------
def quantize_layer(weight: torch.Tensor, precision: Precision,
                   given: QuantizedWeight | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes [N, K] and scales [N, groups] of one layer, from autoplan.quant.

    `given` (the QuantizedWeight of the plan's SimulatedLinear, e.g. GPTQ-rounded) is packed
    as it is, so the ONNX model holds exactly the weights whose quality was measured;
    without it the weight is rounded to nearest by the same quantize_weight.
    """
    q = given if given is not None else quantize_weight(weight.detach().float(), precision)
    if q.precision is not precision or q.codes is None:
        raise AutoplanError(f"quantized weight is {q.precision.value}, plan says {precision.value}")
    scales = q.scales["weight_scale"].float().reshape(q.codes.shape[0], -1)
    return q.codes.cpu().numpy().astype(np.int8), scales.cpu().numpy()


def pack_nbits(codes: np.ndarray, scales: np.ndarray, bits: int, block: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """MatMulNBits' B and scales from codes [N, K] and scales [N, groups or 1].

    B is uint8 [N, n_blocks, block*bits/8] holding code + 2**(bits-1) (the op's default zero
    point; K zero-padded to whole blocks); for 4 bits element 2j sits in the low nibble and
    2j+1 in the high nibble of byte j. One scale per (N, block): a per-channel scale is
    repeated for every block.
    """
    n, k = codes.shape
    n_blocks = -(-k // block)
    if scales.shape[1] not in (1, n_blocks):
        raise AutoplanError(f"{scales.shape[1]} scale groups do not match {n_blocks} blocks of "
                            f"{block} over K={k}")
    padded = np.zeros((n, n_blocks * block), dtype=np.int32)
    padded[:, :k] = codes
    unsigned = (padded + (1 << (bits - 1))).astype(np.uint8).reshape(n, n_blocks, block)
    if bits == 4:
        unsigned = unsigned[..., 0::2] | (unsigned[..., 1::2] << 4)
    full = np.broadcast_to(scales, (n, n_blocks)).astype(np.float32)
    return np.ascontiguousarray(unsigned), np.ascontiguousarray(full.reshape(-1))


def unpack_nbits(packed: np.ndarray, scales: np.ndarray, bits: int, k: int) -> np.ndarray:
    """Dequantize MatMulNBits initializers back to a float32 [K, N] weight (for audits/tests)."""
    n, n_blocks, _ = packed.shape
    if bits == 8:
        unsigned = packed.astype(np.int32)
    else:
        unsigned = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(n, n_blocks, -1)
        unsigned = unsigned.astype(np.int32)
    values = (unsigned - (1 << (bits - 1))) * scales.reshape(n, n_blocks, 1)
    return values.reshape(n, -1)[:, :k].T.astype(np.float32)


# ---- graph rewrite --------------------------------------------------------------------------
def quantize_graph(model: onnx.ModelProto, decisions: Mapping[str, Choice],
                   quantized: Mapping[str, QuantizedWeight] | None = None) -> list[QuantizedNode]:
    """Rewrite each decided layer's MatMul node of `model` in place; fail if one is missing.

    Args:
        model: the fp32 decoder from onnx_graph.build_decoder: MatMul nodes named by layer, or
            packing several layers as recorded in its `autoplan.fused_layers` metadata.
        decisions: layer name -> Choice; layers not listed stay fp32.
        quantized: optional layer -> QuantizedWeight already computed for the plan (GPTQ
            codes); other quantized layers are rounded to nearest by autoplan.quant.

    Returns:
        One QuantizedNode per linear layer of the graph, in graph order.
    """
    check_cpu_choices(decisions)
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    packed = json.loads({p.key: p.value for p in model.metadata_props}.get(FUSED_KEY, "{}"))
    members = {n.name: [(layer, tuple(cols)) for layer, cols in packed.get(n.name, [])]
               or [(n.name, None)]
               for n in graph.node if n.op_type == "MatMul" and n.input[1] in inits}
    known = {layer for group in members.values() for layer, _ in group}
    missing = sorted(set(decisions) - known)
    if missing:
        raise AutoplanError(f"no MatMul node for planned layer(s) {', '.join(missing[:5])}: the "
                            "exported graph and the plan disagree on layer names")
    out: list[QuantizedNode] = []
    new_nodes: list[onnx.NodeProto] = []
    act_quantized: set[str] = set()
    for node in graph.node:
        if node.name not in members:
            new_nodes.append(node)
            continue
        group = members[node.name]
        choices = {decisions.get(layer, _FP32) for layer, _ in group}
        if len(choices) > 1:
            raise AutoplanError(f"node {node.name} computes {', '.join(l for l, _ in group)} "
                                "as one GEMM but the plan gives them different formats")
        choice = choices.pop()
        if choice.precision is Precision.FP32:
            new_nodes.append(node)
            out += [QuantizedNode(layer, str(choice), "MatMul", node.name,
                                  {"weight": node.input[1]}, cols) for layer, cols in group]
            continue
        w_t = numpy_helper.to_array(inits.pop(node.input[1]))
        graph.initializer.remove(next(t for t in graph.initializer if t.name == node.input[1]))
        parts = [quantize_layer(torch.from_numpy(np.ascontiguousarray(
                     (w_t if cols is None else w_t[:, cols[0]:cols[1]]).T)),
                 choice.precision, (quantized or {}).get(layer)) for layer, cols in group]
        codes = np.concatenate([c for c, _ in parts], axis=0)
        scales = np.concatenate([sc for _, sc in parts], axis=0)
        if choice.precision is Precision.INT8:
            built, tensors = _int8_nodes(node, codes, scales, act_quantized)
        else:
            built, tensors = _nbits_nodes(node, codes, scales, choice.precision)
        graph.initializer.extend(tensors)
        new_nodes += built
        main = next(b for b in built if b.name == node.name)
        out += [QuantizedNode(layer, str(choice), main.op_type, main.name,
                              {"weight": tensors[0].name, "scale": tensors[1].name}, cols)
                for layer, cols in group]
    del graph.node[:]
    graph.node.extend(new_nodes)
    converted = {q.layer for q in out if q.op_type != "MatMul"}
    wanted = {k for k, c in decisions.items() if c.precision is not Precision.FP32}
    if converted != wanted:
        raise AutoplanError(f"layers planned but not converted: {sorted(wanted - converted)[:5]}")
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return out


def _int8_nodes(node: onnx.NodeProto, codes: np.ndarray, scales: np.ndarray,
                act_quantized: set[str]) -> tuple[list[onnx.NodeProto], list[TensorProto]]:
    name, x, y = node.name, node.input[0], node.output[0]
    if scales.shape[1] != 1:
        raise AutoplanError(f"{name}: int8 needs one scale per output channel")
    w_q = numpy_helper.from_array(np.ascontiguousarray(codes.T), f"{name}.weight_int8")
    w_s = numpy_helper.from_array(np.ascontiguousarray(scales[:, 0]), f"{name}.weight_scale")
    # One DynamicQuantizeLinear per input tensor: q/k/v (and gate/up) share their input, so
    # they share its quantization, as ORT's quantize_dynamic does.
    xq, xs, xz = f"{x}_q", f"{x}_scale", f"{x}_zp"
    built = []
    if x not in act_quantized:
        act_quantized.add(x)
        built.append(helper.make_node("DynamicQuantizeLinear", [x], [xq, xs, xz],
                                      name=f"{x}.act_quant"))
    built += [
        helper.make_node("MatMulInteger", [xq, w_q.name, xz], [f"{name}/int32"], name=name),
        helper.make_node("Cast", [f"{name}/int32"], [f"{name}/int32_f"], name=f"{name}.cast",
                         to=TensorProto.FLOAT),
        helper.make_node("Mul", [xs, w_s.name], [f"{name}/scale"], name=f"{name}.scale"),
        helper.make_node("Mul", [f"{name}/int32_f", f"{name}/scale"], [y], name=f"{name}.dequant"),
    ]
    return built, [w_q, w_s]


def _nbits_nodes(node: onnx.NodeProto, codes: np.ndarray, scales: np.ndarray,
                 precision: Precision) -> tuple[list[onnx.NodeProto], list[TensorProto]]:
    name = node.name
    n, k = codes.shape
    bits, block, accuracy_level = nbits_layout(precision)
    packed, flat_scales = pack_nbits(codes, scales, bits, block)
    b = numpy_helper.from_array(packed, f"{name}.weight_q{bits}")
    s = numpy_helper.from_array(flat_scales, f"{name}.weight_scale")
    built = [helper.make_node(
        "MatMulNBits", [node.input[0], b.name, s.name], list(node.output), name=name,
        domain=MS_DOMAIN, K=k, N=n, bits=bits, block_size=block, accuracy_level=accuracy_level,
    )]
    return built, [b, s]


def dequantized_weights(model: onnx.ModelProto, records: list[QuantizedNode]
                        ) -> dict[str, np.ndarray]:
    """Float32 [K, N] weights as the ONNX graph stores them, per layer (for numerics tests)."""
    inits = {t.name: t for t in model.graph.initializer}
    nodes = {n.name: n for n in model.graph.node}
    out: dict[str, np.ndarray] = {}
    for rec in records:
        weight = numpy_helper.to_array(inits[rec.tensors["weight"]])
        if rec.op_type == "MatMul":
            full = weight.astype(np.float32)
        elif rec.op_type == "MatMulInteger":
            scale = numpy_helper.to_array(inits[rec.tensors["scale"]])
            full = weight.astype(np.float32) * scale[None, :]
        else:
            attrs = {a.name: helper.get_attribute_value(a) for a in nodes[rec.node].attribute}
            scale = numpy_helper.to_array(inits[rec.tensors["scale"]])
            full = unpack_nbits(weight, scale, attrs["bits"], attrs["K"])
        out[rec.layer] = full if rec.columns is None else full[:, rec.columns[0]:rec.columns[1]]
    return out


def records_from_manifest(manifest: Mapping[str, Any]) -> list[QuantizedNode]:
    """The QuantizedNode records an artifact's manifest.json lists (for audits and tests)."""
    return [QuantizedNode(name, entry["choice"], entry["op_type"], entry["node"],
                          {role: t["name"] for role, t in entry["tensors"].items()},
                          tuple(entry["columns"]) if entry.get("columns") else None)
            for name, entry in manifest["layers"].items()]


def tensor_sha256(model: onnx.ModelProto, names: list[str]) -> dict[str, str]:
    """sha256 of each named initializer's raw little-endian bytes (the plan audit)."""
    inits = {t.name: t for t in model.graph.initializer}
    return {name: hashlib.sha256(numpy_helper.to_array(inits[name]).tobytes()).hexdigest()
            for name in names}


__all__ = [
    "CPU_PRECISIONS", "CPU_SPARSITY_KINDS", "QuantizedNode", "check_cpu_choices",
    "cpu_unsupported", "dequantized_weights", "nbits_layout", "pack_nbits", "quantize_graph", "quantize_layer",
    "records_from_manifest", "tensor_sha256", "unpack_nbits",
]
