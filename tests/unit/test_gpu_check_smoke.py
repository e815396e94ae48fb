"""The GPU check's plumbing on CPU (--cpu-smoke, tiny shapes): sections run in their own
children, results are written after each, a failing or time-starved section says why and
the others go on. The search and stream sections' CPU runs are the rehearsal's
(benchmarks/gpu_rehearsal.sh, minutes); here they are only refused cleanly."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _report(out: Path) -> dict:
    return json.loads((out / "gpu_check.json").read_text())


def test_cpu_smoke_sections_run_and_write_ingestible_results(tmp_path, capsys):
    from autoplan.backends.microbench import read_cost_table

    rc = _load("gpu_check").main(["--cpu-smoke", "--out", str(tmp_path), "--sections",
                                  "env,gemm,validate,decode", "--budget-s", "900"])
    report = _report(tmp_path)
    statuses = {n: s["status"] for n, s in report["sections"].items()}
    assert statuses == dict.fromkeys(("env", "gemm", "validate", "decode"), "ok"), report
    assert rc == 0 and report["complete"] and report["mode"] == "cpu-smoke"
    env = report["sections"]["env"]["result"]
    assert all(not str(v).startswith("FAILED") for v in env["imports"].values())
    table = read_cost_table(tmp_path / "cost_table.json")
    assert {r["choice"] for r in table["rows"]} == {"dense+bf16", "dense+int8", "block16@50+bf16"}
    assert {r["kernel"] for r in table["rows"]} >= {"torch._int_mm+pad32", "bsr_reference"}
    # CUDA-only kernels are recorded as skipped with their reason, not an abort
    assert {s["choice"] for s in table["skipped"]} == {"dense+fp8_e4m3", "dense+int4_g128"}
    classes = report["sections"]["validate"]["result"]["classes"]
    assert {c["choice"] for c in classes} == {"dense+bf16", "dense+int8", "block16@50+bf16"}
    plans = {d["plan"]: d for d in report["sections"]["decode"]["result"]["decode"]}
    assert plans["dense"]["tokens_per_s"] > 0
    assert "error" in plans["fp8_all"]  # fp8 kernels need CUDA: recorded, the check goes on
    assert plans["block16@50_mlp"]["first_logits_rel_err"] < 1.0
    assert "validate  ok" in capsys.readouterr().out
    # the reading path renders what came back, and names the classes over 15 %
    reader = _load("gpu_read")
    text = reader.render(report, "gpu_check.json")
    assert "| gemm | ok |" in text and "GEMM median us" in text and "| dense+int8 |" in text
    assert len(reader.corrections(report)) == sum(c["disagrees"] for c in classes)


def test_a_failing_section_says_why_and_the_next_one_still_runs(tmp_path):
    rc = _load("gpu_check").main(["--cpu-smoke", "--out", str(tmp_path), "--sections",
                                  "search,validate", "--search-model", str(tmp_path / "no.gguf")])
    report = _report(tmp_path)
    search, validate = report["sections"]["search"], report["sections"]["validate"]
    assert rc == 1 and report["complete"]
    assert search["status"] == "failed" and "no search model" in search["reason"]
    assert validate["status"] == "failed" and "no cost_table.json" in validate["reason"]


def test_sections_without_time_left_are_skipped_with_the_second_call_to_make(tmp_path):
    _load("gpu_check").main(["--out", str(tmp_path), "--budget-s", "5"])
    sections = _report(tmp_path)["sections"]
    assert list(sections) == ["env", "tests", "search", "gemm", "validate", "decode", "stream"]
    assert all(s["status"] == "skipped" for s in sections.values())
    assert "--sections stream" in sections["stream"]["reason"]


def test_unknown_section_is_a_usage_error(tmp_path, capsys):
    assert _load("gpu_check").main(["--out", str(tmp_path), "--sections", "gemm,nope"]) == 2
    assert "unknown section" in capsys.readouterr().err


def test_gemm_shapes_are_the_cost_models_packed_groups():
    gemm = _load("gpu_gemm")
    assert gemm.gemm_shapes(**gemm.MODELS["llama-3.1-8b"]) == {
        "qkv_proj": (6144, 4096), "o_proj": (4096, 4096),
        "gate_up_proj": (28672, 4096), "down_proj": (4096, 14336)}
    assert gemm.gemm_shapes(**gemm.MODELS["llama-3.1-70b"])["gate_up_proj"] == (57344, 8192)


def test_the_search_model_keeps_the_first_blocks_byte_for_byte(tmp_path):
    gguf = pytest.importorskip("gguf")
    import torch
    import transformers

    from tests.unit._tiny_archs import tiny_arch_config
    from tests.unit._tiny_gguf import write_tiny_gguf
    from tests.unit.tiny_llama import tiny_tokenizer

    cfg = tiny_arch_config("qwen3")  # any decoder GGUF: the cut is architecture-generic
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    vocab = [t for t, _ in sorted(tiny_tokenizer().get_vocab().items(), key=lambda kv: kv[1])]
    vocab += [f"<extra{i}>" for i in range(cfg.vocab_size - len(vocab))]
    src = write_tiny_gguf(model, tmp_path / "full.gguf", vocab)
    got = _load("gpu_model").truncate_gguf(src, tmp_path / "cut.gguf", 1)
    assert got["blocks"] == 1 and got["of"] == 2
    full, cut = gguf.GGUFReader(str(src)), gguf.GGUFReader(str(tmp_path / "cut.gguf"))
    assert int(cut.fields["qwen3.block_count"].contents()) == 1
    kept = {t.name: t for t in cut.tensors}
    for t in full.tensors:
        if t.name.startswith("blk.1."):
            assert t.name not in kept
        else:
            assert t.tensor_type == kept[t.name].tensor_type
            assert bytes(t.data) == bytes(kept[t.name].data), t.name
    assert cut.fields["tokenizer.ggml.tokens"].contents() == vocab
    with pytest.raises(ValueError, match="--blocks must be 1..2"):
        _load("gpu_model").truncate_gguf(src, tmp_path / "bad.gguf", 3)


def test_sigterm_ends_the_running_section_and_keeps_the_results(tmp_path):
    import signal
    import subprocess
    import time

    proc = subprocess.Popen([sys.executable, str(BENCH / "gpu_check.py"), "--cpu-smoke",
                             "--out", str(tmp_path), "--sections", "env,gemm"])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until the env section's child is running
        report = json.loads((tmp_path / "gpu_check.json").read_text()) \
            if (tmp_path / "gpu_check.json").is_file() else {}
        if report.get("sections_asked"):
            break
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)  # what gpu_check.sh's hard stop sends
    assert proc.wait(timeout=30) == 124
    report = _report(tmp_path)
    assert report["stopped"] == "SIGTERM" and not report["complete"]
    assert report["sections"]["env"]["status"] == "timed_out"
    assert "SIGTERM" in report["sections"]["env"]["reason"]
    assert report["sections"]["gemm"]["status"] == "skipped"
