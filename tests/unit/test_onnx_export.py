"""ONNX export + ORT quantization on a tiny in-process Llama (hidden 64, 2 layers): seconds.

Numerics contract: the ORT logits equal those of the PyTorch model whose linear weights are
replaced by the ONNX initializers dequantized back (and, for int8 W8A8, whose linear inputs
are fake-quantized the way DynamicQuantizeLinear does it: per tensor, uint8, asymmetric).
Tolerance 1e-4 absolute on logits of magnitude ~1 (observed ~2e-7: float summation order).
The int4a8/uint4a8/int8a8 formats run MatMulNBits at accuracy_level 4, which rounds
activations to int8 per block: autoplan.quant.quantize_activation simulates that, to the
same 1e-4 (and the weight-only simulation is shown to miss it by far more). The uint4
formats carry packed uint4 zero points, dequantized by ORT as (code - zero point) * scale.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper
import pytest
import torch

from autoplan.backends.cpu.onnx_export import CpuArtifact, export_cpu_model
from autoplan.backends.cpu.onnx_graph import build_decoder
from autoplan.backends.cpu.ort_quant import (
    dequantized_weights, ort_node, pack_nbits, quantize_graph, quantize_layer,
    unpack_nbits,
)
from autoplan.backends.cpu.ort_runtime import OrtGenerator, TorchGenerator
from autoplan.errors import UnsupportedFormatError, UserInputError
from autoplan.formats import DENSE, Choice
from autoplan.modelspec import ModelSpec
from autoplan.quant import quantize_activation, quantize_weight

transformers = pytest.importorskip("transformers")
TOL_EXACT = 1e-4


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256, max_position_embeddings=128, rope_theta=10000.0)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def spec(tiny):
    return ModelSpec.from_config(tiny.config.to_dict())


def _feeds(ids: np.ndarray, past: list[np.ndarray], past_len: int) -> dict[str, np.ndarray]:
    batch, seq = ids.shape
    total = past_len + seq
    feeds = {"input_ids": ids, "attention_mask": np.ones((batch, total), np.int64),
             "position_ids": np.tile(np.arange(past_len, total), (batch, 1)),
             "logits_to_keep": np.array([seq], np.int64)}
    for i in range(len(past) // 2):
        feeds[f"past_key_values.{i}.key"] = past[2 * i]
        feeds[f"past_key_values.{i}.value"] = past[2 * i + 1]
    return feeds


def _session(proto: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])


def _empty(batch: int = 2) -> list[np.ndarray]:
    return [np.zeros((batch, 2, 0, 16), np.float32)] * 4


def _simulated(model, weights: dict[str, np.ndarray], acts=None):
    """The model with the ONNX weights; inputs of those layers rounded as `acts` says:
    "dql" = ONNX DynamicQuantizeLinear, a Precision = autoplan.quant's simulation of it."""
    sim = copy.deepcopy(model)
    for name, module in sim.named_modules():
        if name in weights:
            module.weight.data = torch.from_numpy(weights[name].T.copy())
            if acts == "dql":
                module.register_forward_pre_hook(_dynamic_quantize_linear)
            elif acts is not None:
                module.register_forward_pre_hook(
                    lambda _m, args, p=acts: (quantize_activation(args[0], p),))
    return sim


def _dynamic_quantize_linear(_module, args):
    # ONNX DynamicQuantizeLinear: range includes 0, scale = range / 255, round half to even.
    x = args[0]
    lo, hi = min(0.0, float(x.min())), max(0.0, float(x.max()))
    scale = (hi - lo) / 255
    zero = float(np.clip(np.rint(-lo / scale), 0, 255))
    return ((torch.clamp(torch.round(x / scale) + zero, 0, 255) - zero) * scale,)


@pytest.mark.parametrize("fused", [True, False])
def test_fp32_graph_matches_transformers_prefill_and_decode(tiny, fused):
    ids = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = tiny(ids).logits.numpy()
    sess = _session(build_decoder(tiny, fused_attention=fused))
    full = sess.run(None, _feeds(ids.numpy(), _empty(), 0))
    np.testing.assert_allclose(full[0], ref, atol=TOL_EXACT)
    past, got = _empty(), []
    first = sess.run(None, _feeds(ids.numpy()[:, :5], past, 0))
    past = first[1:]
    for t in (5, 6):  # decode one token at a time, as the runtime does
        step = sess.run(None, _feeds(ids.numpy()[:, t: t + 1], past, t))
        got.append(step[0])
        past = step[1:]
    np.testing.assert_allclose(np.concatenate(got, axis=1), ref[:, 5:], atol=TOL_EXACT)
    assert past[0].shape == (2, 2, 7, 16)
    # A multi-token continuation of a cached prefix (batch 1: GroupQueryAttention's limit).
    one = sess.run(None, _feeds(ids.numpy()[:1, :5], _empty(1), 0))
    rest = sess.run(None, _feeds(ids.numpy()[:1, 5:], one[1:], 5))
    np.testing.assert_allclose(rest[0], ref[:1, 5:], atol=TOL_EXACT)


def test_left_padding_masks_pad_tokens(tiny):
    ids = np.array([[0, 0, 5, 6, 7]], np.int64)
    feeds = _feeds(ids, _empty(1), 0)
    feeds["attention_mask"] = np.array([[0, 0, 1, 1, 1]], np.int64)
    feeds["position_ids"] = np.array([[0, 0, 0, 1, 2]], np.int64)
    padded = _session(build_decoder(tiny, fused_attention=False)).run(None, feeds)[0][:, -1]
    with torch.no_grad():
        ref = tiny(torch.tensor([[5, 6, 7]])).logits[:, -1].numpy()
    np.testing.assert_allclose(padded, ref, atol=TOL_EXACT)


@pytest.mark.parametrize("precision", ["int8", "int8_wo", "int4_g32", "int4_g64", "int4_g128",
                                       "int4a8_g32", "int4a8_g64", "int4a8_g128", "int8a8_g128",
                                       "uint4_g32", "uint4_g128", "uint4a8_g32", "uint4a8_g64",
                                       "uint4a8_g128"])
def test_quantized_graph_matches_torch_simulation(tiny, spec, precision):
    proto = build_decoder(tiny, fuse_qkv=lambda i: i == 0)  # block 0 packed, block 1 not
    prec = Choice.parse(precision).precision
    decisions = {layer.name: Choice(DENSE, prec) for layer in spec.layers}
    records = quantize_graph(proto, decisions)
    onnx.checker.check_model(proto)
    by_layer = {r.layer: r for r in records}
    assert set(by_layer) == {layer.name for layer in spec.layers}
    expected_op = "MatMulInteger" if precision == "int8" else "MatMulNBits"
    assert all(r.op_type == expected_op for r in records)
    levels = {helper.get_attribute_value(a) for n in proto.graph.node if n.op_type == "MatMulNBits"
              for a in n.attribute if a.name == "accuracy_level"}
    assert levels == ({4} if prec.info.act_group else {0} if expected_op == "MatMulNBits" else set())

    ids = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(2))
    weights = dequantized_weights(proto, records)
    if not prec.info.act_group:
        got = _session(proto).run(None, _feeds(ids.numpy(), _empty(), 0))[0]
        acts = "dql" if precision == "int8" else None
        with torch.no_grad():
            want = _simulated(tiny, weights, acts)(ids).logits.numpy()
        np.testing.assert_allclose(got, want, atol=TOL_EXACT)
        return
    # Int8 activation rounding is discontinuous: a 1e-7 difference in a layer's input (float
    # summation order upstream) can flip one code and move the logits by ~1e-3, so these
    # formats are checked node by node, on each node's own ORT input.
    worst_sim, worst_weight_only = 0.0, 0.0
    for node, x, y in _node_io(proto, _feeds(ids.numpy(), _empty(), 0)):
        w = np.concatenate([weights[r.layer] for r in records if r.node == node], axis=1)
        sim = quantize_activation(torch.from_numpy(x), prec).numpy() @ w
        worst_sim = max(worst_sim, float(np.abs(y - sim).max()))
        worst_weight_only = max(worst_weight_only, float(np.abs(y - x @ w).max()))
    assert worst_sim < 1e-5
    assert worst_weight_only > 10 * worst_sim  # the int8 rounding is visible: the test can fail


def _node_io(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]):
    """(node name, input, output) of every MatMulNBits node of `proto`, run by ORT."""
    probe = copy.deepcopy(proto)
    nodes = [n for n in probe.graph.node if n.op_type == "MatMulNBits"]
    for n in nodes:
        for name in (n.input[0], n.output[0]):
            probe.graph.output.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT,
                                                                    None))
    outs = _session(probe).run(None, feeds)[-2 * len(nodes):]
    return [(n.name, outs[2 * i], outs[2 * i + 1]) for i, n in enumerate(nodes)]


@pytest.mark.parametrize("precision", ["int4_g32", "int8_wo", "uint4_g32", "uint4a8_g64"])
def test_packing_holds_exactly_the_autoplan_quant_weights(precision):
    w = torch.randn(5, 72, generator=torch.Generator().manual_seed(3))  # K=72: 2.25 blocks of 32
    w[0] = w[0].abs()  # a row with min > 0: its zero points are 0 (the min is clamped to 0)
    w[1, :32] = 0.0  # an all-zero block
    prec = Choice.parse(precision).precision
    node = ort_node(prec)
    packed, flat, zp = pack_nbits(quantize_layer(w, prec), node.bits, node.block)
    assert (zp is not None) == node.zero_points
    if zp is not None:  # uint4, two per byte: [N, ceil(n_blocks / 2)]
        assert zp.dtype == np.uint8 and zp.shape == (5, -(-3 // 2) if node.block == 32 else 1)
    back = unpack_nbits(packed, flat, node.bits, 72, zp)
    np.testing.assert_array_equal(back, quantize_weight(w, prec).dequant.numpy().T)


@pytest.mark.parametrize("precision", ["uint4_g32", "uint4a8_g32", "uint4a8_g128"])
def test_one_zero_point_layer_in_ort_equals_autoplan_dequant(precision):
    """A lone MatMulNBits with uint4 zero points, run by ORT, against autoplan's own weights:
    x @ dequant.T (level 0) or quantize_activation(x) @ dequant.T (level 4)."""
    k, n = 160, 48  # K not a multiple of 128: a ragged last block for g128
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(n, k, generator=gen) * 0.05 + 0.02  # skewed: zero points far from 8
    x = torch.randn(3, k, generator=gen)
    prec = Choice.parse(precision).precision
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="lin")], "one",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, k])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, n])],
        [onnx.numpy_helper.from_array(w.numpy().T.copy(), "w")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 9
    (rec,) = quantize_graph(proto, {"lin": Choice(DENSE, prec)})
    assert set(rec.tensors) == {"weight", "scale", "zero_point"}
    got = _session(proto).run(None, {"x": x.numpy()})[0]
    q = quantize_weight(w, prec)
    assert int(q.scales["weight_zero_point"].min()) != int(q.scales["weight_zero_point"].max())
    xin = quantize_activation(x, prec) if prec.info.act_group else x
    np.testing.assert_allclose(got, (xin @ q.dequant.T).numpy(), atol=1e-5)


def test_plan_supplied_codes_are_packed_verbatim(tiny):
    name = "model.layers.0.mlp.down_proj"
    other = torch.randn_like(tiny.get_submodule(name).weight)  # stands in for GPTQ's rounding
    given = quantize_weight(other, Choice.parse("int4_g32").precision)
    proto = build_decoder(tiny)
    records = quantize_graph(proto, {name: Choice.parse("int4_g32")}, quantized={name: given})
    got = dequantized_weights(proto, records)[name]
    np.testing.assert_array_equal(got, given.dequant.numpy().T)


def test_mixed_plan_converts_exactly_the_planned_layers(tiny, spec):
    decisions = {"model.layers.0.self_attn.q_proj": Choice.parse("int4_g32"),
                 "model.layers.1.mlp.down_proj": Choice.parse("int8"),
                 "lm_head": Choice.parse("int8_wo")}
    records = {r.layer: r for r in quantize_graph(build_decoder(tiny), decisions)}
    assert records["model.layers.0.self_attn.q_proj"].op_type == "MatMulNBits"
    assert records["model.layers.0.self_attn.q_proj"].columns is None
    assert records["model.layers.1.mlp.down_proj"].op_type == "MatMulInteger"
    assert records["model.layers.0.self_attn.k_proj"].op_type == "MatMul"


def test_packed_qkv_maps_each_layer_to_its_columns(tiny, spec, tmp_path):
    decisions = {layer.name: Choice.parse("int4_g32") for layer in spec.layers}
    art = export_cpu_model(tiny, None, decisions, tmp_path / "packed")
    q = art.manifest["layers"]["model.layers.1.self_attn.q_proj"]
    v = art.manifest["layers"]["model.layers.1.self_attn.v_proj"]
    assert q["node"] == v["node"] == "model.layers.1.self_attn.qkv_proj"
    assert q["columns"] == [0, 64] and v["columns"] == [96, 128]
    # Mixed formats inside a block: the exporter keeps three separate nodes ...
    mixed = {**decisions, "model.layers.1.self_attn.k_proj": Choice.parse("int8")}
    art = export_cpu_model(tiny, None, mixed, tmp_path / "mixed")
    assert art.manifest["layers"]["model.layers.1.self_attn.k_proj"]["op_type"] == "MatMulInteger"
    # ... and a packed graph given mixed formats refuses rather than guessing.
    with pytest.raises(Exception, match="different formats"):
        quantize_graph(build_decoder(tiny, fuse_qkv=lambda i: True), mixed)


def test_unknown_layer_and_gpu_formats_fail_loudly(tiny):
    with pytest.raises(Exception, match="no MatMul node"):
        quantize_graph(build_decoder(tiny), {"model.layers.9.mlp.up_proj": Choice.parse("int8")})
    with pytest.raises(UnsupportedFormatError, match="onnx cannot store fp8_e4m3"):
        quantize_graph(build_decoder(tiny), {"lm_head": Choice.parse("fp8")})


def test_cpu_capability_is_the_runtime_matrix():
    """check_runtime answers what autoplan.runtimes.supports answers, and nothing else:
    dense int8 and int8_wo (ORT holds them, runtimes.toml refuses them) are refused with
    the matrix's reason; so is 2:4; the a8 and uint4 formats pass."""
    from autoplan.export._prepare import check_runtime
    from autoplan.runtimes import supports
    from autoplan.targets import get_target

    cpu = get_target("xeon-8480")
    for text in ("int8", "int8_wo", "2:4+int8", "block32@50+fp32"):
        choice = Choice.parse(text)
        reason = supports(cpu, "onnxruntime", choice).reason
        with pytest.raises(UnsupportedFormatError) as err:
            check_runtime("onnx", cpu, "onnxruntime", {"lm_head": choice})
        assert reason in str(err.value) and "\n" not in str(err.value)
    check_runtime("onnx", cpu, "onnxruntime", {n: Choice.parse(n) for n in (
        "fp32", "int8a8_g128", "int4a8_g32", "uint4a8_g64", "uint4_g128")})


def test_export_writes_artifact_atomically_and_runs(tiny, spec, tmp_path):
    decisions = {layer.name: Choice.parse("int4_g32") for layer in spec.layers}
    art = export_cpu_model(tiny, None, decisions, tmp_path / "out", extra_files={"plan.json": "{}"})
    loaded = CpuArtifact.load(tmp_path / "out")
    assert loaded.manifest == json.loads((tmp_path / "out" / "manifest.json").read_text())
    layer = art.manifest["layers"]["lm_head"]
    assert layer["op_type"] == "MatMulNBits" and len(layer["tensors"]["weight"]["sha256"]) == 64
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temp folder left behind
    ids = np.array([[3, 4, 5]], np.int64)
    ort_tokens = OrtGenerator(tmp_path / "out").generate(ids, 4).tokens
    assert ort_tokens.shape == (1, 4)
    # Rewriting over an artifact is allowed; over a foreign folder it is refused.
    export_cpu_model(tiny, None, {}, tmp_path / "out")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "x.txt").write_text("mine")
    with pytest.raises(UserInputError, match="not an autoplan artifact"):
        export_cpu_model(tiny, None, {}, tmp_path / "foreign")


def test_fp32_ort_and_torch_generators_agree(tiny, tmp_path):
    export_cpu_model(tiny, None, {}, tmp_path / "fp32")
    ids = np.array([[1, 2, 3, 4], [9, 8, 7, 6]], np.int64)
    ort_res = OrtGenerator(tmp_path / "fp32").generate(ids, 6)
    torch_res = TorchGenerator(tiny).generate(ids, 6)
    np.testing.assert_array_equal(ort_res.tokens, torch_res.tokens)
    assert len(ort_res.step_s) == 5 and ort_res.ttft_s > 0 and ort_res.decode_tok_s > 0


def test_sparse_plan_needs_masked_weights(tiny, tmp_path):
    name = "model.layers.0.mlp.up_proj"
    decisions = {name: Choice.parse("unstructured@50+int8")}
    with pytest.raises(UserInputError, match="apply the pruning masks"):
        export_cpu_model(tiny, None, decisions, tmp_path / "a")
    mask = (torch.rand_like(tiny.get_submodule(name).weight) > 0.5).float()
    art = export_cpu_model(tiny, None, decisions, tmp_path / "b", masks={name: mask})
    assert art.manifest["layers"][name]["choice"] == "unstructured@50+int8"


def test_packed_gate_up_matches_transformers_and_maps_columns(tiny, spec, tmp_path):
    ids = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = tiny(ids).logits.numpy()
    proto = build_decoder(tiny, fuse_gate_up=lambda i: True)
    assert sum(n.op_type == "Split" for n in proto.graph.node) == 2
    full = _session(proto).run(None, _feeds(ids.numpy(), _empty(), 0))
    np.testing.assert_allclose(full[0], ref, atol=TOL_EXACT)
    decisions = {layer.name: Choice.parse("int8") for layer in spec.layers}
    art = export_cpu_model(tiny, None, decisions, tmp_path / "packed")
    up = art.manifest["layers"]["model.layers.0.mlp.up_proj"]
    assert up["node"] == "model.layers.0.mlp.gate_up_proj" and up["columns"] == [128, 256]


def test_shared_kv_buffer_loop_equals_copying_loop(tiny, spec, tmp_path):
    """IOBinding with GroupQueryAttention's shared past/present buffer decodes the same
    tokens as feeding each step's present back as the next past."""
    decisions = {layer.name: Choice.parse("int4_g32") for layer in spec.layers}
    export_cpu_model(tiny, None, decisions, tmp_path / "m")
    gen = OrtGenerator(tmp_path / "m")
    assert gen.shared_kv
    ids = np.array([[1, 2, 3, 4, 5], [9, 8, 7, 6, 5]], np.int64)
    bound = gen.generate(ids, 7)
    gen.shared_kv = False
    np.testing.assert_array_equal(bound.tokens, gen.generate(ids, 7).tokens)
