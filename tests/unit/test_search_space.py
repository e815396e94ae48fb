"""SearchSpace: runtime filtering, fused units, protection, fixed choice lists."""

from __future__ import annotations

import pytest

from autoplan.errors import UnsupportedFormatError
from autoplan.formats import Choice
from autoplan.search import build_space, load_space_file
from autoplan.targets import get_target
from tests.unit._tiny import tiny_spec


def _space(target: str = "h100-sxm", runtime: str = "vllm", **kw):
    return build_space(tiny_spec(), get_target(target), runtime, **kw)


def _kinds(space) -> set[str]:
    return {c.sparsity.kind for u in space.units for c in u.choices}


def test_vllm_on_h100_offers_no_2_4_and_no_unstructured() -> None:
    space = _space()
    assert _kinds(space) == {"dense"}
    assert any(c.startswith("2:4") for c in space.dropped)  # dropped, with a reason
    assert all(reason for reason in space.dropped.values())
    # even when asked for explicitly, the runtime matrix removes them
    asked = [Choice.parse(c) for c in ("dense+bf16", "dense+fp8_e4m3", "2:4+bf16",
                                       "unstructured@50+bf16")]
    explicit = _space(candidates=asked)
    assert _kinds(explicit) == {"dense"}
    assert {"2:4+bf16", "unstructured@50+bf16"} <= set(explicit.dropped)


def test_tensorrt_llm_on_h100_offers_2_4() -> None:
    space = _space(runtime="tensorrt-llm")
    assert all(Choice.parse("2:4+bf16") in u.choices for u in space.units)


def test_fused_qkv_and_gate_up_share_one_unit() -> None:
    space = _space()
    by_unit = {u.name: sorted(la.role for la in u.layers) for u in space.units}
    for block in (0, 1):
        assert by_unit[f"model.layers.{block}.qkv"] == ["k", "q", "v"]
        assert by_unit[f"model.layers.{block}.gate_up"] == ["gate", "up"]
        assert by_unit[f"model.layers.{block}.mlp.down_proj"] == ["down"]
    assert len(space.units) == 8  # 4 per block
    # every layer of a unit gets the unit's pick
    decisions = space.decisions({"model.layers.0.qkv": Choice.parse("dense+fp8_e4m3")})
    assert {decisions[f"model.layers.0.self_attn.{p}_proj"] for p in "qkv"} == \
        {Choice.parse("dense+fp8_e4m3")}
    assert decisions["model.layers.0.self_attn.o_proj"] == space.baseline


@pytest.mark.parametrize(("target", "runtime"), [("h100-sxm", "vllm"),
                                                 ("h100-sxm", "tensorrt-llm"),
                                                 ("mi300x", None)])
def test_lm_head_protected_on_gpu_spaces(target: str, runtime: str | None) -> None:
    from autoplan.runtimes import default_runtime

    tgt = get_target(target)
    space = build_space(tiny_spec(), tgt, runtime or default_runtime(tgt))
    assert [la.name for la in space.protected] == ["lm_head"]
    assert all(la.role != "lm_head" for u in space.units for la in u.layers)
    assert space.decisions({})["lm_head"] == space.baseline


def test_given_candidates_restrict_the_space_and_keep_the_baseline() -> None:
    space = _space("xeon-8480", "onnxruntime", candidates=[Choice.parse("int8a8_g128"),
                                                           Choice.parse("int8")])
    assert set(space.all_choices) == {Choice.parse("fp32"), Choice.parse("int8a8_g128")}
    assert "dense+int8" in space.dropped  # refused by the runtime matrix, with its reason
    assert all(u.choices[0] == space.baseline for u in space.units)


def test_lm_head_searched_on_cpu() -> None:
    space = _space("xeon-8480", "onnxruntime")
    assert space.protected == ()
    assert any(la.name == "lm_head" for u in space.units for la in u.layers)


@pytest.mark.parametrize(("first", "last", "block"), [(True, False, 0), (False, True, 1)])
def test_protect_first_or_last_block(first: bool, last: bool, block: int) -> None:
    space = _space(protect_first_block=first, protect_last_block=last)
    assert {la.block for la in space.protected if la.role != "lm_head"} == {block}
    assert len(space.protected) == 1 + 7  # lm_head + the block's 7 linears
    assert all(u.layers[0].block != block for u in space.units)
    assert len(space.units) == 4
    assert all(space.decisions({})[la.name] == space.baseline for la in space.protected)


def test_protecting_everything_raises_unsupported_on_gpu_but_cpu_keeps_lm_head() -> None:
    with pytest.raises(UnsupportedFormatError, match="--runtime or --target"):
        _space(protect_first_block=True, protect_last_block=True)
    cpu = _space("xeon-8480", "onnxruntime", protect_first_block=True, protect_last_block=True)
    assert [u.name for u in cpu.units] == ["lm_head"]
    assert len(cpu.protected) == 14


@pytest.mark.parametrize(("target", "runtime"), [("h100-sxm", "vllm"), ("h100-sxm", "tensorrt-llm"),
                                                 ("xeon-8480", "onnxruntime")])
def test_choice_lists_fixed_baseline_first(target: str, runtime: str) -> None:
    a, b = _space(target, runtime), _space(target, runtime)
    assert [(u.name, u.choices) for u in a.units] == [(u.name, u.choices) for u in b.units]
    sf = load_space_file(get_target(target).platform)
    for unit in a.units:
        assert unit.choices[0] == a.baseline == Choice.parse(sf.baseline)
        assert len(set(unit.choices)) == len(unit.choices)
        assert len(unit.choices) > 1
    assert a.all_choices[0] == a.baseline


def test_int4_g128_only_where_in_features_divides() -> None:
    g128 = Choice.parse("dense+int4_g128")
    g64 = Choice.parse("dense+int4_g64")
    for target, runtime in (("h100-sxm", "vllm"), ("xeon-8480", "onnxruntime")):
        space = _space(target, runtime)
        assert any(g128 in u.choices for u in space.units), (target, "g128 never offered")
        for unit in space.units:
            fits = all(la.in_features % 128 == 0 for la in unit.layers)
            assert (g128 in unit.choices) == fits, (target, unit.name)
            assert g64 in unit.choices  # 64 and 128 both divide by 64
    down = next(u for u in _space().units if u.name.endswith("0.mlp.down_proj"))
    assert down.layers[0].in_features == 128 and g128 in down.choices


def test_uniform_skips_units_that_cannot_take_the_choice() -> None:
    space = _space()
    g128 = Choice.parse("dense+int4_g128")
    decisions = space.uniform(g128)
    for unit in space.units:
        want = g128 if g128 in unit.choices else space.baseline
        assert all(decisions[la.name] == want for la in unit.layers)


def test_repeated_choices_are_searched_once() -> None:
    from autoplan.search import parse_choices

    got = parse_choices(("int4a8_g32", "dense+int4a8_g32", "int8a8_g128"))
    assert got == (Choice.parse("int4a8_g32"), Choice.parse("int8a8_g128"))
    assert parse_choices(None) is None
    with pytest.raises(Exception, match="empty"):
        parse_choices(())


def test_kernels_are_measured_by_default_only_when_planning_for_this_machine() -> None:
    from autoplan.search import CostTable, SearchRequest
    from autoplan.search.request import measures_kernels

    local = SearchRequest(target="local")
    assert measures_kernels(local, "local", "onnxruntime")
    assert measures_kernels(local, "local", "llama.cpp")
    assert not measures_kernels(local, "local", "vllm")
    assert not measures_kernels(SearchRequest(target="xeon-8480"), "xeon-8480", "onnxruntime")
    assert not measures_kernels(SearchRequest(target="local", measure_kernels=False), "local",
                                "onnxruntime")
    table = CostTable("t.json", {"rows": [{"m": 1, "n": 1, "k": 1, "choice": "dense+fp8",
                                           "median_us": 1.0}]})
    assert not measures_kernels(SearchRequest(target="local", cost_table=table), "local",
                                "onnxruntime")


def test_llama_cpp_decides_every_projection_on_its_own() -> None:
    """llama.cpp runs q/k/v and gate/up as separate GGUF tensors: one unit per layer there,
    one per fused group on ONNX Runtime; its formats are the exact GGUF types."""
    from autoplan.formats import Choice
    from autoplan.modelspec import ModelSpec
    from autoplan.search import build_space
    from autoplan.targets import get_target

    spec = ModelSpec.from_config({"model_type": "llama", "hidden_size": 64,
                                  "intermediate_size": 128, "num_hidden_layers": 2,
                                  "num_attention_heads": 4, "num_key_value_heads": 2,
                                  "vocab_size": 256}, name="tiny")
    target = get_target("xeon-8480")
    llama = build_space(spec, target, "llama.cpp")
    ort = build_space(spec, target, "onnxruntime")
    assert len(llama.units) == len(spec.layers) > len(ort.units)
    assert Choice.parse("q4_1") in llama.all_choices and Choice.parse("q4_1") not in ort.all_choices
    assert "dense+int4_g32" in llama.dropped
