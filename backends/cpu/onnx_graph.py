"""Build a transformers decoder-only causal LM as one ONNX decoder graph with a KV cache.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

import numpy as np
import onnx
import torch
from autoplan.backends.cpu.onnx_arch import (
    SUPPORTED_TYPES,
    Arch,
    Rope,
    check_supported,
    norm_eps,
    read_arch,
)
from autoplan.backends.cpu.onnx_data import EXTERNAL_MIN, TensorFile
from onnx import TensorProto, helper, numpy_helper

from autoplan.errors import ModelConfigError

OPSET = 17
FUSED_KEY = "autoplan.fused_layers"
TIED_OP = "FusedMatMul"  # a tied lm_head's node: logits = x @ embedding^T (transB=1)
_NEG = float(np.finfo(np.float32).min)


class _Graph:
    """Tiny node/initializer accumulator with unique names."""

    def __init__(self, masks: Mapping[str, torch.Tensor],
                 weights: Mapping[str, torch.Tensor], data: TensorFile | None = None) -> None:
        self.masks, self.weights, self.data = masks, weights, data
        self.fused: dict[str, list] = {}  # node -> [[layer, [start, stop]]] of packed linears
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._consts: set[str] = set()
        self._n = 0

    def op(self, op_type: str, inputs: list[str], name: str | None = None, n_out: int = 1,
           **attrs) -> str:
        self._n += 1
        name = name or f"{op_type}_{self._n}"
        outs = [f"{name}/out{i}" if n_out > 1 else f"{name}/out" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name, **attrs))
        return outs[0]

    def const(self, name: str, value: np.ndarray) -> str:
        """An initializer; a name already made is returned as it is (shared constants)."""
        if name not in self._consts:
            self._consts.add(name)
            value = np.ascontiguousarray(value)
            if self.data is not None and value.nbytes >= EXTERNAL_MIN:
                self.inits.append(self.data.add(name, value))  # written now, not held
            else:
                self.inits.append(numpy_helper.from_array(value, name))
        return name

    def ints(self, name: str, values: list[int]) -> str:
        return self.const(name, np.asarray(values, dtype=np.int64))

    def scalar(self, value: float) -> str:
        """A float32 scalar constant, shared by every node that uses the same value."""
        value = np.float32(value)
        return self.const(f"f32_{float(value):.9g}", np.asarray(value, dtype=np.float32))


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float32).cpu().numpy()


def build_decoder(model: torch.nn.Module, masks: Mapping[str, torch.Tensor] | None = None,
                  fused_attention: bool | None = None,
                  weights: Mapping[str, torch.Tensor] | None = None,
                  fuse_qkv: Callable[[int], bool] | None = None,
                  fuse_gate_up: Callable[[int], bool] | None = None,
                  data: TensorFile | None = None, tie_lm_head: bool = False
                  ) -> onnx.ModelProto:
    """Build the fp32 ONNX decoder of a loaded transformers causal LM.

    Args:
        model: a causal LM of a supported model_type (SUPPORTED_TYPES).
        masks: optional layer name -> {0,1} mask ([out, in]) multiplied into that weight, so
            pruning is baked in without touching the caller's model.
        weights: optional layer name -> replacement weight [out, in] (e.g. a SparseGPT-
            updated or already dequantized weight), used instead of the module's.
        fused_attention: True: ORT's GroupQueryAttention (RoPE, KV append, GQA, soft-cap,
            local window and softmax in one kernel; no left padding: attention_mask must be
            all ones). False: primitive ops (any attention_mask). None: fused when the
            rotary embedding allows it.
        fuse_qkv: block index -> whether q/k/v of that block run as one MatMul
            (`model.layers.i.self_attn.qkv_proj`, GroupQueryAttention's packed input: one
            weight read and one kernel instead of three). Only with fused attention, and only
            for blocks whose three layers share a format (the caller knows the plan). The
            graph's metadata `autoplan.fused_layers` records node -> [[layer, columns]].
            A model that stores q/k/v as one weight (Phi-3) always has one node.
        fuse_gate_up: block index -> whether gate/up of that block run as one MatMul
            (`model.layers.i.mlp.gate_up_proj`, split after): at decode each GEMV call has a
            fixed cost (thread-pool dispatch, activation quantization for int8), so one call
            instead of two saves it per block. Same rule: only when both share a format.
        data: where weights of EXTERNAL_MIN bytes or more go as they are made (the proto
            then refers to that file, read back with ``onnx_data``); None keeps them inside.
        tie_lm_head: when the model ties its lm_head to the embedding (one tensor, no mask
            or replacement weight for it), compute the logits from the embedding table itself
            (com.microsoft FusedMatMul, transB=1) instead of a transposed copy: the table is
            stored once. Only for an fp32 lm_head (the caller knows the plan); a quantized
            one needs its own MatMul weight.

    Returns:
        The ModelProto; linear layers are `MatMul` nodes named by their module path, with the
        weight stored transposed ([in, out]) under `<module>.weight_t`.
    """
    arch = read_arch(model)
    cfg = model.config
    inner = model.model
    g = _Graph(masks or {}, weights or {}, data)

    g.const("model.embed_tokens.weight", _np(inner.embed_tokens.weight))
    x = g.op("Gather", ["model.embed_tokens.weight", "input_ids"], name="embed")
    if arch.embed_scale is not None:
        x = g.op("Mul", [x, g.scalar(arch.embed_scale)], name="embed_scale")
    g.const("two", np.asarray(2.0, dtype=np.float32))
    fused = _fusable(arch) if fused_attention is None else fused_attention
    if fused and not _fusable(arch):
        raise ModelConfigError("GroupQueryAttention cannot apply this model's rotary embedding "
                               "(a magnitude factor, or a width not a multiple of 16): build "
                               "it with fused_attention=False")
    attention = _Fused(g, arch, cfg) if fused else _Primitive(g, arch)

    for i, layer in enumerate(inner.layers):
        p = f"model.layers.{i}"
        h = _rms(g, x, layer.input_layernorm, f"{p}.input_layernorm", arch)
        q, k, v = _qkv(g, h, layer.self_attn, p, arch,
                       packed=fused and fuse_qkv is not None and fuse_qkv(i),
                       keep_packed=fused and not arch.qk_norm)
        if arch.qk_norm:
            q = _head_norm(g, q, layer.self_attn.q_norm, f"{p}.self_attn.q_norm", arch.n_heads,
                           arch)
            k = _head_norm(g, k, layer.self_attn.k_norm, f"{p}.self_attn.k_norm", arch.n_kv,
                           arch)
        out = _linear(g, attention(i, q, k, v), layer.self_attn.o_proj, f"{p}.self_attn.o_proj")
        if arch.sandwich_norms:  # Gemma 2/3: normed before the residual, then a pre-MLP norm
            out = _rms(g, out, layer.post_attention_layernorm, f"{p}.post_attention_layernorm",
                       arch)
            x = g.op("Add", [x, out])
            h = _rms(g, x, layer.pre_feedforward_layernorm, f"{p}.pre_feedforward_layernorm",
                     arch)
        else:
            x = g.op("Add", [x, out])
            h = _rms(g, x, layer.post_attention_layernorm, f"{p}.post_attention_layernorm",
                     arch)
        mlp = layer.mlp
        if arch.fused_gate_up:  # Phi-3: one weight, gate in the first half of its outputs
            both = _linear(g, h, mlp.gate_up_proj, f"{p}.mlp.gate_up_proj")
            gate, up = _split(g, both, [mlp.gate_up_proj.out_features // 2] * 2, f"{p}.mlp.split")
        elif fuse_gate_up is not None and fuse_gate_up(i):
            gate, up = _gate_up(g, h, mlp, p)
        else:
            gate = _linear(g, h, mlp.gate_proj, f"{p}.mlp.gate_proj")
            up = _linear(g, h, mlp.up_proj, f"{p}.mlp.up_proj")
        act = g.op("Mul", [_activation(g, gate, arch.activation), up])
        out = _linear(g, act, mlp.down_proj, f"{p}.mlp.down_proj")
        if arch.sandwich_norms:
            out = _rms(g, out, layer.post_feedforward_layernorm,
                       f"{p}.post_feedforward_layernorm", arch)
        x = g.op("Add", [x, out])

    x = _rms(g, x, inner.norm, "model.norm", arch)
    # Prefill needs only the last position's logits; the lm_head is the largest GEMM.
    neg_keep = g.op("Neg", ["logits_to_keep"])
    x = g.op("Slice", [x, neg_keep, g.ints("int_max", [2**62]), g.ints("axis1", [1])])
    if tie_lm_head and _tied(model, g):
        logits = g.op(TIED_OP, [x, "model.embed_tokens.weight"], name="lm_head",
                      domain="com.microsoft", transB=1)
    else:
        logits = _linear(g, x, model.lm_head, "lm_head")
    if arch.final_softcap:
        logits = _softcap(g, logits, arch.final_softcap, "final_logit_softcap")
    return _assemble(g, cfg, logits, arch.head_dim)


def _tied(model: torch.nn.Module, g: _Graph) -> bool:
    """Whether the lm_head's weight is the embedding table itself, unchanged by the export."""
    head, table = model.lm_head, model.model.embed_tokens.weight
    return (head.weight.data_ptr() == table.data_ptr() and head.weight.shape == table.shape
            and head.weight.dtype == table.dtype and getattr(head, "bias", None) is None
            and "lm_head" not in g.masks and "lm_head" not in g.weights)


def _qkv(g: _Graph, h: str, att: torch.nn.Module, prefix: str, arch: Arch, *, packed: bool,
         keep_packed: bool) -> tuple[str, str, str]:
    """q, k, v of one block; ("qkv", "", "") when GroupQueryAttention takes them packed."""
    q_out, kv_out = arch.n_heads * arch.head_dim, arch.n_kv * arch.head_dim
    node = f"{prefix}.self_attn.qkv_proj"
    if arch.fused_qkv:  # stored as one weight (Phi-3): one layer, one node
        both = _linear(g, h, att.qkv_proj, node)
    elif packed:
        names = [f"{prefix}.self_attn.{n}_proj" for n in "qkv"]
        both = _linear_group(g, h, [att.q_proj, att.k_proj, att.v_proj], names, node)
    else:
        return tuple(_linear(g, h, getattr(att, f"{n}_proj"), f"{prefix}.self_attn.{n}_proj")
                     for n in "qkv")
    if keep_packed:
        return both, "", ""
    return _split(g, both, [q_out, kv_out, kv_out], f"{prefix}.self_attn.split")


def _split(g: _Graph, x: str, sizes: list[int], name: str) -> tuple[str, ...]:
    g.op("Split", [x, g.ints(f"{name}_sizes", sizes)], name=name, n_out=len(sizes), axis=-1)
    return tuple(f"{name}/out{i}" for i in range(len(sizes)))


def _head_norm(g: _Graph, x: str, norm: torch.nn.Module, name: str, heads: int,
               arch: Arch) -> str:
    """RMSNorm over each head's dimensions (Qwen3 / Gemma 3 q_norm and k_norm)."""
    per_head = g.op("Reshape", [x, g.ints(f"shape_norm_{heads}", [0, 0, heads, arch.head_dim])])
    normed = _rms(g, per_head, norm, name, arch)
    return g.op("Reshape", [normed, g.ints(f"shape_merge_{heads}", [0, 0, heads * arch.head_dim])])


def _activation(g: _Graph, x: str, kind: str) -> str:
    if kind == "silu":
        return g.op("Mul", [x, g.op("Sigmoid", [x])])
    if kind == "gelu":  # 0.5 x (1 + erf(x / sqrt 2))
        erf = g.op("Erf", [g.op("Mul", [x, g.scalar(2**-0.5)])])
        return g.op("Mul", [g.op("Mul", [x, g.scalar(0.5)]), g.op("Add", [erf, g.scalar(1.0)])])
    # gelu_tanh: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), torch's approximate="tanh"
    cube = g.op("Mul", [g.op("Mul", [x, x]), x])
    inner = g.op("Mul", [g.op("Add", [x, g.op("Mul", [cube, g.scalar(0.044715)])]),
                         g.scalar(float(np.sqrt(2 / np.pi)))])
    return g.op("Mul", [g.op("Mul", [x, g.scalar(0.5)]),
                        g.op("Add", [g.op("Tanh", [inner]), g.scalar(1.0)])])


def _softcap(g: _Graph, x: str, cap: float, name: str | None = None) -> str:
    """cap * tanh(x / cap), as transformers soft-caps Gemma 2's logits."""
    c = g.scalar(cap)
    return g.op("Mul", [g.op("Tanh", [g.op("Div", [x, c])]), c], name=name)


class _Primitive:
    """Attention from primitive ONNX ops: any attention_mask (left padding) is honoured."""

    def __init__(self, g: _Graph, arch: Arch) -> None:
        self.g, self.arch = g, arch
        self.rotary = {key: _rotary(g, rope, key) for key, rope in arch.ropes.items()}
        self.bias = _attention_bias(g, arch.n_heads // arch.n_kv,
                                    sorted({b.window for b in arch.blocks}, key=str))
        n_heads, n_kv, head_dim = arch.n_heads, arch.n_kv, arch.head_dim
        g.ints("shape_heads_q", [0, 0, n_heads, head_dim])
        g.ints("shape_heads_kv", [0, 0, n_kv, head_dim])
        g.ints("shape_groups", [0, n_kv, -1, head_dim])
        g.ints("shape_heads", [0, n_heads, -1, head_dim])
        g.ints("shape_merge", [0, 0, n_heads * head_dim])
        g.const("attn_scale", np.asarray(arch.attn_scale, dtype=np.float32))

    def __call__(self, i: int, q: str, k: str, v: str) -> str:
        g, arch = self.g, self.arch
        block = arch.blocks[i]
        cos, sin = self.rotary[block.rope]
        dim = arch.ropes[block.rope].dim
        q = g.op("Transpose", [g.op("Reshape", [q, "shape_heads_q"])], perm=[0, 2, 1, 3])
        k = g.op("Transpose", [g.op("Reshape", [k, "shape_heads_kv"])], perm=[0, 2, 1, 3])
        v = g.op("Transpose", [g.op("Reshape", [v, "shape_heads_kv"])], perm=[0, 2, 1, 3])
        q = _rope(g, q, cos, sin, dim, arch.head_dim)
        k = _rope(g, k, cos, sin, dim, arch.head_dim)
        k_all = g.op("Concat", [f"past_key_values.{i}.key", k], name=f"present.{i}.key", axis=2)
        v_all = g.op("Concat", [f"past_key_values.{i}.value", v], name=f"present.{i}.value",
                     axis=2)
        # GQA without copying K/V: fold the `rep` query heads that share a KV head into the
        # sequence axis, [B, H, S, D] -> [B, KV, rep*S, D] (head h uses KV head h // rep).
        qg = g.op("Mul", [g.op("Reshape", [q, "shape_groups"]), "attn_scale"])
        scores = g.op("MatMul", [qg, g.op("Transpose", [k_all], perm=[0, 1, 3, 2])])
        if arch.attn_softcap:
            scores = _softcap(g, scores, arch.attn_softcap)
        probs = g.op("Softmax", [g.op("Add", [scores, self.bias[block.window]])], axis=-1)
        ctx = g.op("Reshape", [g.op("MatMul", [probs, v_all]), "shape_heads"])
        return g.op("Reshape", [g.op("Transpose", [ctx], perm=[0, 2, 1, 3]), "shape_merge"])


class _Fused:
    """com.microsoft GroupQueryAttention: one node per layer instead of about thirty, which
    matters at decode where a small model's step is dominated by per-node overhead. Its
    `scale`, `softcap` and `local_window_size` attributes carry Gemma's attention scale,
    logit soft-cap and sliding window; each block reads its own rotary table."""

    def __init__(self, g: _Graph, arch: Arch, cfg) -> None:  # noqa: ANN001 - an HF config
        self.g, self.arch = g, arch
        positions = np.arange(cfg.max_position_embeddings, dtype=np.float32)[:, None]
        for key, rope in arch.ropes.items():
            freqs = positions * rope.inv_freq[None, :]  # float32, as transformers computes
            g.const(f"rope.{key}.cos_cache", np.cos(freqs).astype(np.float32))
            g.const(f"rope.{key}.sin_cache", np.sin(freqs).astype(np.float32))
        # seqlens_k = tokens per row - 1 and the total length, as int32 (the op's contract).
        ones = g.op("ReduceSum", ["attention_mask", g.ints("axis_seq", [1])], keepdims=0)
        g.op("Cast", [g.op("Sub", [ones, g.const("int_one", np.asarray(1, np.int64))])],
             name="seqlens_k", to=TensorProto.INT32)
        total = g.op("Gather", [g.op("Shape", ["attention_mask"]),
                                g.const("int_idx1", np.asarray(1, np.int64))], axis=0)
        g.op("Cast", [total], name="total_len", to=TensorProto.INT32)

    def __call__(self, i: int, q: str, k: str, v: str) -> str:
        g, arch = self.g, self.arch
        block = arch.blocks[i]
        name = f"model.layers.{i}.self_attn.gqa"
        out = f"{name}/out"
        extra = {}
        if arch.attn_softcap:
            extra["softcap"] = float(arch.attn_softcap)
        if block.window:
            # the query and the window - 1 keys before it, as transformers' key > query -
            # window (tests: a 4-token window over 11 tokens, prefill and decode)
            extra["local_window_size"] = int(block.window)
        g.nodes.append(helper.make_node(
            "GroupQueryAttention",
            [q, k, v, f"past_key_values.{i}.key", f"past_key_values.{i}.value", "seqlens_k/out",
             "total_len/out", f"rope.{block.rope}.cos_cache", f"rope.{block.rope}.sin_cache"],
            [out, f"present.{i}.key/out", f"present.{i}.value/out"], name=name,
            domain="com.microsoft", num_heads=arch.n_heads, kv_num_heads=arch.n_kv, do_rotary=1,
            rotary_interleaved=0, scale=float(arch.attn_scale), **extra))
        return out


def _fusable(arch: Arch) -> bool:
    # GroupQueryAttention's rotary takes one cos/sin table (no longrope switch) without a
    # magnitude factor, whose width (rotary_dim / 2, partial rotary included) is a multiple of 8.
    return all(rope.scale == 1.0 and (rope.dim // 2) % 8 == 0 and rope.long_inv_freq is None
               for rope in arch.ropes.values())


def _weight(g: _Graph, module: torch.nn.Linear, name: str) -> np.ndarray:
    weight = g.weights.get(name, module.weight)
    if name in g.masks:
        weight = weight * g.masks[name].to(weight.dtype)
    return _np(weight)


def _gate_up(g: _Graph, x: str, mlp: torch.nn.Module, prefix: str) -> tuple[str, str]:
    """gate and up as one packed MatMul, split back along the last axis."""
    names = [f"{prefix}.mlp.gate_proj", f"{prefix}.mlp.up_proj"]
    both = _linear_group(g, x, [mlp.gate_proj, mlp.up_proj], names, f"{prefix}.mlp.gate_up_proj")
    return _split(g, both, [mlp.gate_proj.out_features, mlp.up_proj.out_features],
                  f"{prefix}.mlp.split")


def _linear(g: _Graph, x: str, module: torch.nn.Linear, name: str) -> str:
    return _linear_group(g, x, [module], [name], name)


def _linear_group(g: _Graph, x: str, modules: list[torch.nn.Linear], names: list[str],
                  node: str) -> str:
    """One MatMul computing several linears side by side (their outputs concatenated)."""
    weights = [_weight(g, m, n) for m, n in zip(modules, names)]
    # [in, out] made in one copy (a 262k-vocabulary lm_head is 0.67 GB fp32)
    w = g.const(f"{node}.weight_t", np.concatenate([w.T for w in weights], axis=1))
    y = g.op("MatMul", [x, w], name=node)
    if len(names) > 1:
        start, cols = 0, []
        for name, wt in zip(names, weights):
            cols.append([name, [start, start + wt.shape[0]]])
            start += wt.shape[0]
        g.fused[node] = cols
    biases = [getattr(m, "bias", None) for m in modules]
    if any(b is not None for b in biases):
        full = np.concatenate([_np(b) if b is not None else np.zeros(wt.shape[0], np.float32)
                               for b, wt in zip(biases, weights)])
        y = g.op("Add", [y, g.const(f"{node}.bias", full)], name=f"{node}.bias_add")
    return y


def _rms(g: _Graph, x: str, norm: torch.nn.Module, name: str, arch: Arch) -> str:
    # Pow -> ReduceMean -> Add -> Sqrt -> Div -> Mul is the pattern ORT fuses into
    # SimplifiedLayerNormalization. Gemma's norms scale by (1 + w), added in float32 as
    # transformers does.
    var = g.op("ReduceMean", [g.op("Pow", [x, "two"])], axes=[-1], keepdims=1)
    normed = g.op("Div", [x, g.op("Sqrt", [g.op("Add", [var, g.scalar(norm_eps(norm))])])])
    weight = _np(norm.weight) + np.float32(arch.norm_offset)
    return g.op("Mul", [normed, g.const(f"{name}.weight", weight)], name=name)


def _rotary(g: _Graph, rope: Rope, key: str) -> tuple[str, str]:
    """cos/sin [B, 1, S, rotary_dim] from position_ids, using the model's inv_freq and scaling."""
    pos = g.op("Unsqueeze", [g.op("Cast", ["position_ids"], to=TensorProto.FLOAT),
                             g.ints("axis_last", [-1])])
    inv_freq = g.const(f"rope.{key}.inv_freq", rope.inv_freq)
    if rope.long_inv_freq is not None:  # longrope: long frequencies past the switch point,
        # decided per call on its largest position, as transformers decides it
        longest = g.op("Add", [g.op("ReduceMax", ["position_ids"], keepdims=0),
                               g.const("int_one", np.asarray(1, np.int64))])
        use_long = g.op("Greater", [longest, g.const(f"rope.{key}.switch",
                                                     np.asarray(rope.switch_at, np.int64))])
        inv_freq = g.op("Where", [use_long, g.const(f"rope.{key}.long_inv_freq",
                                                    rope.long_inv_freq), inv_freq])
    freqs = g.op("Mul", [pos, inv_freq])
    emb = g.op("Concat", [freqs, freqs], axis=-1)
    cos = g.op("Mul", [g.op("Cos", [emb]), g.scalar(rope.scale)])
    sin = g.op("Mul", [g.op("Sin", [emb]), g.scalar(rope.scale)])
    heads_axis = g.ints("axis_heads", [1])
    return g.op("Unsqueeze", [cos, heads_axis], name=f"rope.{key}.cos"), g.op(
        "Unsqueeze", [sin, heads_axis], name=f"rope.{key}.sin")


def _rope(g: _Graph, x: str, cos: str, sin: str, dim: int, head_dim: int) -> str:
    """x*cos + rotate_half(x)*sin, rotate_half(x) = concat(-x[..., D/2:], x[..., :D/2]), over
    the first `dim` dimensions; the rest pass through (partial rotary)."""
    axis, lo = g.ints("rope.axis", [-1]), g.ints("rope.0", [0])
    mid, hi = g.ints(f"rope.{dim // 2}", [dim // 2]), g.ints(f"rope.{dim}", [dim])
    rot = x if dim == head_dim else g.op("Slice", [x, lo, hi, axis])
    x1 = g.op("Slice", [rot, lo, mid, axis])
    x2 = g.op("Slice", [rot, mid, hi, axis])
    rotated = g.op("Concat", [g.op("Neg", [x2]), x1], axis=-1)
    out = g.op("Add", [g.op("Mul", [rot, cos]), g.op("Mul", [rotated, sin])])
    if dim == head_dim:
        return out
    rest = g.op("Slice", [x, hi, g.ints(f"rope.{head_dim}", [head_dim]), axis])
    return g.op("Concat", [out, rest], axis=-1)


def _attention_bias(g: _Graph, rep: int, windows: list[int | None]) -> dict[int | None, str]:
    """Additive masks [B, 1, rep*S, T], one per sliding window (None: full attention): causal
    over past+seq, the padding attention_mask, and for a window W keys with k > q - W."""
    ids_shape = g.op("Shape", ["input_ids"])
    mask_shape = g.op("Shape", ["attention_mask"])
    zero, one = g.ints("scalar0", [0]), g.ints("scalar1", [1])
    seq = g.op("Squeeze", [g.op("Gather", [ids_shape, one], axis=0)])
    total = g.op("Squeeze", [g.op("Gather", [mask_shape, one], axis=0)])
    past = g.op("Sub", [total, seq])
    step = g.const("int_one", np.asarray(1, dtype=np.int64))
    q_pos = g.op("Unsqueeze", [g.op("Range", [past, total, step]), one])  # [S, 1]
    k_pos = g.op("Unsqueeze", [g.op("Range", [g.const("int_zero", np.asarray(0, np.int64)),
                                              total, step]), zero])  # [1, T]
    causal = g.op("LessOrEqual", [k_pos, q_pos])  # [S, T]
    keep = g.op("Unsqueeze", [g.op("Cast", ["attention_mask"], to=TensorProto.BOOL),
                              g.ints("axes_12", [1, 2])])  # [B, 1, 1, T]
    allowed = g.op("And", [causal, keep])  # [B, 1, S, T]
    biases = {}
    for window in windows:
        ok = allowed
        if window:
            start = g.op("Sub", [q_pos, g.const(f"int_window{window}",
                                                np.asarray(window, np.int64))])
            ok = g.op("And", [allowed, g.op("Greater", [k_pos, start])])
        bias = g.op("Where", [ok, g.const("mask_keep", np.asarray(0.0, np.float32)),
                              g.const("mask_drop", np.asarray(_NEG, np.float32))])
        # Rows are (rep, S) with rep outer after the GQA fold, so tile the S rows rep times.
        name = "attention_bias" if not window else f"attention_bias.window{window}"
        biases[window] = g.op("Tile", [bias, g.ints("tile_rep", [1, 1, rep, 1])], name=name)
    return biases


def _assemble(g: _Graph, cfg, logits: str, head_dim: int) -> onnx.ModelProto:
    n_layers, n_kv = cfg.num_hidden_layers, cfg.num_key_value_heads
    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    kv_shape = ["batch", n_kv, "past", head_dim]
    inputs = [
        helper.make_tensor_value_info("input_ids", i64, ["batch", "seq"]),
        helper.make_tensor_value_info("attention_mask", i64, ["batch", "total"]),
        helper.make_tensor_value_info("position_ids", i64, ["batch", "seq"]),
        helper.make_tensor_value_info("logits_to_keep", i64, [1]),
    ]
    outputs = [helper.make_tensor_value_info("logits", f32, ["batch", "keep", cfg.vocab_size])]
    renames = {logits: "logits"}
    for i in range(n_layers):
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", f32,
                                                        kv_shape))
            outputs.append(helper.make_tensor_value_info(f"present.{i}.{kind}", f32,
                                                         ["batch", n_kv, "total", head_dim]))
            renames[f"present.{i}.{kind}/out"] = f"present.{i}.{kind}"
    for node in g.nodes:  # give graph outputs their public names
        node.output[:] = [renames.get(o, o) for o in node.output]
        node.input[:] = [renames.get(i, i) for i in node.input]
    graph = helper.make_graph(g.nodes, "autoplan_decoder", inputs, outputs, g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid("com.microsoft", 1)],
                              producer_name="autoplan")
    model.ir_version = 8
    if g.fused:
        helper.set_model_props(model, {FUSED_KEY: json.dumps(g.fused, sort_keys=True)})
    return model


# check_supported is public for `autoplan search --runtime onnxruntime`, which refuses a
# model this export cannot build before profiling it (a plan `autoplan apply` could never use).
__all__ = ["FUSED_KEY", "OPSET", "SUPPORTED_TYPES", "TIED_OP", "build_decoder", "check_supported"]
