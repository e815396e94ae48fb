"""Per-layer weight quantization of an exported ONNX decoder, in the formats ONNX Runtime runs.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from autoplan.backends.cpu import onnx_data
from autoplan.backends.cpu.onnx_data import read_array
from autoplan.backends.cpu.onnx_graph import FUSED_KEY, TIED_OP
from autoplan.errors import AutoplanError, UnsupportedFormatError
from autoplan.formats import DENSE, Choice, OrtNode, Precision, format_spec
from autoplan.quant import QuantizedWeight, quantize_weight

MS_DOMAIN = "com.microsoft"
RUNTIME = "onnxruntime"
_FP32 = Choice(DENSE, Precision.FP32)


def ort_node(precision: Precision) -> OrtNode:
    """The ORT node computing `precision` (its FormatSpec's ``onnx`` name).

    The MatMulNBits accuracy level follows the format, never a switch: level 4 rounds
    activations to int8, which only the *a8 formats simulate, so any other level would run
    numerics nobody measured.

    Raises:
        UnsupportedFormatError: the ONNX export cannot hold the format (the spec says why).
    """
    return format_spec(precision).exported_as("onnx")


@dataclass(frozen=True)
class QuantizedNode:
    """What one layer became: the ops that compute it and the tensors that store it."""

    layer: str
    choice: str
    op_type: str  # MatMul | MatMulInteger | MatMulNBits | FusedMatMul (a tied fp32 lm_head)
    node: str
    tensors: dict[str, str]  # role (weight, scale, zero_point) -> initializer name
    columns: tuple[int, int] | None = None  # this layer's output columns in a packed node


# ---- packing (numpy; ONNX MatMul's B is [K, N] = the torch weight transposed) ---------------
@dataclass(frozen=True)
class LayerCodes:
    """One layer's integer weights as autoplan.quant made them.

    codes: [N, K] integers (int8 -8..7 / -127..127 when symmetric, 0..15 with zero points).
    scales: [N, groups] float32 (groups = 1 for per-channel formats).
    zero_points: [N, groups] uint8 for asymmetric formats, else None.
    """

    codes: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None = None


def quantize_layer(weight: torch.Tensor, precision: Precision,
                   given: QuantizedWeight | None = None) -> LayerCodes:
    """Integer codes, scales (and zero points) of one layer, from autoplan.quant.

    `given` (the QuantizedWeight of the plan's SimulatedLinear, e.g. GPTQ-rounded) is packed
    as it is, so the ONNX model holds exactly the weights whose quality was measured;
    without it the weight is rounded to nearest by the same quantize_weight.
    """
    q = given if given is not None else quantize_weight(weight.detach().float(), precision)
    if q.precision is not precision or q.codes is None:
        raise AutoplanError(f"quantized weight is {q.precision.value}, plan says {precision.value}")
    rows = q.codes.shape[0]
    scales = q.scales["weight_scale"].float().reshape(rows, -1).cpu().numpy()
    zp = q.scales.get("weight_zero_point")
    return LayerCodes(q.codes.cpu().numpy().astype(np.int32), scales,
                      None if zp is None else zp.reshape(rows, -1).cpu().numpy().astype(np.uint8))


def _pack_low_first(values: np.ndarray, bits: int) -> np.ndarray:
    """Pack unsigned `bits`-bit values along the last axis, element 2j in the low nibble."""
    values = values.astype(np.uint8)
    if bits == 8:
        return values
    if values.shape[-1] % 2:
        values = np.concatenate([values, np.zeros_like(values[..., :1])], axis=-1)
    return values[..., 0::2] | (values[..., 1::2] << 4)


def pack_nbits(layer: LayerCodes, bits: int, block: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """MatMulNBits' B, scales and (packed) zero points from one layer's codes.

    B is uint8 [N, n_blocks, block*bits/8] of unsigned codes, element 2j in the low nibble
    and 2j+1 in the high nibble of byte j (4 bits). Symmetric codes are stored + 2**(bits-1),
    the op's default zero point, and no zero-point input is written; asymmetric codes are
    stored as they are, with zero points packed the same way per row: uint8
    [N, ceil(n_blocks * bits / 8)]. K is padded to whole blocks with the block's zero point
    (which dequantizes to 0). One scale per (N, block), flat; a per-channel scale is repeated
    for every block.
    """
    codes, scales = layer.codes, layer.scales
    n, k = codes.shape
    n_blocks = -(-k // block)
    if scales.shape[1] not in (1, n_blocks):
        raise AutoplanError(f"{scales.shape[1]} scale groups do not match {n_blocks} blocks of "
                            f"{block} over K={k}")
    if layer.zero_points is None:
        unsigned = codes + (1 << (bits - 1))
        zp = np.full((n, n_blocks), 1 << (bits - 1), dtype=np.int32)
    else:
        unsigned = codes
        zp = np.broadcast_to(layer.zero_points, (n, n_blocks)).astype(np.int32)
    padded = np.repeat(zp, block, axis=1)  # padding holds the block's zero point
    padded[:, :k] = unsigned
    packed = _pack_low_first(padded.reshape(n, n_blocks, block), bits)
    full = np.broadcast_to(scales, (n, n_blocks)).astype(np.float32)
    zp_packed = None if layer.zero_points is None else np.ascontiguousarray(
        _pack_low_first(zp, bits))
    return np.ascontiguousarray(packed), np.ascontiguousarray(full.reshape(-1)), zp_packed


def unpack_nbits(packed: np.ndarray, scales: np.ndarray, bits: int, k: int,
                 zero_points: np.ndarray | None = None) -> np.ndarray:
    """Dequantize MatMulNBits initializers, (code - zero point) * scale, to a float32 [K, N]
    weight (for audits and tests)."""
    n, n_blocks, _ = packed.shape

    def unpack(v: np.ndarray) -> np.ndarray:
        if bits == 8:
            return v.astype(np.int32)
        return np.stack([v & 0x0F, v >> 4], axis=-1).reshape(*v.shape[:-1], -1).astype(np.int32)

    unsigned = unpack(packed).reshape(n, n_blocks, -1)
    if zero_points is None:
        zp = np.full((n, n_blocks), 1 << (bits - 1), dtype=np.int32)
    else:
        zp = unpack(zero_points.reshape(n, -1))[:, :n_blocks]
    values = (unsigned - zp[..., None]) * scales.reshape(n, n_blocks, 1)
    return values.reshape(n, -1)[:, :k].T.astype(np.float32)


# ---- graph rewrite --------------------------------------------------------------------------
def quantize_graph(model: onnx.ModelProto, decisions: Mapping[str, Choice],
                   quantized: Mapping[str, QuantizedWeight] | None = None,
                   base_dir: str | Path | None = None) -> list[QuantizedNode]:
    """Rewrite each decided layer's MatMul node of `model` in place; fail if one is missing.

    Args:
        model: the fp32 decoder from onnx_graph.build_decoder: MatMul nodes named by layer, or
            packing several layers as recorded in its `autoplan.fused_layers` metadata.
        decisions: layer name -> Choice; layers not listed stay fp32.
        quantized: optional layer -> QuantizedWeight already computed for the plan (GPTQ
            codes); other quantized layers are rounded to nearest by autoplan.quant.
        base_dir: the folder of the data file the graph's external weights lie in.

    Returns:
        One QuantizedNode per linear layer of the graph, in graph order.
    """
    for choice in set(decisions.values()):
        ort_node(choice.precision)  # every planned format has an ONNX name (or says why not)
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
        spec = ort_node(choice.precision)
        if spec.op == "MatMul":
            new_nodes.append(node)
            out += [QuantizedNode(layer, str(choice), "MatMul", node.name,
                                  {"weight": node.input[1]}, cols) for layer, cols in group]
            continue
        w_t = read_array(inits.pop(node.input[1]), base_dir)
        graph.initializer.remove(next(t for t in graph.initializer if t.name == node.input[1]))
        parts = [quantize_layer(torch.from_numpy(np.ascontiguousarray(
                     (w_t if cols is None else w_t[:, cols[0]:cols[1]]).T)),
                 choice.precision, (quantized or {}).get(layer)) for layer, cols in group]
        zps = [p.zero_points for p in parts]
        layer_codes = LayerCodes(np.concatenate([p.codes for p in parts], axis=0),
                                 np.concatenate([p.scales for p in parts], axis=0),
                                 None if zps[0] is None else np.concatenate(zps, axis=0))
        if spec.op == "MatMulInteger":
            built, tensors = _int8_nodes(node, layer_codes, act_quantized)
        else:
            built, tensors = _nbits_nodes(node, layer_codes, spec)
        graph.initializer.extend(tensors.values())
        new_nodes += built
        main = next(b for b in built if b.name == node.name)
        roles = {role: t.name for role, t in tensors.items()}
        out += [QuantizedNode(layer, str(choice), main.op_type, main.name, roles, cols)
                for layer, cols in group]
    del graph.node[:]
    graph.node.extend(new_nodes)
    converted = {q.layer for q in out if q.op_type != "MatMul"}
    wanted = {k for k, c in decisions.items() if ort_node(c.precision).op != "MatMul"}
    if converted != wanted:
        raise AutoplanError(f"layers planned but not converted: {sorted(wanted - converted)[:5]}")
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return out


def _int8_nodes(node: onnx.NodeProto, layer: LayerCodes, act_quantized: set[str]
                ) -> tuple[list[onnx.NodeProto], dict[str, TensorProto]]:
    name, x, y = node.name, node.input[0], node.output[0]
    codes, scales = layer.codes.astype(np.int16), layer.scales
    if scales.shape[1] != 1:
        raise AutoplanError(f"{name}: int8 needs one scale per output channel")
    # The int8 codes are stored as uint8 with zero point 128 (the same integers): with uint8
    # activations and int8 weights, MLAS's AVX2 kernel (vpmaddubsw, no VNNI) saturates pairs
    # of products at int16 and the result is no longer the simulated one; u8u8 is exact on
    # every CPU.
    w_q = numpy_helper.from_array(np.ascontiguousarray((codes + 128).astype(np.uint8).T),
                                  f"{name}.weight_u8")
    w_zp = numpy_helper.from_array(np.array(128, np.uint8), f"{name}.weight_zp")
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
        helper.make_node("MatMulInteger", [xq, w_q.name, xz, w_zp.name], [f"{name}/int32"],
                         name=name),
        helper.make_node("Cast", [f"{name}/int32"], [f"{name}/int32_f"], name=f"{name}.cast",
                         to=TensorProto.FLOAT),
        helper.make_node("Mul", [xs, w_s.name], [f"{name}/scale"], name=f"{name}.scale"),
        helper.make_node("Mul", [f"{name}/int32_f", f"{name}/scale"], [y], name=f"{name}.dequant"),
    ]
    return built, {"weight": w_q, "scale": w_s, "zero_point": w_zp}


def _nbits_nodes(node: onnx.NodeProto, layer: LayerCodes, spec: OrtNode
                 ) -> tuple[list[onnx.NodeProto], dict[str, TensorProto]]:
    name = node.name
    n, k = layer.codes.shape
    if spec.zero_points != (layer.zero_points is not None):
        raise AutoplanError(f"{name}: the format {'needs' if spec.zero_points else 'has no'} "
                            "zero points but the quantized weight disagrees (please report)")
    packed, flat_scales, zp = pack_nbits(layer, spec.bits, spec.block)
    tensors = {"weight": numpy_helper.from_array(packed, f"{name}.weight_q{spec.bits}"),
               "scale": numpy_helper.from_array(flat_scales, f"{name}.weight_scale")}
    if zp is not None:
        tensors["zero_point"] = numpy_helper.from_array(zp, f"{name}.weight_zero_point")
    built = [helper.make_node(
        "MatMulNBits", [node.input[0], *(t.name for t in tensors.values())], list(node.output),
        name=name, domain=MS_DOMAIN, K=k, N=n, bits=spec.bits, block_size=spec.block,
        accuracy_level=spec.accuracy_level,
    )]
    return built, tensors


def dequantized_weights(model: onnx.ModelProto, records: list[QuantizedNode],
                        base_dir: str | Path | None = None) -> dict[str, np.ndarray]:
    """Float32 [K, N] weights as the ONNX graph stores them, per layer (for numerics tests)."""
    inits = {t.name: t for t in model.graph.initializer}
    nodes = {n.name: n for n in model.graph.node}
    out: dict[str, np.ndarray] = {}
    for rec in records:
        weight = read_array(inits[rec.tensors["weight"]], base_dir)
        if rec.op_type == "MatMul":
            full = weight.astype(np.float32)
        elif rec.op_type == TIED_OP:  # the embedding table [N, K], read transposed
            full = weight.T.astype(np.float32)
        elif rec.op_type == "MatMulInteger":
            scale = numpy_helper.to_array(inits[rec.tensors["scale"]])
            zp_name = rec.tensors.get("zero_point")  # uint8 codes + 128 (older: int8, none)
            zp = 0 if zp_name is None else int(numpy_helper.to_array(inits[zp_name]))
            full = (weight.astype(np.float32) - zp) * scale[None, :]
        else:
            attrs = {a.name: helper.get_attribute_value(a) for a in nodes[rec.node].attribute}
            scale = numpy_helper.to_array(inits[rec.tensors["scale"]])
            zp_name = rec.tensors.get("zero_point")
            zp = None if zp_name is None else numpy_helper.to_array(inits[zp_name])
            full = unpack_nbits(weight, scale, attrs["bits"], attrs["K"], zp)
        out[rec.layer] = full if rec.columns is None else full[:, rec.columns[0]:rec.columns[1]]
    return out


def records_from_manifest(manifest: Mapping[str, Any]) -> list[QuantizedNode]:
    """The QuantizedNode records an artifact's manifest.json lists (for audits and tests)."""
    return [QuantizedNode(name, entry["choice"], entry["op_type"], entry["node"],
                          {role: t["name"] for role, t in entry["tensors"].items()},
                          tuple(entry["columns"]) if entry.get("columns") else None)
            for name, entry in manifest["layers"].items()]


def tensor_sha256(model: onnx.ModelProto, names: list[str],
                  base_dir: str | Path | None = None) -> dict[str, str]:
    """sha256 of each named initializer's raw little-endian bytes (the plan audit), read
    from its data file under `base_dir` when it lies in one."""
    inits = {t.name: t for t in model.graph.initializer}
    return {name: onnx_data.tensor_sha256(inits[name], base_dir) for name in names}


__all__ = [
    "RUNTIME", "LayerCodes", "QuantizedNode",
    "dequantized_weights", "ort_node", "pack_nbits", "quantize_graph", "quantize_layer",
    "records_from_manifest", "tensor_sha256", "unpack_nbits",
]
