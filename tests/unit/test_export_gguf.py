"""`--format gguf` on a tiny Llama whose source is a GGUF written here the way llama.cpp
writes one (Q4_1 linears with q/k rows permuted per head, a Q8_0 token embedding serving as
the tied output, F32 norms)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from autoplan.errors import AutoplanError, UnsupportedFormatError, UserInputError
from autoplan.export import export_plan
from autoplan.export.gguf import llama_permutation, read_audit, row_order, sidecar_paths
from autoplan.models import LoadedModel
from autoplan.models.gguf_convert import hf_to_gguf_names
from autoplan.models.hashing import weights_hash
from autoplan.models.registry import ModelSource
from autoplan.modelspec import ModelSpec
from tests.unit.test_export_common import layer_names, make_plan, tiny_loaded

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType


def _tiny_gguf_model(tmp_path: Path) -> LoadedModel:
    """A tiny tied Llama and its source GGUF; the model holds the GGUF's dequantized values."""
    model = tiny_loaded(tmp_path, tied=True).model
    names = hf_to_gguf_names(model, model.config.num_hidden_layers)
    path = tmp_path / "tiny.Q4_1.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_string("tokenizer.ggml.model", "gpt2")
    with torch.no_grad():
        for hf, tensor in model.state_dict().items():
            if hf == "lm_head.weight":
                continue
            name = names[hf]
            w = tensor.float()
            heads = {"attn_q": 4, "attn_k": 2}.get(name.split(".")[-2]) if "attn_" in name else None
            if heads:
                w = w[llama_permutation(w.shape[0], heads)]
            kind = Q.F32 if w.ndim == 1 else (Q.Q8_0 if name == "token_embd.weight" else Q.Q4_1)
            data = gguf.quantize(w.numpy(), kind)
            writer.add_tensor(name, data, raw_dtype=kind)
            deq = torch.from_numpy(gguf.dequantize(data, kind).copy()).reshape(w.shape)
            if heads:  # back to HF row order, as autoplan's conversion does
                deq = deq[torch.argsort(llama_permutation(w.shape[0], heads))]
            tensor.copy_(deq)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    folder = tmp_path / "hf"
    model.save_pretrained(str(folder), safe_serialization=True)
    spec = ModelSpec.from_config(model.config.to_dict(), name="tiny")
    return LoadedModel(model, None, spec, "tiny", weights_hash(folder), folder,
                       ModelSource("gguf", path, "tiny"))


@pytest.fixture()
def loaded(tmp_path):
    return _tiny_gguf_model(tmp_path)


def _decisions(loaded: LoadedModel, body: str, head: str) -> dict[str, str]:
    return {n: (head if n == "lm_head" else body) for n in layer_names(loaded)}


def _plan(loaded, decisions):
    return make_plan(loaded, decisions, target="local", runtime="llama.cpp")


def _tensors(path: Path) -> dict:
    return {t.name: t for t in gguf.GGUFReader(str(path)).tensors}


def test_keeping_the_source_types_reproduces_every_tensor_byte_for_byte(loaded, tmp_path):
    plan = _plan(loaded, _decisions(loaded, "dense+q4_1", "dense+q8_0"))
    out = export_plan(plan, loaded, "gguf", tmp_path / "keep")
    src, dst = _tensors(loaded.source.path), _tensors(out)
    assert set(dst) == set(src)  # the tied output stays tied: no output.weight
    for name, t in src.items():
        assert dst[name].tensor_type == t.tensor_type
        assert np.array_equal(np.asarray(dst[name].data), np.asarray(t.data)), name
    assert out == tmp_path / "keep" / "model.gguf"
    audit = read_audit(out)
    assert audit["format"] == "gguf" and audit["runtime"] == "llama.cpp"
    assert audit["gguf_tensors"]["blk.0.attn_q.weight"]["type"] == "Q4_1"
    assert json.loads((tmp_path / "keep" / "autoplan_plan.json").read_text())["decisions"]


def test_a_mixed_plan_stores_each_layer_in_its_type_in_llama_cpp_row_order(loaded, tmp_path):
    decisions = _decisions(loaded, "dense+q5_0", "dense+q4_0")
    decisions["model.layers.0.self_attn.q_proj"] = "dense+q8_0"
    decisions["model.layers.1.self_attn.k_proj"] = "dense+fp16"
    decisions["model.layers.1.mlp.down_proj"] = "dense+q5_1"
    decisions["model.layers.0.mlp.up_proj"] = "dense+fp32"
    plan = _plan(loaded, decisions)
    out = export_plan(plan, loaded, "gguf", tmp_path / "mixed.gguf")
    assert out == tmp_path / "mixed.gguf" and all(p.is_file() for p in sidecar_paths(out))
    dst = _tensors(out)
    names = hf_to_gguf_names(loaded.model, 2)
    from autoplan.compress import CompressionSettings, compressed_copy
    from autoplan.formats import Choice

    _, sims = compressed_copy(loaded.model, {n: Choice.parse(c) for n, c in decisions.items()},
                              None, CompressionSettings("magnitude", "rtn"))
    for layer, choice in decisions.items():
        name = "output.weight" if layer == "lm_head" else names[f"{layer}.weight"]
        t = dst[name]
        assert t.tensor_type.name == Choice.parse(choice).precision.value.upper() \
            .replace("FP32", "F32").replace("FP16", "F16")
        deq = torch.from_numpy(gguf.dequantize(t.data, t.tensor_type).copy()).float()
        heads = {"q_proj": 4, "k_proj": 2}.get(layer.rsplit(".", 1)[-1])
        want = sims[layer].weight
        if heads:
            want = want[llama_permutation(want.shape[0], heads)]
        assert torch.equal(deq.reshape(want.shape), want), layer
    # embeddings and norms are copied from the source unchanged
    src = _tensors(loaded.source.path)
    assert np.array_equal(np.asarray(dst["token_embd.weight"].data),
                          np.asarray(src["token_embd.weight"].data))
    assert dst["blk.0.attn_norm.weight"].tensor_type == Q.F32


def test_refusals_come_before_anything_is_written(loaded, tmp_path):
    hf = LoadedModel(loaded.model, None, loaded.spec, "tiny", loaded.content_hash, loaded.path)
    plan = _plan(loaded, _decisions(loaded, "dense+q4_1", "dense+q8_0"))
    with pytest.raises(UserInputError, match="convert_hf_to_gguf.py") as err:
        export_plan(plan, hf, "gguf", tmp_path / "a")
    assert "\n" not in str(err.value) and not (tmp_path / "a").exists()
    vllm_plan = _plan(loaded, _decisions(loaded, "dense+int4_g32", "dense+q8_0"))
    with pytest.raises(UnsupportedFormatError, match="llama.cpp"):
        export_plan(vllm_plan, loaded, "gguf", tmp_path / "b")
    (tmp_path / "c.gguf").write_text("not mine")
    with pytest.raises(UserInputError, match="not an autoplan export"):
        export_plan(plan, loaded, "gguf", tmp_path / "c.gguf")
    assert (tmp_path / "c.gguf").read_text() == "not mine"
    assert not list(tmp_path.glob(".c.gguf.*"))


def test_a_second_export_replaces_the_first(loaded, tmp_path):
    out = tmp_path / "m.gguf"
    export_plan(_plan(loaded, _decisions(loaded, "dense+q4_1", "dense+q8_0")), loaded, "gguf", out)
    export_plan(_plan(loaded, _decisions(loaded, "dense+q8_0", "dense+q8_0")), loaded, "gguf", out)
    assert _tensors(out)["blk.0.ffn_up.weight"].tensor_type == Q.Q8_0


def test_row_order_finds_the_permutation_or_refuses():
    w = torch.randn(16, 8)
    assert row_order(w, w.clone(), (4, 2)) is None
    index = llama_permutation(16, 2)
    assert torch.equal(row_order(w, w[index], (4, 2)), index)
    with pytest.raises(AutoplanError, match="row order"):
        row_order(w, w.flip(0), (4, 2))
