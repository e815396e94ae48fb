"""Build a Llama-family transformers model as one ONNX decoder graph with a KV cache.

We write the graph with onnx.helper instead of tracing it with torch.onnx: a Llama block is
about forty primitive ops, the exporters of torch 2.x and transformers 5.x disagree on how
the cache object is traced, and writing it ourselves lets every linear layer be exactly one
`MatMul` node named after its module (`model.layers.3.mlp.up_proj`), so the layer -> node
mapping the quantizer and the audit rely on is exact by construction.

Graph signature (one graph serves prefill and decode; past length may be 0):
    inputs   input_ids [batch, seq] int64, attention_mask [batch, past+seq] int64 (1 = keep,
             left padding allowed), position_ids [batch, seq] int64, logits_to_keep [1] int64,
             past_key_values.{i}.key / .value [batch, kv_heads, past, head_dim] float32
    outputs  logits [batch, logits_to_keep, vocab] float32,
             present.{i}.key / .value [batch, kv_heads, past+seq, head_dim] float32
Supported: model_type llama, mistral (no sliding window), qwen2 (q/k/v biases); rotary
embeddings come from the model's own `rotary_emb` (so rope scaling variants carry over).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from autoplan.errors import ModelConfigError

OPSET = 17
FUSED_KEY = "autoplan.fused_layers"
SUPPORTED_TYPES = ("llama", "mistral", "qwen2")
_NEG = float(np.finfo(np.float32).min)


class _Graph:
    """Tiny node/initializer accumulator with unique names."""

    def __init__(self, masks: Mapping[str, torch.Tensor],
                 weights: Mapping[str, torch.Tensor]) -> None:
        self.masks, self.weights = masks, weights
        self.fused: dict[str, list] = {}  # node -> [[layer, [start, stop]]] of packed linears
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def op(self, op_type: str, inputs: list[str], name: str | None = None, n_out: int = 1,
           **attrs) -> str:
        self._n += 1
        name = name or f"{op_type}_{self._n}"
        outs = [f"{name}/out{i}" if n_out > 1 else f"{name}/out" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name, **attrs))
        return outs[0]

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def ints(self, name: str, values: list[int]) -> str:
        return self.const(name, np.asarray(values, dtype=np.int64))


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float32).cpu().numpy()


def _check_supported(cfg) -> None:
    model_type = getattr(cfg, "model_type", "")
    if model_type not in SUPPORTED_TYPES:
        raise ModelConfigError(f"ONNX export supports model_type {', '.join(SUPPORTED_TYPES)}; "
                               f"got '{model_type}'")
    window = getattr(cfg, "sliding_window", None)
    if model_type == "mistral" and window:
        raise ModelConfigError("ONNX export does not implement sliding-window attention: set "
                               "config.sliding_window to null for contexts within the window")
    if getattr(cfg, "hidden_act", "silu") != "silu":
        raise ModelConfigError(f"ONNX export implements SiLU MLPs only, got '{cfg.hidden_act}'")


def build_decoder(model: torch.nn.Module, masks: Mapping[str, torch.Tensor] | None = None,
                  fused_attention: bool | None = None,
                  weights: Mapping[str, torch.Tensor] | None = None,
                  fuse_qkv: Callable[[int], bool] | None = None,
                  fuse_gate_up: Callable[[int], bool] | None = None) -> onnx.ModelProto:
    """Build the fp32 ONNX decoder of a loaded transformers causal LM.

    Args:
        model: a LlamaForCausalLM-like module.
        masks: optional layer name -> {0,1} mask ([out, in]) multiplied into that weight, so
            pruning is baked in without touching the caller's model.
        weights: optional layer name -> replacement weight [out, in] (e.g. a SparseGPT-
            updated or already dequantized weight), used instead of the module's.
        fused_attention: True: ORT's GroupQueryAttention (RoPE, KV append, GQA and softmax in
            one kernel; no left padding: attention_mask must be all ones). False: primitive
            ops (any attention_mask). None: fused when the rotary embedding allows it.
        fuse_qkv: block index -> whether q/k/v of that block run as one MatMul
            (`model.layers.i.self_attn.qkv_proj`, GroupQueryAttention's packed input: one
            weight read and one kernel instead of three). Only with fused attention, and only
            for blocks whose three layers share a format (the caller knows the plan). The
            graph's metadata `autoplan.fused_layers` records node -> [[layer, columns]].
        fuse_gate_up: block index -> whether gate/up of that block run as one MatMul
            (`model.layers.i.mlp.gate_up_proj`, split after): at decode each GEMV call has a
            fixed cost (thread-pool dispatch, activation quantization for int8), so one call
            instead of two saves it per block. Same rule: only when both share a format.

    Returns:
        The ModelProto; linear layers are `MatMul` nodes named by their module path, with the
        weight stored transposed ([in, out]) under `<module>.weight_t`.
    """
    cfg = model.config
    _check_supported(cfg)
    inner = model.model
    n_heads, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads
    eps = float(cfg.rms_norm_eps)
    g = _Graph(masks or {}, weights or {})

    g.const("model.embed_tokens.weight", _np(inner.embed_tokens.weight))
    x = g.op("Gather", ["model.embed_tokens.weight", "input_ids"], name="embed")
    g.const("rms_eps", np.asarray(eps, dtype=np.float32))
    g.const("two", np.asarray(2.0, dtype=np.float32))
    fused = _fusable(inner.rotary_emb) if fused_attention is None else fused_attention
    attention = _Fused(g, inner.rotary_emb, cfg, n_heads, n_kv) if fused else \
        _Primitive(g, inner.rotary_emb, n_heads, n_kv, head_dim)

    for i, layer in enumerate(inner.layers):
        p = f"model.layers.{i}"
        h = _rms(g, x, layer.input_layernorm.weight, f"{p}.input_layernorm")
        att = layer.self_attn
        names = [f"{p}.self_attn.{n}_proj" for n in "qkv"]
        modules = [att.q_proj, att.k_proj, att.v_proj]
        if fused and fuse_qkv is not None and fuse_qkv(i):
            ctx = attention(i, _linear_group(g, h, modules, names, f"{p}.self_attn.qkv_proj"),
                            "", "")
        else:
            ctx = attention(i, *[_linear(g, h, m, n) for m, n in zip(modules, names)])
        x = g.op("Add", [x, _linear(g, ctx, att.o_proj, f"{p}.self_attn.o_proj")])
        h = _rms(g, x, layer.post_attention_layernorm.weight, f"{p}.post_attention_layernorm")
        mlp = layer.mlp
        if fuse_gate_up is not None and fuse_gate_up(i):
            gate, up = _gate_up(g, h, mlp, p)
        else:
            gate = _linear(g, h, mlp.gate_proj, f"{p}.mlp.gate_proj")
            up = _linear(g, h, mlp.up_proj, f"{p}.mlp.up_proj")
        act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), up])
        x = g.op("Add", [x, _linear(g, act, mlp.down_proj, f"{p}.mlp.down_proj")])

    x = _rms(g, x, inner.norm.weight, "model.norm")
    # Prefill needs only the last position's logits; the lm_head is the largest GEMM.
    neg_keep = g.op("Neg", ["logits_to_keep"])
    x = g.op("Slice", [x, neg_keep, g.ints("int_max", [2**62]), g.ints("axis1", [1])])
    logits = _linear(g, x, model.lm_head, "lm_head")
    return _assemble(g, cfg, logits, head_dim)


class _Primitive:
    """Attention from primitive ONNX ops: any attention_mask (left padding) is honoured."""

    def __init__(self, g: _Graph, rotary: torch.nn.Module, n_heads: int, n_kv: int,
                 head_dim: int) -> None:
        self.g = g
        self.cos, self.sin = _rotary(g, rotary)
        self.bias = _attention_bias(g, n_heads // n_kv)
        g.ints("shape_heads_q", [0, 0, n_heads, head_dim])
        g.ints("shape_heads_kv", [0, 0, n_kv, head_dim])
        g.ints("shape_groups", [0, n_kv, -1, head_dim])
        g.ints("shape_heads", [0, n_heads, -1, head_dim])
        g.ints("shape_merge", [0, 0, n_heads * head_dim])
        g.const("attn_scale", np.asarray(head_dim**-0.5, dtype=np.float32))
        for name, value in (("rope.lo", 0), ("rope.mid", head_dim // 2), ("rope.hi", head_dim),
                            ("rope.axis", -1)):
            g.ints(name, [value])

    def __call__(self, i: int, q: str, k: str, v: str) -> str:
        g = self.g
        q = g.op("Transpose", [g.op("Reshape", [q, "shape_heads_q"])], perm=[0, 2, 1, 3])
        k = g.op("Transpose", [g.op("Reshape", [k, "shape_heads_kv"])], perm=[0, 2, 1, 3])
        v = g.op("Transpose", [g.op("Reshape", [v, "shape_heads_kv"])], perm=[0, 2, 1, 3])
        q, k = _rope(g, q, self.cos, self.sin), _rope(g, k, self.cos, self.sin)
        k_all = g.op("Concat", [f"past_key_values.{i}.key", k], name=f"present.{i}.key", axis=2)
        v_all = g.op("Concat", [f"past_key_values.{i}.value", v], name=f"present.{i}.value",
                     axis=2)
        # GQA without copying K/V: fold the `rep` query heads that share a KV head into the
        # sequence axis, [B, H, S, D] -> [B, KV, rep*S, D] (head h uses KV head h // rep).
        qg = g.op("Mul", [g.op("Reshape", [q, "shape_groups"]), "attn_scale"])
        scores = g.op("MatMul", [qg, g.op("Transpose", [k_all], perm=[0, 1, 3, 2])])
        probs = g.op("Softmax", [g.op("Add", [scores, self.bias])], axis=-1)
        ctx = g.op("Reshape", [g.op("MatMul", [probs, v_all]), "shape_heads"])
        return g.op("Reshape", [g.op("Transpose", [ctx], perm=[0, 2, 1, 3]), "shape_merge"])


class _Fused:
    """com.microsoft GroupQueryAttention: one node per layer instead of about thirty, which
    matters at decode where a small model's step is dominated by per-node overhead."""

    def __init__(self, g: _Graph, rotary: torch.nn.Module, cfg, n_heads: int, n_kv: int) -> None:
        self.g, self.n_heads, self.n_kv = g, n_heads, n_kv
        positions = np.arange(cfg.max_position_embeddings, dtype=np.float32)[:, None]
        freqs = positions * _np(rotary.inv_freq)[None, :]  # float32, as transformers computes
        g.const("rope.cos_cache", np.cos(freqs).astype(np.float32))
        g.const("rope.sin_cache", np.sin(freqs).astype(np.float32))
        # seqlens_k = tokens per row - 1 and the total length, as int32 (the op's contract).
        ones = g.op("ReduceSum", ["attention_mask", g.ints("axis_seq", [1])], keepdims=0)
        g.op("Cast", [g.op("Sub", [ones, g.const("int_one", np.asarray(1, np.int64))])],
             name="seqlens_k", to=TensorProto.INT32)
        total = g.op("Gather", [g.op("Shape", ["attention_mask"]),
                                g.const("int_idx1", np.asarray(1, np.int64))], axis=0)
        g.op("Cast", [total], name="total_len", to=TensorProto.INT32)

    def __call__(self, i: int, q: str, k: str, v: str) -> str:
        g = self.g
        name = f"model.layers.{i}.self_attn.gqa"
        out = f"{name}/out"
        g.nodes.append(helper.make_node(
            "GroupQueryAttention",
            [q, k, v, f"past_key_values.{i}.key", f"past_key_values.{i}.value", "seqlens_k/out",
             "total_len/out", "rope.cos_cache", "rope.sin_cache"],
            [out, f"present.{i}.key/out", f"present.{i}.value/out"], name=name,
            domain="com.microsoft", num_heads=self.n_heads, kv_num_heads=self.n_kv, do_rotary=1,
            rotary_interleaved=0))
        return out


def _fusable(rotary: torch.nn.Module) -> bool:
    # GroupQueryAttention's rotary takes cos/sin tables without a magnitude factor.
    return float(getattr(rotary, "attention_scaling", 1.0)) == 1.0


def _weight(g: _Graph, module: torch.nn.Linear, name: str) -> np.ndarray:
    weight = g.weights.get(name, module.weight)
    if name in g.masks:
        weight = weight * g.masks[name].to(weight.dtype)
    return _np(weight)


def _gate_up(g: _Graph, x: str, mlp: torch.nn.Module, prefix: str) -> tuple[str, str]:
    """gate and up as one packed MatMul, split back along the last axis."""
    names = [f"{prefix}.mlp.gate_proj", f"{prefix}.mlp.up_proj"]
    both = _linear_group(g, x, [mlp.gate_proj, mlp.up_proj], names, f"{prefix}.mlp.gate_up_proj")
    sizes = g.ints(f"{prefix}.mlp.split_sizes",
                   [mlp.gate_proj.out_features, mlp.up_proj.out_features])
    name = f"{prefix}.mlp.split"
    g.op("Split", [both, sizes], name=name, n_out=2, axis=-1)
    return f"{name}/out0", f"{name}/out1"


def _linear(g: _Graph, x: str, module: torch.nn.Linear, name: str) -> str:
    return _linear_group(g, x, [module], [name], name)


def _linear_group(g: _Graph, x: str, modules: list[torch.nn.Linear], names: list[str],
                  node: str) -> str:
    """One MatMul computing several linears side by side (their outputs concatenated)."""
    weights = [_weight(g, m, n) for m, n in zip(modules, names)]
    w = g.const(f"{node}.weight_t", np.concatenate(weights, axis=0).T)
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


def _rms(g: _Graph, x: str, weight: torch.Tensor, name: str) -> str:
    # Pow -> ReduceMean -> Add -> Sqrt -> Div -> Mul is the pattern ORT fuses into
    # SimplifiedLayerNormalization.
    var = g.op("ReduceMean", [g.op("Pow", [x, "two"])], axes=[-1], keepdims=1)
    normed = g.op("Div", [x, g.op("Sqrt", [g.op("Add", [var, "rms_eps"])])])
    return g.op("Mul", [normed, g.const(f"{name}.weight", _np(weight))], name=name)


def _rotary(g: _Graph, rotary: torch.nn.Module) -> tuple[str, str]:
    """cos/sin [B, 1, S, D] from position_ids, using the model's inv_freq and scaling."""
    inv_freq = _np(rotary.inv_freq)
    scale = float(getattr(rotary, "attention_scaling", 1.0))
    pos = g.op("Unsqueeze", [g.op("Cast", ["position_ids"], to=TensorProto.FLOAT),
                             g.ints("axis_last", [-1])])
    freqs = g.op("Mul", [pos, g.const("rope.inv_freq", inv_freq)])
    emb = g.op("Concat", [freqs, freqs], axis=-1)
    g.const("rope.scale", np.asarray(scale, dtype=np.float32))
    cos = g.op("Mul", [g.op("Cos", [emb]), "rope.scale"])
    sin = g.op("Mul", [g.op("Sin", [emb]), "rope.scale"])
    heads_axis = g.ints("axis_heads", [1])
    return g.op("Unsqueeze", [cos, heads_axis], name="rope.cos"), g.op(
        "Unsqueeze", [sin, heads_axis], name="rope.sin")


def _rope(g: _Graph, x: str, cos: str, sin: str) -> str:
    """x*cos + rotate_half(x)*sin, rotate_half(x) = concat(-x[..., D/2:], x[..., :D/2])."""
    x1 = g.op("Slice", [x, "rope.lo", "rope.mid", "rope.axis"])
    x2 = g.op("Slice", [x, "rope.mid", "rope.hi", "rope.axis"])
    rotated = g.op("Concat", [g.op("Neg", [x2]), x1], axis=-1)
    return g.op("Add", [g.op("Mul", [x, cos]), g.op("Mul", [rotated, sin])])


def _attention_bias(g: _Graph, rep: int) -> str:
    """Additive mask [B, 1, rep*S, T]: causal over past+seq and the padding attention_mask."""
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
    bias = g.op("Where", [allowed, g.const("mask_keep", np.asarray(0.0, np.float32)),
                          g.const("mask_drop", np.asarray(_NEG, np.float32))])
    # Rows are (rep, S) with rep outer after the GQA fold, so tile the S rows rep times.
    return g.op("Tile", [bias, g.ints("tile_rep", [1, 1, rep, 1])], name="attention_bias")


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


__all__ = ["FUSED_KEY", "OPSET", "SUPPORTED_TYPES", "build_decoder"]

# Public for `autoplan search --runtime onnxruntime`, which refuses a model this export cannot
# build before profiling it (a plan `autoplan apply` could never use).
check_supported = _check_supported
