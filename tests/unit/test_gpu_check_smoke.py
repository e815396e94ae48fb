"""The GPU check's plumbing, run in-process in its --cpu-smoke mode with tiny shapes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cpu_smoke_runs_every_section_and_writes_ingestible_results(tmp_path, capsys):
    from autoplan.backends.microbench import read_cost_table

    gpu_check = _load()
    gpu_check.main(["--cpu-smoke", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert {n: s["status"] for n, s in report["sections"].items()} == {"env": "ok", "microbench": "ok", "decode": "ok"}
    table = read_cost_table(tmp_path / "cost_table.json")
    assert {r["choice"] for r in table["rows"]} == {"dense+bf16", "block16@50+bf16"}
    # a GPU-only choice is recorded as skipped with its reason, not an abort
    assert {s["choice"] for s in table["skipped"]} == {"dense+fp8_e4m3"}
    plans = {d["plan"]: d for d in report["decode"]}
    assert plans["dense"]["tokens_per_s"] > 0
    assert "error" in plans["fp8_all"]  # fp8 kernels need CUDA: recorded, the check goes on
    assert plans["block16@50_mlp"]["first_logits_rel_err"] < 1.0
    assert "decode dense" in capsys.readouterr().out


def test_time_guard_stops_the_sweep_and_says_so(tmp_path):
    gpu_check = _load()
    gpu_check.main(["--cpu-smoke", "--out", str(tmp_path), "--budget-s", "0"])
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["cost_rows"] == []
    assert any("time guard" in note for note in report["notes"])


def test_linear_shapes_of_llama_8b():
    shapes = _load().linear_shapes(**_load().MODELS["llama-3.1-8b"])
    assert shapes == {
        "q_proj": (4096, 4096), "kv_proj": (1024, 4096), "o_proj": (4096, 4096),
        "gate_up_proj": (14336, 4096), "down_proj": (4096, 14336),
    }
