"""Bench library and the apply/bench/fleet commands' input checks, on a tiny in-process Llama."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from autoplan.backends.cpu.ort_runtime import GenerationResult
from click.testing import CliRunner

from autoplan.backends.cpu.onnx_export import CpuArtifact
from autoplan.bench import ort_side, run_bench, torch_side
from autoplan.bench.report import summarize
from autoplan.cli import cli
from autoplan.errors import PlanError, UnsupportedFormatError, UserInputError
from autoplan.formats import Choice
from autoplan.export import apply as apply_mod
from autoplan.modelspec import ModelSpec
from autoplan.plan import read_plan

check_cpu_plan = apply_mod.apply_format  # `apply` refuses by the default format's runtime


def apply_plan_cpu(loaded, plan, out, **kw):  # noqa: ANN001, ANN003, ANN201
    """`autoplan apply` on a CPU target: the ONNX artifact (export's default format)."""
    return CpuArtifact.load(apply_mod.apply_plan(loaded, plan, out, **kw))


def export_baseline(loaded, out):  # noqa: ANN001, ANN201
    return CpuArtifact.load(apply_mod.export_baseline(loaded, out))

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def loaded():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256, max_position_embeddings=256)
    model = transformers.LlamaForCausalLM(cfg).eval()
    spec = ModelSpec.from_config(cfg.to_dict(), name="tiny")
    return SimpleNamespace(model=model, tokenizer=None, spec=spec, content_hash="abc123")


def _write(tmp_path, doc, name="plan.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def test_read_minimal_and_bare_plans(tmp_path):
    minimal = read_plan(_write(tmp_path, {"decisions": {"lm_head": "int4_g32"}, "target": "local"}))
    assert minimal.decisions == {"lm_head": Choice.parse("int4_g32")} and minimal.target == "local"
    bare = read_plan(_write(tmp_path, {"lm_head": "dense+int8"}, "bare.json"))
    assert bare.decisions["lm_head"] == Choice.parse("int8") and bare.target is None
    with pytest.raises(PlanError, match="no decisions"):
        read_plan(_write(tmp_path, {"decisions": {}}, "empty.json"))
    with pytest.raises(PlanError, match="no plan file"):
        read_plan(tmp_path / "missing.json")


def test_check_cpu_plan_refuses_gpu_targets_and_formats(tmp_path):
    gpu = read_plan(_write(tmp_path, {"decisions": {"lm_head": "int8"}, "target": "h100"}))
    with pytest.raises(UnsupportedFormatError, match="h100.*re-plan"):
        check_cpu_plan(gpu)
    bad = read_plan(_write(tmp_path, {"decisions": {"lm_head": "nvfp4",
                                                    "model.layers.0.mlp.up_proj": "2:4+int8"}}))
    with pytest.raises(UnsupportedFormatError, match="2 planned layer.*dense\\+nvfp4.*lm_head"):
        check_cpu_plan(bad)


@pytest.mark.parametrize("choice", ["int8", "int8_wo", "unstructured@50+int8a8_g128"])
def test_apply_refuses_what_search_refuses(tmp_path, choice):
    """The named bug: ORT can hold dense int8 and int8_wo, but runtimes.toml (what search
    plans with) refuses them on onnxruntime, so apply refuses them too, with the matrix's
    reason; channel pruning and the a8 / uint4 formats pass."""
    from autoplan.runtimes import supports
    from autoplan.targets import get_target

    why = supports(get_target("local"), "onnxruntime", Choice.parse(choice))
    assert not why.ok
    plan = read_plan(_write(tmp_path, {"decisions": {"lm_head": choice}}))
    with pytest.raises(UnsupportedFormatError) as err:
        check_cpu_plan(plan)
    assert why.reason in str(err.value) and "\n" not in str(err.value)
    check_cpu_plan(read_plan(_write(tmp_path, {"decisions": {
        "lm_head": "int8a8_g128", "model.layers.0.mlp.up_proj": "uint4a8_g32",
        "model.layers.0.mlp.down_proj": "channel@25+int4a8_g64"}}, "ok.json")))


def test_apply_cli_refuses_with_exit_2_and_one_line(tmp_path):
    plan = _write(tmp_path, {"decisions": {"lm_head": "fp8_e4m3"}})
    result = CliRunner().invoke(cli, ["apply", str(plan), "--model", "x", "--out",
                                      str(tmp_path / "o")])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0
    assert "dense+fp8_e4m3" in result.output and "lm_head" in result.output


def test_apply_plan_cpu_writes_plan_and_audit(loaded, tmp_path):
    names = [layer.name for layer in loaded.spec.layers]
    doc = {"decisions": {n: ("int8a8_g128" if "mlp" in n else "uint4a8_g32") for n in names}}
    plan = read_plan(_write(tmp_path, doc))
    art = apply_plan_cpu(loaded, plan, tmp_path / "art")
    assert json.loads((tmp_path / "art" / "plan.json").read_text()) == doc
    layers = art.manifest["layers"].values()
    assert {(layer["op_type"], layer["accuracy_level"]) for layer in layers} == {("MatMulNBits", 4)}
    assert {"weight", "scale", "zero_point"} == set(art.manifest["layers"]["lm_head"]["tensors"])
    assert art.manifest["streamed_weight_bytes"] < art.manifest["weight_bytes"]
    with pytest.raises(PlanError, match="lacks"):
        apply_plan_cpu(loaded, read_plan(_write(tmp_path, {"decisions": {"nope": "int8a8_g128"}},
                                                "x.json")), tmp_path / "x")


def test_channel_pruned_plan_with_magnitude_masks_is_baked_in(loaded, tmp_path):
    name = "model.layers.1.mlp.down_proj"
    plan = read_plan(_write(tmp_path, {"decisions": {name: "channel@50+int8a8_g128"}}))
    art = apply_plan_cpu(loaded, plan, tmp_path / "sparse")
    assert art.manifest["layers"][name]["choice"] == "channel@50+int8a8_g128"


def test_run_bench_interleaves_and_reports(loaded, tmp_path):
    base = export_baseline(loaded, tmp_path / "base")
    plan = read_plan(_write(tmp_path, {"decisions": {"lm_head": "int4_g32"}}))
    sides = [ort_side("baseline", base, threads=1),
             ort_side("plan", apply_plan_cpu(loaded, plan, tmp_path / "plan"), threads=1),
             torch_side(loaded.model, threads=1)]
    report = run_bench(sides, requests=4, concurrency=2, input_len=5, output_len=3,
                       vocab=256, bandwidth=1e10, threads=1)
    doc = report.to_json()
    assert [s["name"] for s in doc["sides"]] == ["baseline", "plan", "pytorch-eager-fp32"]
    assert all(s["requests"] == 4 and s["decode_tok_s"] > 0 for s in doc["sides"])
    assert set(doc["ratios_vs_baseline"]) == {"plan", "pytorch-eager-fp32"}
    assert doc["predicted"] is None and doc["peak_rss_mb"] > 0
    assert 0 < doc["sides"][0]["roofline_fraction"]
    # A bandwidth probe is sampled once per batch round and its median is the denominator.
    probes = iter([1e10, 3e10])
    sampled = run_bench(sides[:1], requests=4, concurrency=2, input_len=5, output_len=3,
                        vocab=256, bandwidth=lambda: next(probes), threads=1)
    assert sampled.bandwidth_samples_gbps == [10.0, 30.0] and sampled.bandwidth_gbps == 20.0
    with pytest.raises(UserInputError, match="multiple of --concurrency"):
        run_bench(sides[:1], requests=3, concurrency=2, input_len=4, output_len=2, vocab=256)


def test_summarize_percentiles_weight_requests_by_batch():
    results = [GenerationResult(np.zeros((2, 3), np.int64), 10, 0.1, [0.01, 0.01]),
               GenerationResult(np.zeros((2, 3), np.int64), 10, 0.3, [0.03, 0.03])]
    stats = summarize("x", "onnxruntime", results, rss_load=0)
    assert stats.requests == 4
    assert stats.ttft_ms["p50"] == pytest.approx(200.0)  # [100, 100, 300, 300]
    assert stats.decode_tok_s == pytest.approx(np.median([2 * 2 / 0.02, 2 * 2 / 0.06]))
    assert stats.prefill_tok_s == pytest.approx(np.median([200, 2 * 10 / 0.3]))


def test_fleet_cli_shows_arithmetic_json(tmp_path):
    # a format ONNX Runtime runs as verified on a Xeon (plain int8 is refused there)
    plan = _write(tmp_path, {"decisions": {"lm_head": "int8a8_g128"}})
    result = CliRunner().invoke(cli, ["fleet", "--plan", str(plan), "--model", "smollm2-135m",
                                      "--node", "xeon-8480", "--qps", "20", "--p99-ms", "3000",
                                      "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["plan"]["nodes"] >= 1
    assert doc["baseline"]["steps"][0]["label"] == "memory per replica"


def test_full_gptq_plan_exports_the_plans_own_codes(tmp_path):
    """A full plan goes through autoplan.export's prepare (audit-checked); the ONNX weights
    are the plan's GPTQ weights exactly, not a second round-to-nearest."""
    import onnx
    from autoplan.backends.cpu.ort_quant import dequantized_weights, records_from_manifest

    from autoplan.compress import CompressionSettings, collect_stats, compressed_copy
    from autoplan.plan import save_plan
    from tests.unit.test_export_common import calibration, layer_names, make_plan, tiny_loaded

    loaded, calib = tiny_loaded(tmp_path), calibration()
    decisions = {n: "int4_g32" for n in layer_names(loaded)}
    stats = collect_stats(loaded.model, decisions, calib)
    plan = make_plan(loaded, decisions, target="xeon-8480", runtime="onnxruntime",
                     quant="gptq", stats=stats)
    save_plan(plan, tmp_path / "full.json")
    art = apply_plan_cpu(loaded, read_plan(tmp_path / "full.json"), tmp_path / "art",
                         calibration=calib)
    proto = onnx.load(str(art.model_path))
    got = dequantized_weights(proto, records_from_manifest(art.manifest))
    choices = {n: Choice.parse(c) for n, c in decisions.items()}
    _, sims = compressed_copy(loaded.model, choices, stats, CompressionSettings("magnitude", "gptq"))
    for name, sim in sims.items():
        np.testing.assert_array_equal(got[name], sim.weight.numpy().T)


def test_prediction_block_sets_predicted_measured_and_ratio(loaded, tmp_path):
    from autoplan.backends.cpu.predict import artifact_decisions, predict_side, prediction_block
    from autoplan.cost import CostModel
    from autoplan.targets import get_target
    from autoplan.workload import Workload

    target = get_target("xeon-8480")  # a catalog CPU: no probe in unit tests
    workload = {"requests": 2, "concurrency": 1, "input_len": 8, "output_len": 4}
    plan_art = apply_plan_cpu(loaded, read_plan(_write(tmp_path, {"decisions": {
        "lm_head": "int4_g32"}})), tmp_path / "plan")
    decisions = {"baseline": {}, "plan": artifact_decisions(plan_art)}
    assert str(decisions["plan"]["lm_head"]) == "dense+int4_g32"
    measured = {n: SimpleNamespace(decode_tok_s=100.0, ttft_ms={"p50": 10.0},
                                   tpot_ms={"p50": 10.0}) for n in decisions}
    block = prediction_block(loaded.spec, target, workload, decisions, measured)
    base = block["sides"]["baseline"]
    assert base["predicted_over_measured"]["decode_tok_s"] == pytest.approx(
        base["predicted"]["decode_tok_s"] / 100.0)
    # The baseline is fp32 on every layer (lm_head included), not the target's default.
    fp32 = {layer.name: Choice.parse("fp32") for layer in loaded.spec.layers}
    direct = CostModel(loaded.spec, target, Workload(batch=1, input_len=8, output_len=4))
    assert base["predicted"]["decode_tok_s"] == pytest.approx(
        direct.evaluate(fp32).metrics.decode_tokens_per_s)
    plan = predict_side(loaded.spec, target, workload, decisions["plan"])
    assert plan["decode_tok_s"] > base["predicted"]["decode_tok_s"]  # int4 lm_head streams less


def test_artifacts_of_an_older_manifest_are_refused(loaded, tmp_path):
    import json

    from autoplan.backends.cpu.onnx_export import MANIFEST, CpuArtifact

    art = export_baseline(loaded, tmp_path / "base")
    doc = json.loads((art.path / MANIFEST).read_text())
    doc["schema_version"] = 1  # one artifact-wide accuracy_level: formats do not say it
    (art.path / MANIFEST).write_text(json.dumps(doc))
    with pytest.raises(UserInputError, match="re-run `autoplan apply`"):
        CpuArtifact.load(art.path)


def test_search_kernel_table_times_the_non_gemm_step_at_batch_1(loaded, monkeypatch):
    """Batch 1: the fp32 export of the model is made and its decode step without linear layers
    timed (the rows themselves are stubbed: timing them is test_ort_microbench's job)."""
    from autoplan.backends.cpu import ort_microbench as OM

    from autoplan.backends.cpu.predict import search_kernel_table
    from autoplan.search import build_space
    from autoplan.targets import get_target
    from autoplan.workload import Workload

    seen = {}
    monkeypatch.setattr(OM, "measure_rows", lambda rows, threads=None, **kw: seen.update(
        rows=rows, **kw) or {"rows": [], "includes_dispatch": True})
    timed = {}

    def fake_non_gemm(path, context, threads=None, **kw):
        timed.update(path=path, context=context, **kw)
        return 0.0042

    monkeypatch.setattr(OM, "non_gemm_decode_seconds", fake_non_gemm)
    space = build_space(loaded.spec, get_target("xeon-8480"), "onnxruntime",
                        candidates=[Choice.parse("int8a8_g128")])
    table = search_kernel_table(loaded, space, Workload(batch=1, input_len=16, output_len=8),
                                spinning=False)
    assert table["non_gemm_decode_s"] == 0.0042
    assert timed["context"] == 16 + 8 // 2 and timed["spinning"] is False
    assert timed["path"].name == "model.onnx"  # a real fp32 export was written
    assert seen["spinning"] is False and seen["rows"]


def test_bench_no_spin_reaches_every_ort_session(loaded, tmp_path, monkeypatch):
    from autoplan.bench import runner

    spins = []
    real = runner.OrtGenerator

    def spy(path, threads=None, spinning=True, shared=None):
        spins.append(spinning)
        return real(path, threads=threads, spinning=spinning, shared=shared)

    monkeypatch.setattr(runner, "OrtGenerator", spy)
    base = export_baseline(loaded, tmp_path / "base")
    ort_side("baseline", base, threads=1, spinning=False)
    ort_side("again", base, threads=1)
    assert spins == [False, True]


def test_the_non_gemm_step_reads_the_graph_not_the_weights(loaded, tmp_path, monkeypatch):
    """The linear-free copy of the export keeps its weights in the export's data file: they
    are never loaded into Python (a 262k-vocabulary export's were 1.3 GB, copied twice)."""
    import onnx

    from autoplan.backends.cpu import ort_microbench as OM

    art = export_baseline(loaded, tmp_path / "base")
    files = sorted(p.name for p in art.path.iterdir())

    def refuse(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("the export's weights were loaded into Python")

    monkeypatch.setattr(onnx, "load_external_data_for_model", refuse)
    seconds = OM.non_gemm_decode_seconds(art.path, 8, threads=1, window=4, repeats=1)
    assert 0 < seconds < 10
    assert sorted(p.name for p in art.path.iterdir()) == files  # the export is left as it was
