"""Export plumbing shared by every format: registry, refusals, atomic folders, audit.

Also holds the helpers the per-format export tests import: a tiny in-process Llama
(hidden 64, intermediate 128, 2 layers, vocab 128) saved with safetensors, and a Plan built
directly from autoplan.plan.schema with the fields an export reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from autoplan.compress import CompressionSettings, audit_digests, compressed_copy
from autoplan.errors import AutoplanError, UnknownNameError, UnsupportedFormatError, UserInputError
from autoplan.export import export_plan, exporter_names, get_exporter, register_exporter
from autoplan.atomic import atomic_dir
from autoplan.export._write import AUDIT_FILE, PLAN_FILE, is_export
from autoplan.formats import Choice
from autoplan.models import LoadedModel
from autoplan.models.hashing import weights_hash
from autoplan.modelspec import ModelSpec
from autoplan.plan.schema import (
    Audit, Budget, Compression, ModelRef, Plan, Quality, RuntimeRef, SearchMeta, TargetRef,
)

transformers = pytest.importorskip("transformers")
BASELINE = "dense+bf16"


def tiny_loaded(tmp_path: Path, *, tied: bool = False, hidden: int = 64,
                intermediate: int = 128) -> LoadedModel:
    """A tiny Llama saved as safetensors and loaded the way load_model returns it (hidden 64
    by default; formats with 128-wide blocks take hidden=256, intermediate=384)."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
        max_position_embeddings=64, tie_word_embeddings=tied)
    model = transformers.LlamaForCausalLM(cfg).eval()
    folder = tmp_path / "tiny-llama"
    model.save_pretrained(str(folder), safe_serialization=True)
    model = transformers.LlamaForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    spec = ModelSpec.from_config(model.config.to_dict(), name="tiny-llama")
    return LoadedModel(model, None, spec, "tiny-llama", weights_hash(folder), folder)


def calibration() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, 128, (2, 16), generator=gen) for _ in range(2)]


def layer_names(loaded: LoadedModel) -> list[str]:
    return [layer.name for layer in loaded.spec.layers]


def make_plan(loaded: LoadedModel, decisions: dict[str, str], *, target: str = "h100-sxm",
              runtime: str = "vllm", prune: str = "magnitude", quant: str = "rtn",
              stats=None) -> Plan:  # noqa: ANN001
    """A Plan with every required field, its audit computed like the search computes it."""
    choices = {n: Choice.parse(c) for n, c in decisions.items()}
    _, sims = compressed_copy(loaded.model, choices, stats, CompressionSettings(prune, quant))
    pred = dict(label="plan", tokens_per_s=1.0, ttft_s=1.0, tpot_s=1.0, request_latency_s=1.0,
                memory_gb=1.0, fits=True, energy_j_per_token=1.0, usd_per_1m_tokens=1.0,
                weight_gb=1.0)
    return Plan(
        autoplan_version="test", created="2026-01-01T00:00:00Z",
        model=ModelRef(id=loaded.model_id, content_hash=loaded.content_hash,
                       model_type="llama", n_layers=2, params=0),
        target=TargetRef(name=target, price_per_hour=1.0, price_source="test"),
        runtime=RuntimeRef(name=runtime, version="test"),
        workload={"batch": 1, "input_len": 16, "output_len": 16}, objective="tokens_per_s",
        budget=Budget(text="kl<=1", metric="kl", limit=1.0),
        compression=Compression(prune_score=prune, quant_method=quant),
        decisions=decisions, predicted={"plan": pred},
        quality=Quality(kl=0.0, ppl=1.0, ppl_ref=1.0, surrogate_kl=0.0, budget_met=True,
                        eval_tokens=1),
        search=SearchMeta(sampler="test", seed=0, trials=0, wall_time_s=0.0, study="t",
                          storage="none", real_evaluations=0, outcome="plan"),
        audit=Audit(calibration_source="random tokens", calibration_hash="0" * 64,
                    tensors=audit_digests(sims)))


def uniform(loaded: LoadedModel, choice: str) -> dict[str, str]:
    """``choice`` for every block linear, the 16-bit baseline for lm_head."""
    return {n: (BASELINE if n == "lm_head" else choice) for n in layer_names(loaded)}


@pytest.fixture()
def loaded(tmp_path):
    return tiny_loaded(tmp_path)


def test_registry_lists_builtins_and_refuses_duplicates():
    assert {"compressed-tensors", "gguf", "modelopt", "onnx"} <= set(exporter_names())
    with pytest.raises(AutoplanError, match="registered twice"):
        register_exporter(get_exporter("modelopt"))
    with pytest.raises(UnknownNameError, match="compressed-tensors, gguf, modelopt, onnx"):
        get_exporter("tflite")


def test_two_four_plan_to_vllm_names_the_layers(loaded, tmp_path):
    decisions = uniform(loaded, "dense+fp8_e4m3")
    decisions["model.layers.1.mlp.down_proj"] = "2:4+fp8_e4m3"
    plan = make_plan(loaded, decisions)
    with pytest.raises(UnsupportedFormatError) as err:
        export_plan(plan, loaded, "compressed-tensors", tmp_path / "out")
    msg = str(err.value)
    assert "model.layers.1.mlp.down_proj" in msg and "vllm" in msg and "\n" not in msg
    assert not (tmp_path / "out").exists()


def test_wrong_model_hash_refused_unless_overridden(loaded, tmp_path):
    plan = make_plan(loaded, uniform(loaded, "dense+fp8_e4m3"))
    plan = plan.model_copy(update={"model": plan.model.model_copy(
        update={"content_hash": "f" * 64})})
    with pytest.raises(UserInputError, match="--allow-model-mismatch"):
        export_plan(plan, loaded, "compressed-tensors", tmp_path / "out")
    out = export_plan(plan, loaded, "compressed-tensors", tmp_path / "out",
                      allow_model_mismatch=True)
    assert (out / "config.json").is_file()


def test_unfused_qkv_refused(loaded, tmp_path):
    decisions = uniform(loaded, "dense+fp8_e4m3")
    decisions["model.layers.0.self_attn.k_proj"] = "dense+int8"
    with pytest.raises(UnsupportedFormatError, match="fused GEMM"):
        export_plan(make_plan(loaded, decisions), loaded, "compressed-tensors", tmp_path / "o")


def test_audit_mismatch_refused(loaded, tmp_path):
    plan = make_plan(loaded, uniform(loaded, "dense+int4_g32"))
    tensors = dict(plan.audit.tensors)
    first = sorted(tensors)[0]
    tensors[first] = {**tensors[first], "weight_scale": "0" * 64}
    plan = plan.model_copy(update={"audit": plan.audit.model_copy(update={"tensors": tensors})})
    with pytest.raises(UserInputError, match=first.replace(".", r"\.")):
        export_plan(plan, loaded, "compressed-tensors", tmp_path / "out")


def test_gptq_plan_needs_calibration(loaded, tmp_path):
    decisions = uniform(loaded, "dense+int8_wo")
    plan = make_plan(loaded, decisions).model_copy(update={"compression": Compression(
        prune_score="magnitude", quant_method="gptq")})
    with pytest.raises(UserInputError, match="calibration"):
        export_plan(plan, loaded, "compressed-tensors", tmp_path / "out")


def test_a_format_with_calibrated_inputs_needs_the_calibration_set(loaded, tmp_path):
    """NVFP4's FormatSpec has an input_calibration (its static input global scale): the
    export needs the calibration tokens for those layers only, and says so before writing."""
    from autoplan.export._prepare import needs_calibration

    name = "model.layers.0.mlp.down_proj"
    plan = make_plan(loaded, {name: "dense+nvfp4"}, target="b200")
    assert needs_calibration(plan)
    assert not needs_calibration(make_plan(loaded, {name: "dense+int8"}))
    with pytest.raises(UserInputError, match=rf"NVFP4 layers \({name}\) need a static activation "
                       "scale from calibration data"):
        export_plan(plan, loaded, "compressed-tensors", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_atomic_dir_keeps_old_export_on_failure(tmp_path):
    target = tmp_path / "exp"
    with atomic_dir(target, is_ours=is_export) as tmp:
        (tmp / AUDIT_FILE).write_text("{}")
        (tmp / "a").write_text("old")
    with pytest.raises(RuntimeError), atomic_dir(target, is_ours=is_export) as tmp:
        (tmp / "a").write_text("half")
        raise RuntimeError("crash")
    assert (target / "a").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["exp"]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x").write_text("user data")
    with pytest.raises(UserInputError, match="not an autoplan export"), \
            atomic_dir(tmp_path / "other", is_ours=is_export):
        pass


def test_sidecars_hold_plan_and_tensor_digests(loaded, tmp_path):
    plan = make_plan(loaded, uniform(loaded, "dense+int8"))
    out = export_plan(plan, loaded, "compressed-tensors", tmp_path / "out")
    assert Plan.model_validate_json((out / PLAN_FILE).read_text()) == plan
    audit = json.loads((out / AUDIT_FILE).read_text())
    digests = audit["tensors"]["model.safetensors"]
    assert "model.layers.0.mlp.up_proj.weight_scale" in digests
    assert audit["layers"]["lm_head"] == BASELINE and audit["runtime"] == "vllm"


def _save_tokenizer(folder: Path) -> None:
    """A word-level tokenizer built in process (no hub), so load_model accepts the folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, 128)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]") \
        .save_pretrained(str(folder))


def test_cli_export_and_refusal_exit_codes(loaded, tmp_path):
    from click.testing import CliRunner

    from autoplan.cli import cli
    from autoplan.plan.io import save_plan

    _save_tokenizer(loaded.path)
    plan_file = tmp_path / "plan.json"
    save_plan(make_plan(loaded, uniform(loaded, "dense+fp8_e4m3")), plan_file)
    runner = CliRunner()
    args = ["export", str(plan_file), "--model", str(loaded.path), "--out"]
    ok = runner.invoke(cli, [*args, str(tmp_path / "ct"), "--format", "compressed-tensors"])
    assert ok.exit_code == 0, ok.output
    assert (tmp_path / "ct" / "tokenizer.json").is_file()
    bad = runner.invoke(cli, [*args, str(tmp_path / "x"), "--format", "tflite"])
    assert bad.exit_code == 2 and "compressed-tensors, gguf, modelopt, onnx" in bad.output
    decisions = uniform(loaded, "2:4+fp8_e4m3")
    save_plan(make_plan(loaded, decisions), plan_file)
    refused = runner.invoke(cli, [*args, str(tmp_path / "y"), "--format", "compressed-tensors"])
    assert refused.exit_code == 2 and "model.layers.0.mlp.down_proj" in refused.output
    assert not (tmp_path / "y").exists()


def test_onnx_format_dispatches_to_cpu_backend(loaded, tmp_path):
    pytest.importorskip("onnx")
    decisions = {n: ("dense+fp32" if n == "lm_head" else "dense+int8a8_g128")
                 for n in layer_names(loaded)}
    plan = make_plan(loaded, decisions, target="xeon-8480", runtime="onnxruntime")
    out = export_plan(plan, loaded, "onnx", tmp_path / "cpu")
    names = {p.name for p in out.iterdir()}
    assert {"model.onnx", "manifest.json", PLAN_FILE, AUDIT_FILE} <= names
    gpu_plan = make_plan(loaded, decisions)  # h100 + vllm: onnxruntime does not run there
    with pytest.raises(UnsupportedFormatError, match="onnxruntime"):
        export_plan(gpu_plan, loaded, "onnx", tmp_path / "gpu")
