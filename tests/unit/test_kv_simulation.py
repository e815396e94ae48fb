"""The KV cache simulated inside attention: where it hooks (K after RoPE, V, before GQA
repeat), that nothing changes without a hook on every architecture, the static scales'
calibration in memory and streamed, and the per-block sensitivity scores."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autoplan.compress import CompressionSettings, compressed_copy
from autoplan.errors import UserInputError
from autoplan.formats.kv import KvFormat, kv_spec
from autoplan.quality.evaluator import QualityEvaluator
from autoplan.quant.kv_cache import (KvQuant, attention_modules, calibrate_kv, kv_hooks,
                                     kv_quants)
from autoplan.sensitivity.kv import capture_kv, kv_key, kv_unit, score_kv
from autoplan.streaming.evaluate import StreamedEvaluator
from autoplan.streaming.skeleton import StreamedModel
from tests.unit._tiny import tiny_llama
from tests.unit._tiny_archs import ARCHS, tiny_arch_model
from tests.unit.tiny_llama import tiny_tokenizer

IDS = torch.randint(2, 250, (2, 24), generator=torch.Generator().manual_seed(0))


def _head32_llama(seed: int = 0):  # noqa: ANN202 - a LlamaForCausalLM
    """Two blocks, 2 heads of 32 (llama.cpp's block formats need head_dim % 32 == 0), 1 KV
    head (GQA)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, vocab_size=256,
                      max_position_embeddings=256, initializer_range=0.15, eos_token_id=1,
                      bos_token_id=1, pad_token_id=0)
    return LlamaForCausalLM(cfg).eval()


def _logits(model, **kw) -> torch.Tensor:  # noqa: ANN001
    with torch.no_grad():
        return model(input_ids=IDS, use_cache=False, **kw).logits


@pytest.mark.parametrize("arch", ("llama", *ARCHS))
def test_without_a_hook_every_architecture_computes_what_it_did(arch: str) -> None:
    model = tiny_llama() if arch == "llama" else tiny_arch_model(arch)
    impl = model.config._attn_implementation
    ref = _logits(model)
    with kv_hooks(model, {}):
        assert model.config._attn_implementation.startswith("autoplan_kv|")
        assert torch.equal(_logits(model), ref)
    assert model.config._attn_implementation == impl
    amax = calibrate_kv(model, [IDS])
    with kv_hooks(model, kv_quants({i: KvFormat.FP8_E4M3 for i in amax}, amax, None)):
        assert not torch.equal(_logits(model), ref)  # soft-caps, windows: still hooked
    assert torch.equal(_logits(model), ref)


def test_the_hook_sees_k_after_rope_and_unrepeated_kv_heads() -> None:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    model = _head32_llama()
    attn = attention_modules(model)[0]
    seen: dict = {}

    def pre(_m, args, kwargs):  # noqa: ANN001, ANN202
        seen["h"], seen["pos"] = kwargs.get("hidden_states", args[0] if args else None), \
            kwargs["position_embeddings"]

    def record(q, k, v):  # noqa: ANN001, ANN202
        seen.update(q=q, k=k, v=v)
        return q, k, v

    handle = attn.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        with kv_hooks(model, {0: record}):
            _logits(model)
    finally:
        handle.remove()
    h = seen["h"]
    shape = (*h.shape[:-1], -1, 32)
    q = attn.q_proj(h).view(shape).transpose(1, 2)
    k = attn.k_proj(h).view(shape).transpose(1, 2)
    v = attn.v_proj(h).view(shape).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, *seen["pos"])
    assert seen["k"].shape[1] == 1  # one KV head: before the GQA repeat
    assert torch.equal(seen["k"], k) and torch.equal(seen["v"], v) and torch.equal(seen["q"], q)


def test_attention_receives_the_quantized_cache() -> None:
    model = _head32_llama()
    amax = calibrate_kv(model, [IDS])
    quant = kv_quants({0: KvFormat.Q8_0}, amax, KvFormat.Q8_0)[0]
    got: dict = {}

    def both(q, k, v):  # noqa: ANN001, ANN202
        got["in"] = (q, k, v)
        got["out"] = quant(q, k, v)
        return got["out"]

    with kv_hooks(model, {0: both}):
        _logits(model)
    q, k, v = got["in"]
    q2, k2, v2 = got["out"]
    spec = kv_spec("q8_0")
    assert torch.equal(k2, spec.quantize(k)) and torch.equal(v2, spec.quantize(v))
    assert torch.equal(q2, spec.quantize(q))  # ggml-cpu's Q8_0 queries


def test_static_formats_need_calibrated_scales() -> None:
    with pytest.raises(UserInputError, match="calibrated scales"):
        kv_quants({0: KvFormat.FP8_E4M3}, None, None)
    per_head = calibrate_kv(tiny_llama(), [IDS])[0]
    k, v = per_head.scales(KvFormat.FP8_E4M3_HEAD)
    assert k.shape == (2,) and v.shape == (2,)  # the tiny model's two KV heads
    assert per_head.scales(KvFormat.FP8_E4M3)[0].shape == (1,)
    assert per_head.scales(KvFormat.Q8_0) == (None, None)


def test_compressed_copy_carries_the_cache_and_leaves_the_original() -> None:
    model = tiny_llama()
    ref = _logits(model)
    amax = calibrate_kv(model, [IDS])
    copy, _ = compressed_copy(model, {}, None, CompressionSettings(),
                              kv=kv_quants({0: KvFormat.INT8, 1: KvFormat.INT8}, amax, None))
    assert not torch.equal(_logits(copy), ref)
    assert torch.equal(_logits(model), ref)


def test_streamed_cache_equals_in_memory(tmp_path: Path) -> None:
    model = tiny_llama()
    folder = tmp_path / "m"
    model.save_pretrained(folder, safe_serialization=True)
    tiny_tokenizer().save_pretrained(folder)
    calib = [IDS[:1], IDS[1:]]
    evals = torch.randint(2, 250, (3, 32), generator=torch.Generator().manual_seed(1))
    amax = calibrate_kv(model, calib)
    sev = StreamedEvaluator(StreamedModel(folder, device=torch.device("cpu")), evals,
                            calib_batches=calib)
    s_amax = sev.kv_amax()
    for i in amax:
        assert torch.allclose(s_amax[i].k_head, amax[i].k_head, rtol=1e-5)
        assert torch.allclose(s_amax[i].v_head, amax[i].v_head, rtol=1e-5)
    quants = kv_quants({0: KvFormat.FP8_E4M3, 1: KvFormat.FP8_E4M3_HEAD}, amax, KvFormat.FP8_E4M3)
    want = QualityEvaluator(model, evals).evaluate(
        compressed_copy(model, {}, None, CompressionSettings(), kv=quants)[0])
    got, _ = sev.evaluate_decisions({}, CompressionSettings(), kv=quants)
    assert want.kl > 1e-5
    assert got.kl == pytest.approx(want.kl, rel=1e-3)


def test_kv_scores_estimate_the_measured_kl() -> None:
    model = tiny_llama()
    g = torch.Generator().manual_seed(1)
    calib = [torch.randint(2, 250, (4, 64), generator=g) for _ in range(4)]
    evals = torch.randint(2, 250, (8, 64), generator=g)
    cap = capture_kv(model, calib)
    formats = [KvFormat.FP8_E4M3, KvFormat.FP8_E5M2, KvFormat.INT8, KvFormat.NVFP4]
    scores = score_kv(cap, formats, {})
    assert set(scores) == {kv_unit(0), kv_unit(1)}
    ev = QualityEvaluator(model, evals)
    measured, surrogate = [], []
    for fmt in formats:
        copy, _ = compressed_copy(model, {}, None, CompressionSettings(),
                                  kv=kv_quants({0: fmt, 1: fmt}, cap.amax(), None))
        measured.append(ev.evaluate(copy).kl)
        surrogate.append(sum(s[kv_key(fmt, None)] for s in scores.values()))
    # the same order, each within a factor of 1.5 (measured 0.9-1.1 on this model)
    assert sorted(range(4), key=measured.__getitem__) == sorted(range(4),
                                                                key=surrogate.__getitem__)
    for m, s in zip(measured, surrogate):
        assert m / 1.5 < s < m * 1.5


def test_streamed_kv_profile_equals_in_memory_and_is_cached(tmp_path: Path) -> None:
    from autoplan.sensitivity.kv import build_kv_profile
    from autoplan.streaming.profile import build_kv_profile_streamed

    model = tiny_llama()
    folder = tmp_path / "m"
    model.save_pretrained(folder, safe_serialization=True)
    tiny_tokenizer().save_pretrained(folder)
    calib = [IDS[:1], IDS[1:]]
    request = {KvFormat.FP8_E4M3: KvFormat.FP8_E4M3, KvFormat.INT8: None}
    kw = dict(model_hash="tiny", calib_hash="c", settings=CompressionSettings(), seed=0)
    mem = build_kv_profile(model, request, calib, cache_dir=tmp_path / "a", **kw)
    sm = StreamedModel(folder, device=torch.device("cpu"))
    streamed = build_kv_profile_streamed(sm, request, calib, cache_dir=tmp_path / "b", **kw)
    assert set(mem.kv) == {kv_unit(0), kv_unit(1)}
    for unit, scores in mem.kv.items():
        assert set(scores) == {"fp8_e4m3+q:fp8_e4m3", "int8"}
        for key, value in scores.items():
            assert value > 0
            assert streamed.kv[unit][key] == pytest.approx(value, rel=1e-3)
    # cached: a second run reads the file and computes nothing
    again = build_kv_profile_streamed(sm, request, calib, cache_dir=tmp_path / "b", **kw)
    assert again.kv == streamed.kv


def test_gpt_oss_attention_sinks_and_window_see_the_quantized_cache(monkeypatch) -> None:  # noqa: ANN001
    """gpt-oss attention (learned sinks in the softmax, block 0 windowed): the hooked model
    equals gpt-oss's own eager attention run on the same quantized K and V, so the sinks and
    the window pass through the wrapper; and the sinks still change the hooked output."""
    import sys

    from tests.unit._tiny_moe import tiny_moe_model

    model = tiny_moe_model("gpt_oss")
    mod = sys.modules[type(attention_modules(model)[0]).__module__]
    ref = _logits(model)
    with kv_hooks(model, {}):  # the wrapper alone: nothing changes, sinks included
        assert torch.equal(_logits(model), ref)
    amax = calibrate_kv(model, [IDS])
    quants = kv_quants({i: KvFormat.FP8_E4M3 for i in amax}, amax, None)
    with kv_hooks(model, quants):
        hooked = _logits(model)
    assert not torch.equal(hooked, ref)

    eager = mod.eager_attention_forward

    def quantized_eager(module, query, key, value, attention_mask, **kwargs):  # noqa: ANN001, ANN003, ANN202
        query, key, value = quants[module.layer_idx](query, key, value)
        return eager(module, query, key, value, attention_mask, **kwargs)

    monkeypatch.setattr(mod, "eager_attention_forward", quantized_eager)
    impl = model.config._attn_implementation
    model.config._attn_implementation = "eager"
    try:
        assert torch.allclose(_logits(model), hooked, atol=1e-5, rtol=1e-5)
    finally:
        model.config._attn_implementation = impl
    monkeypatch.setattr(mod, "eager_attention_forward", eager)
    with torch.no_grad():
        for attn in attention_modules(model).values():
            attn.sinks.zero_()
    with kv_hooks(model, quants):
        assert not torch.allclose(_logits(model), hooked, atol=1e-4)
