"""gpt-oss GGUFs (llama.cpp's `gpt-oss` architecture, MXFP4 experts; written by gguf-py as
convert_hf_to_gguf.py writes them, tests/unit/_tiny_gptoss_gguf.py): loaded into the model
the HF-folder path gives, experts at their MXFP4 values and recorded as MXFP4, and refused in
one line when the experts disagree with the metadata."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from autoplan.errors import UserInputError
from autoplan.formats.schemes import MxFp4Scheme
from autoplan.models import check_loadable, load_model, load_spec
from autoplan.models.gguf_convert import convert_gguf
from tests.unit._tiny_gptoss_gguf import ggml_mxfp4, write_gptoss_gguf
from tests.unit._tiny_moe import EXPERTS, tiny_moe_model

gguf = pytest.importorskip("gguf")
_ROPE = {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
         "truncate": False, "original_max_position_embeddings": 64, "rope_theta": 150000.0}


def _model() -> torch.nn.Module:
    return tiny_moe_model("gpt_oss", rope_parameters=_ROPE, vocab_size=264)


def test_ggml_mxfp4_decodes_as_the_ocp_mx_spec_says() -> None:
    """Every E2M1 code under every finite E8M0 scale (2^(s - 127), s < 255): gguf-py's MXFP4
    dequantization of ggml's block layout gives the OCP MX v1.0 value exactly."""
    e2m1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    e2m1 += [-v for v in e2m1]
    scales = torch.arange(255, dtype=torch.uint8)[:, None]  # one block per scale
    codes = torch.cat([torch.arange(16), 15 - torch.arange(16)])  # elements j, j + 16 differ
    blocks = (codes[0::2] | (codes[1::2] << 4)).to(torch.uint8).expand(255, 1, 16)
    with np.errstate(over="ignore"):  # 6 x 2^127 is inf in float32, here and in `want`
        got = gguf.dequantize(ggml_mxfp4(blocks, scales), gguf.GGMLQuantizationType.MXFP4)
    want = torch.tensor([[e2m1[c] * 2.0 ** (s - 127) for c in codes.tolist()]
                         for s in range(255)], dtype=torch.float64).float()
    assert torch.equal(torch.from_numpy(got.copy()).reshape(255, 32), want)


@pytest.mark.parametrize(("fused", "mxfp4"), [(False, True), (True, True), (False, False)],
                         ids=["gate+up", "gate_up", "float-experts"])
def test_gptoss_gguf_loads_as_the_hf_model_with_mxfp4_experts(tmp_path, fused, mxfp4) -> None:
    from safetensors.torch import load_file

    model = _model()
    src = tmp_path / "gpt-oss.gguf"
    hf = write_gptoss_gguf(model, src, fused=fused, mxfp4=mxfp4)
    source_format = "mxfp4" if mxfp4 else ""  # float experts: the checkpoint's dtype
    assert load_spec(str(src)).moe.source_format == source_format  # from the header alone
    folder = convert_gguf(src, tmp_path / "hf")
    loaded = load_model(str(folder))
    assert loaded.spec.model_type == "gpt_oss"
    assert loaded.spec.moe.source_format == source_format
    assert loaded.spec.moe.n_experts == EXPERTS
    saved = load_file(str(folder / "model.safetensors"))
    for key, value in hf.items():  # the checkpoint's own MXFP4 bytes, not re-quantized
        if key.endswith(("_blocks", "_scales")):
            assert torch.equal(saved[key], value), key
    # the HF model whose experts hold the MXFP4 values, every other tensor as the GGUF
    # stores it (BF16 matrices): same logits as autoplan's load of the GGUF
    ref = copy.deepcopy(model)
    state = ref.state_dict()
    for key, value in state.items():
        if key in hf:
            state[key] = hf[key]
        elif value.ndim == 2 and ".experts." not in key:  # expert biases: F32 in the GGUF
            state[key] = value.to(torch.bfloat16).float()
    ref.load_state_dict(state)
    scheme = MxFp4Scheme(rounding="floor")
    for b in range(2):
        layer = loaded.model.model.layers[b]
        for e in range(EXPERTS):
            got = layer.mlp.experts.expert(e).gate_up_proj.weight
            assert torch.equal(got, hf[f"model.layers.{b}.mlp.experts.gate_up_proj"][e].T)
            if mxfp4:  # MXFP4 as the search simulates it adds no error to these weights
                rows = got.reshape(-1, 32)
                again, _ = scheme.fake(rows, scheme.qparams(rows, None), None)
                assert torch.equal(again.reshape(got.shape), got)
        assert torch.equal(layer.self_attn.sinks, model.model.layers[b].self_attn.sinks)
    assert loaded.model.config.layer_types == ["sliding_attention", "full_attention"]
    assert loaded.model.config.rope_parameters == {**_ROPE}
    ids = torch.randint(2, 264, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(input_ids=ids).logits,
                                   ref(input_ids=ids).logits, atol=1e-5, rtol=1e-5)
    assert loaded.tokenizer("hello").input_ids[:2] == [256, 257]  # the GGUF's BPE merges


def test_gptoss_gguf_whose_experts_disagree_with_its_metadata_is_refused(tmp_path) -> None:
    src = tmp_path / "bad.gguf"
    write_gptoss_gguf(_model(), src, expert_count=EXPERTS + 2)
    want = (f"blk.0.ffn_gate_inp.weight holds {EXPERTS} experts but its metadata "
            f"gpt-oss.expert_count says {EXPERTS + 2}")
    with pytest.raises(UserInputError, match=want) as err:
        check_loadable(str(src))
    assert "\n" not in str(err.value)
    with pytest.raises(UserInputError, match=want):
        convert_gguf(src, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
