"""The plan's KV cache in exports: compressed-tensors `kv_cache_scheme` with the calibrated
K/V scales (per tensor or per KV head), ModelOpt `kv_cache_quant_algo` with its scales,
the deploy command beside every artifact, and refusals instead of placeholder scales."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from autoplan.deploy import deploy_for
from autoplan.errors import UnsupportedFormatError, UserInputError
from autoplan.export import export_plan
from autoplan.export.kv import DEPLOY_JSON, DEPLOY_SH, scale_digest
from autoplan.formats.kv import KvFormat
from autoplan.plan import schema as ps
from autoplan.quant.kv_cache import calibrate_kv
from autoplan.runtimes import kv_supports
from autoplan.targets import get_target
from tests.unit.test_export_common import calibration, make_plan, tiny_loaded, uniform

pytest.importorskip("compressed_tensors")


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    return tiny_loaded(tmp_path_factory.mktemp("model"))


def _with_kv(plan: ps.Plan, loaded, fmt: KvFormat, *, digests: bool = True) -> ps.Plan:  # noqa: ANN001
    """The plan with a KV cache as the search writes it (scales from the calibration)."""
    target = get_target(plan.target.name)
    rule = kv_supports(target, plan.runtime.name, fmt).rule
    amax = calibrate_kv(loaded.model, calibration())
    found = {str(i): scale_digest(*a.scales(fmt)) for i, a in amax.items()}
    kv = ps.KvCache(format=fmt.value, default="bf16", flag=rule.flag, scales=rule.scales,
                    query=rule.query or None, bytes_per_token=1.0, bytes_per_sequence=1.0,
                    scale_digests=found if digests else {})
    d = deploy_for(plan.runtime.name, target, kv=fmt, batch=8, input_len=32, output_len=8)
    return plan.model_copy(update={"kv_cache": kv, "deploy": ps.Deploy(**d.to_json())})


def test_compressed_tensors_writes_the_calibrated_per_tensor_scales(loaded, tmp_path: Path) -> None:  # noqa: ANN001
    plan = _with_kv(make_plan(loaded, uniform(loaded, "fp8_e4m3")), loaded, KvFormat.FP8_E4M3)
    out = export_plan(plan, loaded, "compressed-tensors", tmp_path / "ct",
                      calibration=calibration())
    config = json.loads((out / "config.json").read_text())
    scheme = config["quantization_config"]["kv_cache_scheme"]
    assert scheme["type"] == "float" and scheme["num_bits"] == 8 and scheme["strategy"] == "tensor"
    tensors = load_file(str(out / "model.safetensors"))
    amax = calibrate_kv(loaded.model, calibration())
    for i, a in amax.items():
        k, v = a.scales(KvFormat.FP8_E4M3)
        assert torch.equal(tensors[f"model.layers.{i}.self_attn.k_scale"].float().reshape(-1), k)
        assert torch.equal(tensors[f"model.layers.{i}.self_attn.v_scale"].float().reshape(-1), v)
        assert float(k) == pytest.approx(float(a.k_head.amax()) / 448)
    deploy = json.loads((out / DEPLOY_JSON).read_text())
    assert deploy["command"][:3] == ["vllm", "serve", str(out)]
    assert "--kv-cache-dtype" in deploy["command"]
    assert (out / DEPLOY_SH).read_text().startswith("#!/bin/sh")


def test_per_head_scales_and_a_kv_only_plan(loaded, tmp_path: Path) -> None:  # noqa: ANN001
    plan = _with_kv(make_plan(loaded, uniform(loaded, "bf16")), loaded, KvFormat.FP8_E4M3_HEAD)
    out = export_plan(plan, loaded, "compressed-tensors", tmp_path / "ct",
                      calibration=calibration())
    scheme = json.loads((out / "config.json").read_text())["quantization_config"]
    assert scheme["kv_cache_scheme"]["strategy"] == "attn_head"
    k = load_file(str(out / "model.safetensors"))["model.layers.0.self_attn.k_scale"]
    assert k.numel() == 2  # one per KV head


def test_modelopt_writes_kv_cache_quant_algo_and_scales(loaded, tmp_path: Path) -> None:  # noqa: ANN001
    plan = make_plan(loaded, uniform(loaded, "fp8_e4m3"), runtime="tensorrt-llm")
    plan = _with_kv(plan, loaded, KvFormat.FP8_E4M3)
    out = export_plan(plan, loaded, "modelopt", tmp_path / "mo", calibration=calibration())
    quant = json.loads((out / "hf_quant_config.json").read_text())["quantization"]
    assert quant["kv_cache_quant_algo"] == "FP8"
    tensors = load_file(str(out / "model.safetensors"))
    assert "model.layers.1.self_attn.k_proj.k_scale" in tensors
    assert (out / "llm_options.yml").read_text().startswith("kv_cache_config:")


def test_an_export_for_another_engine_ships_that_engines_command(loaded, tmp_path: Path) -> None:  # noqa: ANN001, E501
    """A vLLM plan exported as ModelOpt is served by TensorRT-LLM: the deploy command beside
    it is trtllm-serve at the plan's batch and context, not the plan's `vllm serve`."""
    plan = _with_kv(make_plan(loaded, uniform(loaded, "fp8_e4m3")), loaded, KvFormat.FP8_E4M3)
    assert plan.deploy.runtime == "vllm"
    out = export_plan(plan, loaded, "modelopt", tmp_path / "mo", calibration=calibration())
    deploy = json.loads((out / DEPLOY_JSON).read_text())
    assert deploy["runtime"] == "tensorrt-llm"
    assert deploy["command"][:2] == ["trtllm-serve", str(out)]
    assert deploy["settings"]["batch"] == 8 and deploy["settings"]["max_model_len"] == 40
    script = (out / DEPLOY_SH).read_text()
    assert "# tensorrt-llm: batch 8" in script and "vllm" not in script


@pytest.mark.parametrize(("case", "needle"), [
    ("no digests", "placeholder"), ("no calibration", "calibration set"),
    ("other calibration", "differ from the plan's")])
def test_uncalibrated_scales_are_refused_and_nothing_is_written(
        loaded, tmp_path: Path, case: str, needle: str) -> None:  # noqa: ANN001
    plan = _with_kv(make_plan(loaded, uniform(loaded, "fp8_e4m3")), loaded, KvFormat.FP8_E4M3,
                    digests=case != "no digests")
    calib = {"no calibration": None,
             "other calibration": [torch.randint(0, 128, (2, 16))]}.get(case, calibration())
    with pytest.raises(UserInputError, match=needle):
        export_plan(plan, loaded, "compressed-tensors", tmp_path / "ct", calibration=calib)
    assert not (tmp_path / "ct").exists()


def test_a_cache_the_format_cannot_hold_is_refused(loaded, tmp_path: Path) -> None:  # noqa: ANN001
    plan = make_plan(loaded, uniform(loaded, "fp8_e4m3"), runtime="tensorrt-llm")
    plan = _with_kv(plan, loaded, KvFormat.INT8)
    with pytest.raises(UnsupportedFormatError, match="cannot store the plan's int8"):
        export_plan(plan, loaded, "compressed-tensors", tmp_path / "ct",
                    calibration=calibration())
