"""MoE GGUFs in llama.cpp's Mixtral layout (a "llama" GGUF with `llama.expert_count`, each
projection's experts stacked in one `ffn_*_exps` tensor) and its qwen2moe / qwen3moe layouts
(written by gguf-py in tests/unit/_tiny_gguf.py): every expert converts from its row of the
stack, and a plan exports a block's experts back as one stacked tensor of the planned type,
each row the simulated expert."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from autoplan.compress import CompressionSettings, compressed_copy
from autoplan.errors import UnsupportedFormatError
from autoplan.export import export_plan
from autoplan.formats import Choice
from autoplan.models import LoadedModel, load_model
from autoplan.models.gguf_convert import convert_gguf
from autoplan.models.moe import unfuse_experts
from autoplan.models.registry import ModelSource
from autoplan.modelspec import ModelSpec
from tests.unit._tiny_gguf import write_tiny_gguf
from tests.unit._tiny_moe import EXPERTS, TOP_K, VOCAB, tiny_moe_model
from tests.unit.test_export_common import make_plan
from tests.unit.tiny_llama import tiny_tokenizer

gguf = pytest.importorskip("gguf")
_PROJ = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps"}


def _vocab(size: int) -> list[str]:
    chars = [t for t, _ in sorted(tiny_tokenizer().get_vocab().items(), key=lambda kv: kv[1])]
    return chars + [f"<extra{i}>" for i in range(size - len(chars))]


def _tensors(path: Path) -> dict:
    return {t.name: t for t in gguf.GGUFReader(str(path)).tensors}


def _deq(t) -> torch.Tensor:  # noqa: ANN001 - a gguf ReaderTensor
    return torch.from_numpy(gguf.dequantize(t.data, t.tensor_type).copy()).float()


# qwen2_moe as llama.cpp's qwen2moe holds it: every block routed, a shared expert of a
# block-quantizable width
_OVERRIDES = {"qwen2_moe": {"mlp_only_layers": [], "shared_expert_intermediate_size": 64}}


@pytest.fixture(scope="module", params=["mixtral", "qwen3_moe", "qwen2_moe"])
def moe(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
        ) -> tuple[torch.nn.Module, LoadedModel]:
    """A tiny Mixtral or Qwen3-MoE (experts unfused) and its GGUF converted and loaded as
    autoplan does."""
    root = tmp_path_factory.mktemp("gguf_moe")
    model = tiny_moe_model(request.param, **_OVERRIDES.get(request.param, {}))
    unfuse_experts(model, ModelSpec.from_config(model.config.to_dict()))
    src = write_tiny_gguf(model, root / f"{request.param}.gguf", _vocab(VOCAB))
    folder = convert_gguf(src, root / "hf")
    got = load_model(str(folder))
    return model, LoadedModel(got.model, got.tokenizer, got.spec, "tiny", got.content_hash,
                              folder, ModelSource("gguf", src, "tiny"))


def test_every_expert_converts_from_its_row_of_the_stacked_tensor(moe) -> None:  # noqa: ANN001
    model, loaded = moe
    assert loaded.spec.model_type == model.config.model_type
    assert (loaded.spec.moe.n_experts, loaded.spec.moe.top_k) == (EXPERTS, TOP_K)
    src = _tensors(loaded.source.path)
    for block in range(2):
        router = loaded.model.get_submodule(f"model.layers.{block}.mlp.gate").weight
        assert torch.equal(router, model.get_submodule(f"model.layers.{block}.mlp.gate").weight)
        for proj, stacked in _PROJ.items():
            rows = _deq(src[f"blk.{block}.{stacked}.weight"])
            assert rows.shape[0] == EXPERTS
            for e in range(EXPERTS):
                name = f"model.layers.{block}.mlp.experts.{e}.{proj}"
                got = loaded.model.get_submodule(name).weight
                assert torch.equal(got, rows[e]), name  # exactly its row, in expert order
                assert (got - model.get_submodule(name).weight).abs().max() < 0.1, name
    # the config read from the GGUF (experts, top-k, rope, norms) computes what the source
    # architecture computes with the file's weights
    _assert_source_architecture_computes_it(model, loaded.model)


def _assert_source_architecture_computes_it(source: torch.nn.Module,
                                            converted: torch.nn.Module) -> None:
    """The converted model's logits are the source architecture's with the file's weights."""
    import copy

    same = copy.deepcopy(source)
    same.load_state_dict(converted.state_dict(), strict=True)
    ids = torch.randint(2, VOCAB, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(converted(input_ids=ids).logits,
                                   same(input_ids=ids).logits, atol=1e-5, rtol=1e-5)


def test_a_plan_exports_each_blocks_experts_as_one_stacked_tensor_of_its_type(
        moe, tmp_path) -> None:  # noqa: ANN001
    _, loaded = moe
    planned = {"gate_proj": "dense+q8_0", "up_proj": "dense+q4_0", "down_proj": "dense+q5_0"}
    decisions = {}
    for layer in loaded.spec.layers:
        proj = layer.name.rsplit(".", 1)[-1]
        decisions[layer.name] = planned[proj] if layer.block == 0 and layer.expert >= 0 \
            else "dense+q4_1"  # the source's type elsewhere: stored byte for byte
    out = export_plan(make_plan(loaded, decisions, target="local", runtime="llama.cpp"),
                      loaded, "gguf", tmp_path / "plan.gguf")
    _, sims = compressed_copy(loaded.model, {n: Choice.parse(c) for n, c in decisions.items()},
                              None, CompressionSettings("magnitude", "rtn"))
    dst, src = _tensors(out), _tensors(loaded.source.path)
    assert set(dst) == set(src)
    for proj, stacked in _PROJ.items():
        t = dst[f"blk.0.{stacked}.weight"]
        assert t.tensor_type.name == planned[proj].split("+")[1].upper()
        rows = _deq(t)
        for e in range(EXPERTS):
            want = sims[f"model.layers.0.mlp.experts.{e}.{proj}"].weight
            assert torch.equal(rows[e].reshape(want.shape), want), (proj, e)
        kept = f"blk.1.{stacked}.weight"
        assert dst[kept].tensor_type == src[kept].tensor_type
        assert np.array_equal(np.asarray(dst[kept].data), np.asarray(src[kept].data))
    assert dst["blk.0.ffn_gate_inp.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    # everything the plan keeps at the source's type (attention, router, norms, qwen2moe's
    # shared expert and its gate) is the source's bytes
    planned_stacks = {f"blk.0.{stacked}.weight" for stacked in _PROJ.values()}
    for name in set(src) - planned_stacks:
        assert dst[name].tensor_type == src[name].tensor_type, name
        assert np.array_equal(np.asarray(dst[name].data), np.asarray(src[name].data)), name
    if loaded.spec.moe.shared_intermediate:
        assert {"blk.0.ffn_gate_shexp.weight", "blk.0.ffn_down_shexp.weight"} <= set(dst)

    decisions["model.layers.0.mlp.experts.1.gate_proj"] = "dense+q4_0"  # one type per stack
    with pytest.raises(UnsupportedFormatError, match="stores them with one type"):
        export_plan(make_plan(loaded, decisions, target="local", runtime="llama.cpp"),
                    loaded, "gguf", tmp_path / "bad.gguf")
    assert not (tmp_path / "bad.gguf").exists()


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe"])
def test_a_qwen_moe_gguf_converts_with_its_own_expert_widths(family: str, tmp_path) -> None:
    """qwen2moe / qwen3moe GGUFs as llama.cpp's converter writes them (experts stacked per
    projection, `expert_feed_forward_length`, qwen2moe's shared expert): transformers' GGUF
    config mapping drops the expert widths, so the config would keep its class defaults
    (moe_intermediate_size 768) and no expert would load; autoplan reads them from the
    metadata, and every expert converts from its row of the stack."""
    model = tiny_moe_model(family, mlp_only_layers=[]) if family == "qwen2_moe" else \
        tiny_moe_model(family)
    unfuse_experts(model, ModelSpec.from_config(model.config.to_dict()))
    src = write_tiny_gguf(model, tmp_path / f"{family}.gguf", _vocab(VOCAB))
    loaded = load_model(str(convert_gguf(src, tmp_path / "hf")))
    moe = loaded.spec.moe
    assert loaded.spec.model_type == family and moe is not None
    assert moe.expert_intermediate == model.config.moe_intermediate_size
    assert moe.shared_intermediate == getattr(model.config, "shared_expert_intermediate_size", 0)
    rows = _deq(_tensors(src)["blk.0.ffn_gate_exps.weight"])
    for e in range(moe.n_experts):
        got = loaded.model.get_submodule(f"model.layers.0.mlp.experts.{e}.gate_proj").weight
        assert torch.equal(got, rows[e])
    _assert_source_architecture_computes_it(model, loaded.model)
