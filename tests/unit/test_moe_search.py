"""MoE decision units and the search on a tiny Mixtral: one unit per block's routed experts
on vLLM, one per stacked expert tensor on llama.cpp, dense formats only for experts, and a
verified plan that records the calibration routing its predictions assumed."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import autoplan.search
from autoplan.cli import cli
from autoplan.cost.moe import Routing
from autoplan.modelspec import ModelSpec
from autoplan.plan.io import load_plan
from autoplan.search import SearchRequest, build_space
from autoplan.targets import get_target
from tests.unit._tiny import FAST, one_torch_thread  # noqa: F401
from tests.unit._tiny_moe import EXPERTS, save_tiny_moe, tiny_moe_config


def _spec(family: str) -> ModelSpec:
    return ModelSpec.from_config(tiny_moe_config(family).to_dict())


def test_vllm_runs_a_blocks_experts_as_one_unit_of_dense_formats() -> None:
    spec = _spec("mixtral")
    space = build_space(spec, get_target("h100"), "tensorrt-llm")
    experts = [u for u in space.units if u.layers[0].expert >= 0]
    assert [u.name for u in experts] == ["model.layers.0.mlp.experts",
                                         "model.layers.1.mlp.experts"]
    assert len(experts[0].layers) == EXPERTS * 3
    assert all(c.sparsity.kind == "dense" for u in experts for c in u.choices)
    attention = next(u for u in space.units if u.name == "model.layers.0.qkv")
    assert any(c.sparsity.kind != "dense" for c in attention.choices)  # 2:4 stays for GEMMs


def test_llamacpp_gives_each_stacked_expert_tensor_its_own_unit() -> None:
    spec = _spec("qwen3_moe")
    from autoplan.backends.registry import resolve_target

    space = build_space(spec, resolve_target("local"), "llama.cpp")
    names = {u.name for u in space.units if u.layers[0].expert >= 0}
    assert names == {f"model.layers.{b}.mlp.experts.{p}" for b in (0, 1)
                     for p in ("gate_proj", "up_proj", "down_proj")}
    gate = next(u for u in space.units if u.name == "model.layers.0.mlp.experts.gate_proj")
    assert len(gate.layers) == EXPERTS and {la.role for la in gate.layers} == {"expert_gate"}


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AUTOPLAN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(autoplan.search, "SearchRequest", functools.partial(SearchRequest, **FAST))
    return tmp_path


def test_search_on_a_tiny_mixtral_records_its_calibration_routing(cache: Path) -> None:
    folder = save_tiny_moe(cache / "model", "mixtral")
    out = cache / "plan.json"
    result = CliRunner().invoke(cli, ["search", "--model", str(folder), "--target", "h100",
                                      "--trials", "30", "--out", str(out), "--quiet",
                                      "--objective", "tpot", "--batch", "1"])
    assert result.exit_code == 0, result.output
    plan = load_plan(out)
    spec = ModelSpec.from_path(folder)
    routing = Routing.from_json(spec, plan.routing)
    assert routing.source.startswith("calibration routing")
    for block in spec.moe.moe_blocks:  # shares from the calibration pass: top_k per token
        assert sum(routing.shares[block]) == pytest.approx(spec.moe.top_k)
    for block in (0, 1):  # one choice for all of a block's experts
        group = {c for n, c in plan.decisions.items() if f"layers.{block}.mlp.experts." in n}
        assert len(group) == 1
    doc = json.loads(out.read_text())
    assert doc["routing"]["source"] == routing.source
    shown = CliRunner().invoke(cli, ["show", str(out)])
    assert shown.exit_code == 0, shown.output
    assert "decisions by part" in shown.output and "routed experts" in shown.output
    assert "active weights GB read per token" in shown.output
    for side in ("plan", "baseline"):  # a token reads top_k / E of the experts' bytes
        assert plan.predicted[side].active_weight_gb < plan.predicted[side].weight_gb


def test_vllm_cpu_keeps_routed_experts_bf16() -> None:
    """vLLM CPU 0.32 has no quantized fused-MoE kernel (its own errors are in the runtime
    matrix): the experts stay in floats while attention can be int8."""
    from autoplan.formats import Choice
    from autoplan.runtimes import supports

    spec = _spec("mixtral")
    xeon = get_target("xeon-8480")
    space = build_space(spec, xeon, "vllm")
    experts = [u for u in space.units if u.layers[0].expert >= 0]
    floats = {Choice.parse("fp32"), Choice.parse("bf16")}  # the CPU baseline and vLLM's dtype
    assert experts and all(set(u.choices) <= floats for u in experts)
    attention = next(u for u in space.units if u.name == "model.layers.0.qkv")
    assert Choice.parse("int8") in attention.choices
    verdict = supports(xeon, "vllm", Choice.parse("int8"), "routed_experts")
    assert not verdict.ok and "No Int8 MoE backend" in verdict.reason
