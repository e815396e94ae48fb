"""Loading MoE checkpoints: experts unfused into named linears with the same outputs, the
calibration routing counted, and checkpoints that disagree with their config refused."""

from __future__ import annotations

import json

import pytest
import torch

from autoplan.compress import CompressionSettings
from autoplan.errors import UserInputError
from autoplan.formats import Choice
from autoplan.models import check_loadable, load_model
from autoplan.models.moe import UnfusedExperts, counting_routing, unfuse_experts
from autoplan.modelspec import ModelSpec
from autoplan.sensitivity.capture import capture
from autoplan.sensitivity.profile import make_task, score_task
from tests.unit._tiny import streamed_logits
from tests.unit._tiny_moe import EXPERTS, FAMILIES, TOP_K, mxfp4_pack, save_tiny_moe, tiny_moe_model

_IDS = torch.randint(2, 200, (2, 24), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("family", FAMILIES)
def test_unfused_experts_compute_what_transformers_computes(family: str) -> None:
    model = tiny_moe_model(family)
    spec = ModelSpec.from_config(model.config.to_dict())
    with torch.no_grad():
        ref = model(input_ids=_IDS).logits
    assert unfuse_experts(model, spec) == len(spec.moe.moe_blocks)
    with torch.no_grad(), counting_routing(model) as counter:
        got = model(input_ids=_IDS).logits
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    for block, counts in counter.as_lists().items():
        assert len(counts) == EXPERTS and sum(counts) == _IDS.numel() * TOP_K, block
    experts = [la for la in spec.layers if la.expert >= 0]
    for layer in experts:  # every expert layer of the spec is a real nn.Linear of its shape
        linear = model.get_submodule(layer.name)
        assert tuple(linear.weight.shape) == (layer.out_features, layer.in_features)


def test_load_model_unfuses_and_verifies_the_layer_graph(tmp_path) -> None:
    folder = save_tiny_moe(tmp_path / "mixtral", "mixtral")
    loaded = load_model(str(folder))
    assert isinstance(loaded.model.model.layers[0].mlp.experts, UnfusedExperts)
    assert loaded.spec.moe.n_experts == EXPERTS
    check_loadable(str(folder))  # headers only: whole, and the experts match the config


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe", "gpt_oss"])
def test_expert_count_that_disagrees_with_the_config_is_refused(tmp_path, family) -> None:
    folder = save_tiny_moe(tmp_path / family, family)
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    key = "num_local_experts" if family != "qwen3_moe" else "num_experts"
    cfg[key] = EXPERTS + 2
    cfg.pop("num_local_experts" if key == "num_experts" else "num_experts", None)
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(UserInputError, match=f"has {EXPERTS} experts in block 0 but its "
                                             f"config.json says {EXPERTS + 2}") as err:
        check_loadable(str(folder))
    assert "\n" not in str(err.value)


def test_unsupported_moe_checkpoint_is_refused_before_loading(tmp_path) -> None:
    folder = save_tiny_moe(tmp_path / "m", "mixtral")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["scoring_func"] = "sigmoid"
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(Exception, match="router scoring_func 'sigmoid'"):
        check_loadable(str(folder))


def test_capture_records_routing_and_unpicked_experts_capture_nothing() -> None:
    model = tiny_moe_model("gpt_oss")
    spec = ModelSpec.from_config(model.config.to_dict())
    unfuse_experts(model, spec)
    with torch.no_grad():  # expert 3 of block 0 is never picked: its router bias is -1e4
        model.model.layers[0].mlp.router.bias[3] = -1e4
    names = [la.name for la in spec.layers if la.block == 0 and la.expert >= 0]
    cap = capture(model, names, [_IDS], seed=0)
    assert cap.routing["0"][3] == 0 and sum(cap.routing["0"]) == _IDS.numel() * TOP_K
    idle = "model.layers.0.mlp.experts.3.gate_up_proj"
    assert cap.inputs[idle].shape == (0, 64) and cap.grads[idle].shape == (0, 64)
    busy = "model.layers.0.mlp.experts.0.gate_up_proj"
    assert cap.inputs[busy].shape[0] == cap.routing["0"][0] > 0
    # scoring an expert no token picked: zero loss in every format (not a division by zero)
    choices = [Choice.parse("dense+int4_g128"), Choice.parse("dense+fp8_e4m3")]
    settings = CompressionSettings()
    idle_res = score_task(make_task(model, idle, choices, cap, settings))
    assert idle_res.scores == {str(c): 0.0 for c in choices} and idle_res.outlier == 0.0
    busy_res = score_task(make_task(model, busy, choices, cap, settings))
    assert all(v > 0 for v in busy_res.scores.values())


@pytest.mark.parametrize("family", FAMILIES)
def test_streamed_moe_blocks_equal_the_in_memory_forward(family: str, tmp_path) -> None:
    """Streamed execution reads each expert from its checkpoint tensor: renamed (Mixtral's
    block_sparse_moe.experts.{e}.w1/w3/w2), per expert (Qwen) or a row of a stacked tensor
    (gpt-oss), and computes what the loaded model computes."""
    from autoplan.streaming.skeleton import StreamedModel

    folder = save_tiny_moe(tmp_path / family, family)
    want = load_model(str(folder))
    with torch.no_grad():
        ref = want.model(input_ids=_IDS).logits
    sm = StreamedModel(folder, device=torch.device("cpu"))
    torch.testing.assert_close(streamed_logits(sm, _IDS), ref, atol=1e-5, rtol=1e-5)
    assert isinstance(sm.blocks[0].mlp.experts, UnfusedExperts)


def test_a_stacked_expert_tensor_is_never_whole_in_fp32_beside_its_experts(tmp_path) -> None:
    """gpt-oss stores a block's experts as one [E, ...] tensor; streamed, it is read as
    stored (bf16) on its own and each expert's row converted as it is taken, so the block's
    fp32 experts never sit beside a whole fp32 copy of the stack."""
    from autoplan.streaming.skeleton import StreamedModel

    folder = save_tiny_moe(tmp_path / "gpt_oss", "gpt_oss")
    sm = StreamedModel(folder, device=torch.device("cpu"))
    calls: list[tuple[list[str], torch.dtype | None]] = []
    read = sm.reader.read

    def recording(names, dtype=None):  # noqa: ANN001, ANN202 - the reader's signature
        names = list(names)
        calls.append((names, dtype))
        return read(names, dtype)

    sm.reader.read = recording  # type: ignore[method-assign]
    with torch.no_grad(), sm.resident(0):
        experts = sm.blocks[0].mlp.experts
        weight = next(p for n, p in experts.named_parameters() if n.endswith("weight"))
        assert weight.dtype == torch.float32 and weight.device.type == "cpu"
    stacked = [(names, dtype) for names, dtype in calls
               if any(n.endswith(("experts.gate_up_proj", "experts.down_proj")) for n in names)]
    assert stacked and all(len(names) == 1 and dtype is None for names, dtype in stacked)


def test_streamed_moe_profile_records_the_routing_and_scores_of_the_in_memory_one(
        tmp_path) -> None:
    """The streamed profile counts the calibration routing in its forward pass (the cost
    model's shares) and scores experts as the in-memory profile does, an expert that no
    token picks at zero."""
    from autoplan.sensitivity import build_profile
    from autoplan.streaming.profile import build_profile_streamed
    from autoplan.streaming.skeleton import StreamedModel

    folder = save_tiny_moe(tmp_path / "mixtral", "mixtral")
    loaded = load_model(str(folder))
    names = [la.name for la in loaded.spec.layers if la.block == 1]
    choices = [Choice.parse("dense+int4_g128")]
    calib = list(_IDS.split(1))
    args = dict(model_hash="tiny", calib_hash="c", settings=CompressionSettings(), seed=0)
    mem = build_profile(loaded.model, names, choices, calib, cache_dir=tmp_path / "m", **args)
    sm = StreamedModel(folder, device=torch.device("cpu"))
    st = build_profile_streamed(sm, names, choices, calib, cache_dir=tmp_path / "s", **args)
    assert st.routing == mem.routing and set(st.routing) == {"0", "1"}
    assert sum(st.routing["1"]) == _IDS.numel() * TOP_K
    for name in names:
        for key, ref in mem.scores[name].items():
            assert abs(st.scores[name][key] - ref) <= 1e-4 * max(abs(ref), 1e-12), (name, key)


def test_gpt_oss_mxfp4_experts_are_read_at_their_exact_values(tmp_path) -> None:
    """A gpt-oss checkpoint with MXFP4 experts (blocks + scales, quantization_config mxfp4)
    loads with every expert at exactly its E2M1 x E8M0 values, and re-quantizing them as
    MXFP4 (OCP floor scales) gives the same values: gpt-oss's own format at zero added error."""
    from safetensors.torch import save_file

    from autoplan.formats.schemes import MxFp4Scheme

    model = tiny_moe_model("gpt_oss")
    model.save_pretrained(tmp_path / "m", safe_serialization=True)
    from tests.unit.tiny_llama import tiny_tokenizer

    tiny_tokenizer().save_pretrained(tmp_path / "m")
    state = {k: v for k, v in model.state_dict().items()}
    want = {}
    for b in range(2):
        for proj in ("gate_up_proj", "down_proj"):
            key = f"model.layers.{b}.mlp.experts.{proj}"
            w = state.pop(key).transpose(1, 2)  # [E, out, in], blocks along the inputs
            blocks, scales, values = mxfp4_pack(w)
            state[f"{key}_blocks"], state[f"{key}_scales"] = blocks, scales
            want[(b, proj)] = values
    (tmp_path / "m" / "model.safetensors").unlink()
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "m" / "model.safetensors"))
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))

    loaded = load_model(str(tmp_path / "m"))
    assert loaded.spec.moe.source_format == "mxfp4"
    for (b, proj), values in want.items():
        for e in range(EXPERTS):
            linear = loaded.model.get_submodule(f"model.layers.{b}.mlp.experts.{e}.{proj}")
            assert torch.equal(linear.weight, values[e]), (b, proj, e)
            scheme = MxFp4Scheme(rounding="floor")
            rows = linear.weight.reshape(-1, 32)
            again, _ = scheme.fake(rows, scheme.qparams(rows, None), None)
            assert torch.equal(again.reshape(linear.weight.shape), linear.weight)
