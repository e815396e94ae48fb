"""The models users bring, through every command: a tiny random Qwen3, Gemma 2, Gemma 3 and
Phi-3 (tests/unit/_tiny_archs.py, saved as safetensors folders) run profile -> search (an H100
plan for vLLM and a Xeon plan for ONNX Runtime) -> apply (the H100 plan as a compressed-
tensors checkpoint, the Xeon plan as autoplan's ONNX export) -> bench (ONNX Runtime
generation, baseline and plan side by side).

The ONNX artifact is then held to the numerics contract of tests/unit/test_onnx_export.py:
its logits, prefill and decode, equal transformers' fp32 forward of the same compressed
model (the artifact's weights dequantized back into it) to 1e-4. The Xeon search offers the
W4A16 formats ONNX Runtime runs exactly (MatMulNBits at accuracy_level 0) so the comparison
is on whole logits; the int8-activation formats are checked node by node, per format, in
test_onnx_export.py.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from autoplan.backends.cpu.ort_quant import dequantized_weights, records_from_manifest
from click.testing import CliRunner, Result

import autoplan.search
from autoplan.cli import cli
from autoplan.modelspec import ModelSpec
from autoplan.plan.io import load_plan
from autoplan.search import SearchRequest
from tests.unit._tiny import FAST, one_torch_thread  # noqa: F401
from tests.unit._tiny_archs import ARCHS, save_tiny_arch, tiny_arch_model

CPU_CHOICES = "dense+int4_g32,dense+int4_g64,dense+uint4_g32"
TOL_EXACT = 1e-4


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("autoplan-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUTOPLAN_CACHE", str(root))
        # the CLI has no data-size options: small calibration/evaluation blocks keep it fast
        mp.setattr(autoplan.search, "SearchRequest", functools.partial(SearchRequest, **FAST))
        yield root


@pytest.fixture(scope="module", params=ARCHS)
def arch(request, cache: Path, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN001, ANN201
    root = tmp_path_factory.mktemp(request.param)
    return request.param, save_tiny_arch(root / "model", request.param), root


def _ok(args: list[str]) -> Result:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, (args, result.output)
    assert "Traceback" not in result.output
    return result


def _check_compressed(plan, baseline: str) -> None:  # noqa: ANN001
    # a uniform recipe is a compressed answer too (the calibrated rounds return one when no
    # mix beats it: Gemma 2 and 3 on the CPU choices)
    assert plan.search.outcome in ("plan", "uniform-fallback"), plan.search.why
    assert plan.quality.budget_met
    if plan.search.outcome == "plan":
        assert any(v.passed for r in plan.search.rounds for v in r.verified)
    assert any(c != baseline for c in plan.decisions.values())
    assert plan.predicted["plan"].weight_gb < plan.predicted["baseline"].weight_gb


def test_profile_lists_the_architectures_own_layers(arch) -> None:
    name, folder, _ = arch
    doc = json.loads(_ok(["profile", "--model", str(folder), "--target", "h100", "--seq-len",
                          "32", "--calib-blocks", "2", "--json"]).stdout)
    spec = ModelSpec.from_path(folder)
    assert set(doc["layers"]) == {la.name for la in spec.layers if la.role != "lm_head"}
    if name == "phi3":  # one weight, one decision
        assert "model.layers.0.self_attn.qkv_proj" in doc["layers"]
        assert "model.layers.0.mlp.gate_up_proj" in doc["layers"]
    assert all(v >= 0 for scores in doc["layers"].values() for v in scores.values())


def test_gpu_plan_applies_as_compressed_tensors(arch) -> None:
    _, folder, root = arch
    out = root / "gpu.json"
    # every predicted gain counts (--min-gain 0): a tiny model's are within the target's
    # stated speed uncertainty, where the search keeps the model as it is
    _ok(["search", "--model", str(folder), "--target", "h100", "--trials", "40", "--out",
         str(out), "--quiet", "--objective", "tpot", "--batch", "1", "--min-gain", "0"])
    plan = load_plan(out)
    assert plan.runtime.name == "vllm"
    _check_compressed(plan, "dense+bf16")
    _ok(["apply", str(out), "--model", str(folder), "--out", str(root / "ct")])
    from safetensors import safe_open

    config = json.loads((root / "ct" / "config.json").read_text())
    groups = config["quantization_config"]["config_groups"]
    planned = {n for n, c in plan.decisions.items() if c != "dense+bf16"}
    # each compressed layer is one target holding its own scales: Phi-3's qkv_proj and
    # gate_up_proj whole, as vLLM loads them
    assert {t for g in groups.values() for t in g["targets"]} == planned
    keys = {k for f in (root / "ct").glob("*.safetensors") for k in safe_open(f, "pt").keys()}
    assert all(f"{n}.weight_scale" in keys for n in planned)


def test_cpu_plan_applies_benches_and_matches_transformers(arch) -> None:
    name, folder, root = arch
    out, art = root / "cpu.json", root / "onnx"
    _ok(["search", "--model", str(folder), "--target", "xeon-8480", "--runtime", "onnxruntime",
         "--trials", "40", "--choices", CPU_CHOICES, "--out", str(out), "--quiet",
         "--min-gain", "0"])
    plan = load_plan(out)
    assert plan.runtime.name == "onnxruntime"
    _check_compressed(plan, "dense+fp32")
    _ok(["apply", str(out), "--model", str(folder), "--out", str(art)])
    manifest = json.loads((art / "manifest.json").read_text())
    compressed = {n: c for n, c in plan.decisions.items() if c != "dense+fp32"}
    assert {n: manifest["layers"][n]["choice"] for n in compressed} == compressed
    assert all(manifest["layers"][n]["op_type"] == "MatMulNBits" for n in compressed)

    bench = json.loads(_ok(["bench", "--model", str(folder), "--artifact", str(art),
                            "--requests", "2", "--input-len", "8", "--output-len", "4",
                            "--threads", "1", "--no-torch", "--json"]).stdout)
    assert [s["name"] for s in bench["sides"]] == ["baseline", "plan"]
    assert all(s["decode_tok_s"] > 0 and s["requests"] == 2 for s in bench["sides"])

    _check_artifact_numerics(name, art, manifest)


def _check_artifact_numerics(name: str, art: Path, manifest: dict) -> None:
    """ORT on the artifact vs transformers on the model holding the artifact's weights."""
    import onnx

    proto = onnx.load(str(art / "model.onnx"))
    weights = dequantized_weights(proto, records_from_manifest(manifest))
    model = tiny_arch_model(name)  # the folder's model (same seed)
    for layer, w in weights.items():
        module = model.get_submodule(layer)
        module.weight = torch.nn.Parameter(torch.from_numpy(w.T.copy()))  # unties lm_head too
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    ids = torch.randint(0, cfg.vocab_size, (1, 11), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = model(ids).logits.numpy()
    sess = ort.InferenceSession(str(art / "model.onnx"), providers=["CPUExecutionProvider"])
    empty = np.zeros((1, cfg.num_key_value_heads, 0, head_dim), np.float32)
    feeds = {"input_ids": ids.numpy(), "attention_mask": np.ones((1, 11), np.int64),
             "position_ids": np.arange(11)[None], "logits_to_keep": np.array([11], np.int64)}
    feeds.update({f"past_key_values.{i}.{kind}": empty for i in range(cfg.num_hidden_layers)
                  for kind in ("key", "value")})
    out = sess.run(None, feeds)
    np.testing.assert_allclose(out[0], want, atol=TOL_EXACT)
    # one more token through the cache the prefill returned
    past = dict(zip([o.name for o in sess.get_outputs()][1:], out[1:], strict=True))
    step = {"input_ids": np.array([[7]]), "attention_mask": np.ones((1, 12), np.int64),
            "position_ids": np.array([[11]]), "logits_to_keep": np.array([1], np.int64)}
    step.update({k.replace("present", "past_key_values"): v for k, v in past.items()})
    with torch.no_grad():
        want_next = model(torch.cat([ids, torch.tensor([[7]])], 1)).logits[:, -1:].numpy()
    np.testing.assert_allclose(sess.run(None, step)[0], want_next, atol=TOL_EXACT)
