"""Streamed execution of a gpt-oss checkpoint with MXFP4 experts equals the in-memory one:
the same fp32 expert weights bit for bit, decoded one block (and one expert) at a time; the
same profile scores and routing; the same search plan and measured KL; and a streamed memory
estimate that counts the packed experts as the reader reads them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from autoplan.compress import CompressionSettings
from autoplan.formats import Choice
from autoplan.models import load_model
from autoplan.modelspec import ModelSpec
from autoplan.streaming import estimate
from autoplan.streaming.skeleton import StreamedModel
from autoplan.streaming.weights import CheckpointReader
from tests.unit._tiny import (assert_same_plan, one_torch_thread,  # noqa: F401
                              search_plan, streamed_logits)
from tests.unit._tiny_moe import EXPERTS, TOP_K, mxfp4_pack, tiny_moe_model
from tests.unit.tiny_llama import tiny_tokenizer

CPU = torch.device("cpu")
_IDS = torch.randint(2, 200, (2, 24), generator=torch.Generator().manual_seed(1))
_PROJS = ("gate_up_proj", "down_proj")


def save_mxfp4_gpt_oss(folder: Path) -> Path:
    """The tiny gpt-oss as OpenAI's checkpoints store it: every block's routed experts as
    MXFP4 `*_blocks` / `*_scales` ([E, out, in / 32, 16] and [E, out, in / 32]), the rest in
    the model's dtype, and `quantization_config` mxfp4 in config.json."""
    model = tiny_moe_model("gpt_oss")
    model.save_pretrained(folder, safe_serialization=True)
    tiny_tokenizer().save_pretrained(folder)
    state = dict(model.state_dict())
    for b in range(model.config.num_hidden_layers):
        for proj in _PROJS:
            key = f"model.layers.{b}.mlp.experts.{proj}"
            blocks, scales, _ = mxfp4_pack(state.pop(key).transpose(1, 2))  # [E, out, in]
            state[f"{key}_blocks"], state[f"{key}_scales"] = blocks, scales
    for shard in folder.glob("*.safetensors"):
        shard.unlink()
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_mxfp4_gpt_oss(tmp_path_factory.mktemp("gptoss") / "m")


def test_streamed_experts_are_the_in_memory_weights_bit_for_bit(folder: Path) -> None:
    loaded = load_model(str(folder))
    assert loaded.spec.moe is not None and loaded.spec.moe.source_format == "mxfp4"
    want = loaded.model.state_dict()
    sm = StreamedModel(folder, device=CPU)
    experts = 0
    for i in range(sm.n_blocks):
        with sm.resident(i):
            for key in sm.block_keys[i]:
                got = sm.model.get_parameter(key)  # set anew by each read
                assert got.dtype == want[key].dtype and torch.equal(got, want[key]), key
                experts += ".experts." in key and key.endswith("_proj.weight")
    assert experts == sm.n_blocks * EXPERTS * len(_PROJS)
    with torch.no_grad():
        ref = loaded.model(input_ids=_IDS).logits
    torch.testing.assert_close(streamed_logits(sm, _IDS), ref, atol=1e-5, rtol=1e-5)


def test_one_block_is_decoded_at_a_time_one_expert_per_call(folder: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """A resident block reads only its own MXFP4 parts, decodes them an expert at a time,
    and holds its experts' weights once (each a slice of its projection's decoded tensor,
    not a copy beside it): the peak stays one fp32 block."""
    import transformers.integrations.mxfp4 as hf_mxfp4

    decoded: list[tuple[int, ...]] = []
    convert = hf_mxfp4.convert_moe_packed_tensors

    def watching(blocks: torch.Tensor, scales: torch.Tensor, **kw: object) -> torch.Tensor:
        decoded.append(tuple(blocks.shape))
        return convert(blocks, scales, **kw)

    monkeypatch.setattr(hf_mxfp4, "convert_moe_packed_tensors", watching)
    sm = StreamedModel(folder, device=CPU)
    read: list[str] = []
    reader_read = sm.reader.read

    def reading(names: list[str], **kw: object) -> dict[str, torch.Tensor]:
        read.extend(names := list(names))
        return reader_read(names, **kw)

    monkeypatch.setattr(sm.reader, "read", reading)
    with sm.resident(1):
        assert read and all(".layers.1." in n for n in read), read
        assert {n for n in read if n in sm.reader.packed} == {
            f"model.layers.1.mlp.experts.{p}" for p in _PROJS}
        assert len(decoded) == EXPERTS * len(_PROJS) and {s[0] for s in decoded} == {1}
        experts = sm.blocks[1].mlp.experts
        for proj in _PROJS:
            storages = {getattr(experts.expert(e), proj).weight.untyped_storage().data_ptr()
                        for e in range(EXPERTS)}
            assert len(storages) == 1, proj  # slices of one decoded tensor
        weights = list(sm.blocks[1].parameters())
        held = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in weights}
        assert sum(held.values()) == sum(p.numel() * 4 for p in weights)  # nothing else


def test_streamed_profile_scores_and_routing_are_the_in_memory_ones(folder: Path,
                                                                    tmp_path: Path) -> None:
    from autoplan.sensitivity import build_profile
    from autoplan.streaming.profile import build_profile_streamed

    loaded = load_model(str(folder))
    names = [la.name for la in loaded.spec.layers if la.role != "lm_head"]
    assert any(".experts." in n for n in names)
    choices = [Choice.parse("dense+int4_g128"), Choice.parse("dense+mxfp4")]
    calib = list(_IDS.split(1))
    args = {"model_hash": "tiny", "calib_hash": "c", "settings": CompressionSettings(),
            "seed": 0}
    mem = build_profile(loaded.model, names, choices, calib, cache_dir=tmp_path / "m", **args)
    sm = StreamedModel(folder, device=CPU)
    st = build_profile_streamed(sm, names, choices, calib, cache_dir=tmp_path / "s", **args)
    assert st.routing == mem.routing and sum(st.routing["1"]) == _IDS.numel() * TOP_K
    scored = 0
    for name in names:
        for key, ref in mem.scores[name].items():
            assert abs(st.scores[name][key] - ref) <= 1e-4 * max(abs(ref), 1e-12), (name, key)
            scored += ref > 0
    assert scored > 0


def test_streamed_search_gives_the_in_memory_plan(folder: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    mem = search_plan(folder, tmp_path, "memory", monkeypatch)
    st = search_plan(folder, tmp_path, "stream", monkeypatch)
    assert_same_plan(st, mem)


def test_streamed_estimate_counts_the_experts_as_the_reader_reads_them(folder: Path) -> None:
    """While a block is read, the estimate holds beside it the largest stored tensor as the
    reader reads it from disk (packed MXFP4, not bf16), plus one expert's decode scratch."""
    spec = ModelSpec.from_path(folder)
    reader = CheckpointReader(folder, mxfp4=True)
    gate_up = "model.layers.0.mlp.experts.gate_up_proj"
    stored = reader.nbytes([gate_up])
    n = EXPERTS * spec.moe.expert_intermediate * 2 * spec.hidden
    assert stored == n * 17 // 32  # 4 bits a weight, one scale byte per 32
    scratch = 2 * 4 * n / EXPERTS
    assert estimate._converting_bytes(spec) == pytest.approx(stored + scratch, abs=1)
    block = estimate._block_dims(spec)[0] * 4
    plan = estimate.plan(spec, "stream", "cpu")
    on_demand = max(spec.embedding_params, spec.vocab * spec.hidden) * 6
    assert plan.device_parts[estimate.RESIDENT] == pytest.approx(
        max(block + stored + scratch, on_demand), abs=1)


def test_released_gpt_oss_streams_in_less_than_its_bf16_twin() -> None:
    """gpt-oss-20b as released (MXFP4 experts): the streamed resident weights are one fp32
    block plus its largest expert tensor packed and one expert's decode scratch (measured on
    that tensor's shape, 32 x 5,760 x 2,880: the read peaked 2.37 GiB above the process, the
    estimate's 1.98 + 0.26 + 0.12), less than the same model stored in bf16."""
    import dataclasses

    from autoplan.cost.configs import resolve_config

    spec = resolve_config("gpt-oss-20b")
    assert spec.moe is not None and spec.moe.source_format == "mxfp4"
    bf16 = dataclasses.replace(spec, moe=dataclasses.replace(spec.moe, source_format=""))
    resident = {s.moe.source_format: estimate.plan(s, "stream", "cpu").device_parts[
        estimate.RESIDENT] for s in (spec, bf16)}
    block = estimate._block_dims(spec)[0] * 4
    largest = estimate._largest_block_tensor(spec)
    assert resident["mxfp4"] == pytest.approx(
        block + largest * 17 / 32 + 8 * largest / spec.moe.n_experts, abs=1)
    assert resident[""] == block + 2 * largest > resident["mxfp4"]


def test_a_broken_mxfp4_pair_is_one_line_naming_the_fix(folder: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from autoplan.errors import UserInputError

    state = load_file(str(folder / "model.safetensors"))
    key = "model.layers.0.mlp.experts.down_proj"
    for broken in ({k: v for k, v in state.items() if k != f"{key}_scales"},
                   state | {f"{key}_scales": state[f"{key}_scales"][:, :1].contiguous()}):
        save_file(broken, str(tmp_path / "model.safetensors"))
        with pytest.raises(UserInputError, match=f"{key}_.*re-download") as err:
            CheckpointReader(tmp_path, mxfp4=True)
        assert "\n" not in str(err.value)
    assert key not in CheckpointReader(folder) and key in CheckpointReader(folder, mxfp4=True)
