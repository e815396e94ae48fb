"""The ONNX decoder of Qwen3, Gemma 2, Gemma 3 and Phi-3 (and Mistral's sliding window, Gemma
1), on tiny random models (tests/unit/_tiny_archs.py): the same numerics contract as
test_onnx_export.py's Llama, to the same 1e-4 on logits (observed ~3e-6: summation order).

- fp32: ORT's logits equal transformers' forward, prefill and token-by-token decode through
  the KV cache, with GroupQueryAttention (its scale, softcap and local_window_size) and with
  primitive ops; sequences of 11 tokens cross the 4-token windows.
- each architectural fact is load-bearing: the graph built without it (no soft-cap, no
  window, no q/k norm, ...) misses transformers by far more than the tolerance;
- compressed: the graph with every layer in a 4-bit format equals transformers' fp32
  forward of the same model with the ONNX weights dequantized back (Phi-3's fused qkv_proj
  and gate_up_proj are one MatMulNBits node each, whose weight is the whole tensor);
- greedy generation through an exported artifact (shared KV buffer) equals transformers'.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from autoplan.backends.cpu import onnx_graph
from autoplan.backends.cpu.onnx_arch import read_arch
from autoplan.backends.cpu.onnx_export import export_cpu_model
from autoplan.backends.cpu.onnx_graph import build_decoder
from autoplan.backends.cpu.ort_quant import dequantized_weights, quantize_graph
from autoplan.backends.cpu.ort_runtime import OrtGenerator, TorchGenerator

from autoplan.errors import ModelConfigError
from autoplan.formats import DENSE, Choice
from autoplan.modelspec import ModelSpec
from tests.unit._tiny import one_torch_thread  # noqa: F401
from tests.unit._tiny_archs import ARCHS, VOCAB, WINDOW, tiny_arch_model

transformers = pytest.importorskip("transformers")
TOL_EXACT = 1e-4
SEQ = 11  # > 2 x WINDOW: windowed and full layers see different keys
EXTRA = ("mistral", "gemma")


def _extra_model(name: str):  # noqa: ANN202 - a transformers CausalLM
    common = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": VOCAB,
              "max_position_embeddings": 256, "initializer_range": 0.15}
    torch.manual_seed(0)
    cfg = transformers.MistralConfig(**common, sliding_window=WINDOW) if name == "mistral" \
        else transformers.GemmaConfig(**common, head_dim=16)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


@pytest.fixture(scope="module", params=ARCHS + EXTRA)
def model(request):
    return tiny_arch_model(request.param) if request.param in ARCHS else \
        _extra_model(request.param)


def _session(proto: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])


def _feeds(model, ids: np.ndarray, past: list[np.ndarray] | None, past_len: int):  # noqa: ANN001, ANN202
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    batch, seq = ids.shape
    feeds = {"input_ids": ids, "attention_mask": np.ones((batch, past_len + seq), np.int64),
             "position_ids": np.tile(np.arange(past_len, past_len + seq), (batch, 1)),
             "logits_to_keep": np.array([seq], np.int64)}
    empty = np.zeros((batch, cfg.num_key_value_heads, 0, head_dim), np.float32)
    for i in range(cfg.num_hidden_layers):
        feeds[f"past_key_values.{i}.key"] = empty if past is None else past[2 * i]
        feeds[f"past_key_values.{i}.value"] = empty if past is None else past[2 * i + 1]
    return feeds


def _ids(seed: int = 1) -> np.ndarray:
    return torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(seed)).numpy()


def _prefill_and_decode(model, proto: onnx.ModelProto, ids: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001
    """Logits of the whole prompt at once, and of tokens 6.. decoded one at a time."""
    sess = _session(proto)
    full = sess.run(None, _feeds(model, ids, None, 0))[0]
    past = sess.run(None, _feeds(model, ids[:, :6], None, 0))[1:]
    steps = []
    for t in range(6, ids.shape[1]):
        out = sess.run(None, _feeds(model, ids[:, t:t + 1], past, t))
        steps.append(out[0])
        past = out[1:]
    return full, np.concatenate(steps, axis=1)


def _reference(model, ids: np.ndarray) -> np.ndarray:  # noqa: ANN001
    with torch.no_grad():
        return model(torch.from_numpy(ids)).logits.numpy()


@pytest.mark.parametrize("fused", [True, False])
def test_fp32_graph_matches_transformers(model, fused):
    ids = _ids()
    ref = _reference(model, ids)
    full, decoded = _prefill_and_decode(model, build_decoder(model, fused_attention=fused), ids)
    np.testing.assert_allclose(full, ref, atol=TOL_EXACT)
    np.testing.assert_allclose(decoded, ref[:, 6:], atol=TOL_EXACT)


# (architecture, what is dropped from what the exporter read): the graph without it differs
_DROPPED = [
    ("qwen3", {"qk_norm": False}),
    ("gemma2", {"attn_softcap": None}),
    ("gemma2", {"final_softcap": None}),
    ("gemma2", {"norm_offset": 0.0}),
    ("gemma2", {"embed_scale": None}),
    ("gemma2", {"activation": "silu"}),
    ("gemma2", {"sandwich_norms": False}),
    ("gemma2", {"attn_scale": 0.25}),  # head_dim ** -0.5 instead of query_pre_attn_scalar's
    ("gemma2", {"blocks": "no window"}),
    ("gemma3_text", {"qk_norm": False}),
    ("gemma3_text", {"blocks": "no window"}),
    ("gemma3_text", {"blocks": "one rope"}),
    ("phi3", {"blocks": "no window"}),
]


@pytest.mark.parametrize(("arch", "dropped"), _DROPPED, ids=lambda v: str(v))
def test_each_fact_changes_the_logits(arch, dropped, monkeypatch):
    """The test above can fail: leave one fact out and the logits are far off."""
    model = tiny_arch_model(arch)
    arch_facts = read_arch(model)
    change = dict(dropped)
    if change.get("blocks") == "no window":
        change["blocks"] = tuple(dataclasses.replace(b, window=None) for b in arch_facts.blocks)
    elif change.get("blocks") == "one rope":
        change["blocks"] = tuple(dataclasses.replace(b, rope=arch_facts.blocks[0].rope)
                                 for b in arch_facts.blocks)
    assert any(getattr(arch_facts, k) != v for k, v in change.items())
    wrong = dataclasses.replace(arch_facts, **change)
    if not wrong.qk_norm and arch_facts.qk_norm:
        monkeypatch.setattr(onnx_graph, "_head_norm", lambda g, x, *_a: x)
    monkeypatch.setattr(onnx_graph, "read_arch", lambda _m: wrong)
    ids = _ids()
    full, _ = _prefill_and_decode(model, build_decoder(model, fused_attention=False), ids)
    assert np.abs(full - _reference(model, ids)).max() > 100 * TOL_EXACT


def _simulated(model, weights: dict[str, np.ndarray]):  # noqa: ANN001, ANN202
    """The model with the ONNX weights; a tied lm_head gets its own (the ONNX embedding
    keeps the original table, as a runtime quantizing only the output projection does)."""
    sim = copy.deepcopy(model)
    for name, module in sim.named_modules():
        if name in weights:
            module.weight = torch.nn.Parameter(torch.from_numpy(weights[name].T.copy()))
    return sim


@pytest.mark.parametrize("precision", ["int4_g32", "uint4_g32"])
def test_compressed_graph_matches_transformers_on_the_same_weights(model, precision):
    spec = ModelSpec.from_config(model.config.to_dict())
    proto = build_decoder(model, fuse_qkv=lambda i: i == 0, fuse_gate_up=lambda i: i == 1)
    decisions = {layer.name: Choice(DENSE, Choice.parse(precision).precision)
                 for layer in spec.layers}
    records = quantize_graph(proto, decisions)
    onnx.checker.check_model(proto)
    assert {r.layer for r in records} == set(decisions)
    assert {r.op_type for r in records} == {"MatMulNBits"}
    if model.config.model_type == "phi3":  # the fused weights are whole nodes, not packed
        assert all(r.columns is None and r.node == r.layer for r in records)
    weights = dequantized_weights(proto, records)
    ids = _ids(2)
    got = _session(proto).run(None, _feeds(model, ids, None, 0))[0]
    want = _reference(_simulated(model, weights), ids)
    np.testing.assert_allclose(got, want, atol=TOL_EXACT)
    assert np.abs(want - _reference(model, ids)).max() > 100 * TOL_EXACT  # 4 bits: visible


def test_exported_artifact_generates_what_transformers_generates(model, tmp_path):
    export_cpu_model(model, None, {}, tmp_path / "fp32")
    gen = OrtGenerator(tmp_path / "fp32")
    assert gen.shared_kv  # GroupQueryAttention with the KV buffer bound in place
    ids = np.array([[1, 2, 3, 4, 5, 6], [9, 8, 7, 6, 5, 4]], np.int64)
    ours = gen.generate(ids, 8).tokens
    np.testing.assert_array_equal(ours, TorchGenerator(model, threads=1).generate(ids, 8).tokens)


@pytest.mark.parametrize(("partial", "heads"), [(1.0, 4), (0.5, 2)])
def test_longrope_switches_tables_per_call_as_transformers_does(partial, heads):
    """Phi-3 128k / Phi-3.5 / Phi-4-mini: short factors while a call's positions stay within
    original_max_position_embeddings (8 here), long ones past it; a decode step at t uses
    long factors from t + 1 > 8 on, the cache keeping keys rotated by either, as in
    transformers (compared step by step with its own cache). Partial rotary included."""
    head_dim = 64 // heads
    rot = int(head_dim * partial)
    cfg = transformers.Phi3Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=heads,
        num_key_value_heads=max(heads // 2, 1), vocab_size=VOCAB, max_position_embeddings=64,
        original_max_position_embeddings=8, partial_rotary_factor=partial, pad_token_id=0,
        initializer_range=0.15, rope_scaling={
            "rope_type": "longrope", "short_factor": np.linspace(1, 1.5, rot // 2).tolist(),
            "long_factor": np.linspace(1, 6, rot // 2).tolist()})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    proto = build_decoder(model)
    assert not any(n.op_type == "GroupQueryAttention" for n in proto.graph.node)
    ids = _ids()
    with torch.no_grad():
        full_ref = model(torch.from_numpy(ids)).logits.numpy()
        first = model(torch.from_numpy(ids[:, :6]), use_cache=True)
        cache = getattr(first, "cache", None) or first.past_key_values
        steps_ref = [model(torch.from_numpy(ids[:, t:t + 1]), use_cache=True, cache=cache,
                           position_ids=torch.full((2, 1), t)).logits.numpy()
                     for t in range(6, SEQ)]
    full, decoded = _prefill_and_decode(model, proto, ids)
    np.testing.assert_allclose(full, full_ref, atol=TOL_EXACT)  # 11 positions: long factors
    np.testing.assert_allclose(decoded, np.concatenate(steps_ref, axis=1), atol=TOL_EXACT)
    assert np.abs(first.logits.numpy() - full_ref[:, :6]).max() > 100 * TOL_EXACT  # it switched


def test_what_cannot_be_exact_is_refused_in_one_line():
    cfg = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=2,
                                   rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    with pytest.raises(ModelConfigError, match="'dynamic' RoPE") as err:
        onnx_graph.check_supported(cfg)
    assert "\n" not in str(err.value)
    cfg = transformers.Gemma3TextConfig(hidden_size=64, num_hidden_layers=2, head_dim=16,
                                        use_bidirectional_attention=True)
    with pytest.raises(ModelConfigError, match="bidirectional"):
        onnx_graph.check_supported(cfg)
    gpt2 = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4)
    with pytest.raises(ModelConfigError, match="got 'gpt2'"):
        onnx_graph.check_supported(gpt2)


@pytest.mark.parametrize("arch", ["gemma2", "phi3"])
def test_left_padding_with_a_sliding_window(arch):
    """Primitive attention honours a left-padded attention_mask together with the window:
    the padded row's logits are those of the unpadded prompt."""
    model = tiny_arch_model(arch)
    prompt = [5, 6, 7, 8, 9, 10, 11]  # longer than the 4-token window
    ids = np.array([[0, 0, 0, *prompt]], np.int64)
    feeds = _feeds(model, ids, None, 0)
    feeds["attention_mask"] = np.array([[0, 0, 0] + [1] * len(prompt)], np.int64)
    feeds["position_ids"] = np.array([[0, 0, 0, *range(len(prompt))]], np.int64)
    got = _session(build_decoder(model, fused_attention=False)).run(None, feeds)[0][:, 3:]
    np.testing.assert_allclose(got, _reference(model, np.array([prompt])), atol=TOL_EXACT)
