"""GGUF conversion beyond Llama (issue 13 item 2): every architecture transformers' GGUF
reader knows has a gguf-py name map under autoplan's spelling of its HF model_type; tiny
Qwen3 / Gemma 2 / Gemma 3 / Phi-3 GGUFs written by gguf-py (tests/unit/_tiny_gguf.py: the
layout llama.cpp writes, Gemma's norms stored as 1 + w, Phi-3's fused attn_qkv and ffn_up)
convert into verified HF folders; what autoplan could not plan is refused before any tensor
is dequantized."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from autoplan.errors import AutoplanError, ModelConfigError, UserInputError
from autoplan.models import gguf_convert
from autoplan.modelspec import ModelSpec
from tests.unit._tiny_archs import tiny_arch_config
from tests.unit._tiny_gguf import write_tiny_gguf
from tests.unit.tiny_llama import tiny_tokenizer

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

# transformers reads these GGUF architectures into these HF model types
_HF_TYPE = {"gemma3": "gemma3_text", "gemma4": "gemma4_text"}


def test_every_architecture_transformers_reads_has_a_name_map():
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    archs = [a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer")]
    assert "gemma3" in archs and "phi3" in archs
    for arch in archs:
        hf_type = _HF_TYPE.get(arch, arch)
        assert gguf_convert.gguf_arch(hf_type) is not None, hf_type
        gguf_convert.check_name_map(hf_type)
    # a file's own architecture name wins when gguf-py knows it
    assert gguf.MODEL_ARCH_NAMES[gguf_convert.gguf_arch("mistral", "llama")] == "llama"
    assert gguf.MODEL_ARCH_NAMES[gguf_convert.gguf_arch("gemma3_text")] == "gemma3"


def _vocab(size: int) -> list[str]:
    chars = [t for t, _ in sorted(tiny_tokenizer().get_vocab().items(), key=lambda kv: kv[1])]
    return chars + [f"<extra{i}>" for i in range(size - len(chars))]


def _model(arch: str):  # noqa: ANN202 - a transformers CausalLM
    cfg = tiny_arch_config(arch)
    if arch == "qwen3":  # transformers' GGUF reader has no head_dim key for qwen3: its
        cfg.head_dim = 128  # default (128, as in every released Qwen3) is what it builds
    if arch == "gemma2":  # llama.cpp scales attention by head_dim (27B: hidden / heads)
        cfg.query_pre_attn_scalar = cfg.head_dim
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(torch.randn_like(param) * 0.2)
    return model


@pytest.mark.parametrize("arch", ["qwen3", "gemma2", "gemma3_text", "phi3"])
def test_a_tiny_gguf_converts_into_a_verified_folder(arch, tmp_path):
    model = _model(arch)
    src = write_tiny_gguf(model, tmp_path / f"{arch}.gguf", _vocab(model.config.vocab_size))
    out = gguf_convert.convert_gguf(src, tmp_path / "hf")
    spec = ModelSpec.from_path(out)
    assert spec.model_type == arch and spec.n_layers == 2
    back = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    for key in ("attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar",
                "rope_parameters", "sliding_window", "head_dim"):  # what llama.cpp runs
        assert getattr(back.config, key, None) == getattr(model.config, key, None), key
    want, got = model.state_dict(), back.state_dict()
    for name, value in got.items():
        if name.endswith("norm.weight"):  # F32 in the file: back exactly (Gemma: up to w+1-1)
            torch.testing.assert_close(value, want[name], atol=1e-6, rtol=0)
        elif value.ndim == 2:  # Q4_1 / Q8_0 in the file: close, not equal
            assert (value - want[name]).abs().max() < 0.1, name
    if arch == "phi3":  # one tensor each in the GGUF and in the folder
        names = {t.name for t in gguf.GGUFReader(str(src)).tensors}
        assert {"blk.0.attn_qkv.weight", "blk.0.ffn_up.weight"} <= names
        assert got["model.layers.0.mlp.gate_up_proj.weight"].shape == (256, 64)


def test_gemmas_stored_norms_are_what_the_verification_undoes(tmp_path, monkeypatch):
    """The 1 + w convention is load-bearing: without it the verification refuses."""
    model = _model("gemma3_text")
    src = write_tiny_gguf(model, tmp_path / "g.gguf", _vocab(model.config.vocab_size))
    monkeypatch.setattr(gguf_convert, "_NORMS_PLUS_ONE", set())
    with pytest.raises(AutoplanError, match="norm.weight differs"):
        gguf_convert.convert_gguf(src, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_a_rope_scaling_the_reader_drops_is_refused(tmp_path):
    config = SimpleNamespace(rope_parameters={}, num_hidden_layers=2)
    yarn = tmp_path / "yarn.gguf"
    w = gguf.GGUFWriter(str(yarn), "qwen3")
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(4.0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UserInputError, match="'yarn' RoPE scaling"):
        gguf_convert.apply_dropped_keys(config, yarn)


def test_a_model_autoplan_cannot_plan_is_refused_before_any_tensor(tmp_path, monkeypatch):
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    src = tmp_path / "jamba.gguf"
    src.write_bytes(b"GGUF" + b"\0" * 64)
    moe = {"model_type": "jamba", "num_experts": 8, "hidden_size": 64}
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained",
                        lambda *a, **k: SimpleNamespace(**moe, to_dict=lambda: moe))

    def never(*_a, **_k):
        raise AssertionError("tensors were read before the config was checked")

    monkeypatch.setattr(gguf_utils, "load_gguf_checkpoint", never)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", never)
    with pytest.raises(ModelConfigError, match="hybrid Mamba"):
        gguf_convert.convert_gguf(src, tmp_path / "cache" / "m")
    assert not (tmp_path / "cache" / "m").exists()


def test_phi3_tensors_map_onto_the_fused_gguf_names():
    model = transformers.AutoModelForCausalLM.from_config(tiny_arch_config("phi3"))
    names = gguf_convert.hf_to_gguf_names(model, 2)
    assert names["model.layers.1.self_attn.qkv_proj.weight"] == "blk.1.attn_qkv.weight"
    assert names["model.layers.1.mlp.gate_up_proj.weight"] == "blk.1.ffn_up.weight"


def test_a_phi3_plan_exports_its_fused_tensors_to_gguf_whole(tmp_path, monkeypatch):
    """GGUF in, plan, GGUF out: Phi-3's attn_qkv and double-width ffn_up hold the plan's
    one tensor each, in the plan's type, bit for bit the plan's own weights."""
    from autoplan.compress import CompressionSettings, compressed_copy
    from autoplan.export import export_plan
    from autoplan.formats import Choice
    from autoplan.models import load_model
    from tests.unit.test_export_common import make_plan

    monkeypatch.setenv("AUTOPLAN_CACHE", str(tmp_path / "cache"))
    model = _model("phi3")
    src = write_tiny_gguf(model, tmp_path / "phi3.gguf", _vocab(model.config.vocab_size))
    loaded = load_model(str(src))
    decisions = {la.name: "dense+q4_1" for la in loaded.spec.layers}
    decisions["model.layers.0.self_attn.qkv_proj"] = "dense+q8_0"
    decisions["model.layers.1.mlp.gate_up_proj"] = "dense+q5_0"
    plan = make_plan(loaded, decisions, target="local", runtime="llama.cpp")
    out = export_plan(plan, loaded, "gguf", tmp_path / "out.gguf")
    tensors = {t.name: t for t in gguf.GGUFReader(str(out)).tensors}
    _, sims = compressed_copy(loaded.model, {n: Choice.parse(c) for n, c in decisions.items()},
                              None, CompressionSettings("magnitude", "rtn"))
    for layer, gguf_name, kind in (("model.layers.0.self_attn.qkv_proj", "blk.0.attn_qkv", "Q8_0"),
                                   ("model.layers.1.mlp.gate_up_proj", "blk.1.ffn_up", "Q5_0")):
        t = tensors[f"{gguf_name}.weight"]
        assert t.tensor_type.name == kind
        deq = torch.from_numpy(gguf.dequantize(t.data, t.tensor_type).copy()).float()
        assert torch.equal(deq.reshape(sims[layer].weight.shape), sims[layer].weight), layer
