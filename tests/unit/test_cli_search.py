"""`autoplan search`, `show` and `profile` through click's CliRunner on the tiny model folder."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import autoplan.search
from autoplan.cli import cli
from autoplan.plan.io import load_plan
from autoplan.search import SearchRequest
from tests.unit._tiny import FAST, one_torch_thread, shared_dirs  # noqa: F401


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder, cache = shared_dirs(tmp_path_factory)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUTOPLAN_CACHE", str(cache))
        # the CLI has no data-size options: small calibration/evaluation blocks keep it fast
        mp.setattr(autoplan.search, "SearchRequest", functools.partial(SearchRequest, **FAST))
        yield folder


@pytest.fixture(scope="module")
def plan_file(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Result]:
    out = tmp_path_factory.mktemp("cli") / "p.json"
    # A 64-wide model's GEMMs are all kernel-launch overhead on an H100: compression pays
    # only in the decode step's weight reads, so the plan is searched for time per token,
    # and every predicted gain counts (--min-gain 0: all are within H100's stated speed
    # uncertainty, where the search would keep the model as it is).
    result = CliRunner().invoke(cli, ["search", "--model", str(model_dir), "--target", "h100-sxm",
                                      "--trials", "100", "--out", str(out), "--quiet",
                                      "--objective", "tpot", "--batch", "1", "--min-gain", "0"])
    return out, result


def _check_compressed_by_search(plan) -> None:  # noqa: ANN001
    """The plan is a searched candidate that passed verification and compresses the model:
    a fallback to a uniform recipe or the baseline also meets the budget, so budget_met
    alone would pass if every searched candidate failed."""
    assert plan.search.outcome == "plan"
    assert any(v.passed for r in plan.search.rounds for v in r.verified)
    assert any(c != "dense+bf16" for c in plan.decisions.values())
    assert plan.audit.tensors  # a compressed layer's weights are audited
    assert plan.predicted["plan"].weight_gb < plan.predicted["baseline"].weight_gb
    assert plan.predicted["plan"].tokens_per_s > plan.predicted["baseline"].tokens_per_s


def _one_error_line(result: Result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.exception is not None
    assert isinstance(result.exception, SystemExit)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("error:")
    return lines[0]


def test_search_writes_a_plan(plan_file: tuple[Path, Result]) -> None:
    out, result = plan_file
    assert result.exit_code == 0, result.output
    plan = load_plan(out)
    assert plan.search.rounds[0].trials == 100 and plan.target.name == "h100-sxm"
    assert plan.runtime.name == "vllm"  # the target's usual engine
    assert plan.quality.budget_met
    _check_compressed_by_search(plan)
    assert result.stdout == ""  # --quiet: nothing on stdout
    assert f"plan written to {out}" in result.stderr
    assert out.with_name("p.optuna.journal").is_file()  # default storage beside the plan


def test_show_renders_the_plan(plan_file: tuple[Path, Result]) -> None:
    out, _ = plan_file
    result = CliRunner().invoke(cli, ["show", str(out), "--layers"])
    assert result.exit_code == 0, result.output
    assert "h100-sxm" in result.stdout
    assert "model.layers.1.mlp.down_proj" in result.stdout  # --layers lists every decision
    shown = CliRunner().invoke(cli, ["show", str(out), "--json"])
    assert shown.exit_code == 0
    assert json.loads(shown.stdout) == load_plan(out).model_dump(mode="json")


def test_show_bad_file_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 99}')
    assert "upgrade autoplan" in _one_error_line(CliRunner().invoke(cli, ["show", str(bad)]))
    assert "no plan file" in _one_error_line(
        CliRunner().invoke(cli, ["show", str(tmp_path / "missing.json")]))


@pytest.mark.parametrize(("args", "needle"), [
    (["--budget", "kl<0.05"], "cannot read budget"),
    (["--budget", "suite:/nonexistent/s.jsonl>=-1"], "not found"),
    (["--target", "h1000"], "h1000"),
    (["--trials", "0"], "--trials"),
    (["--batch", "0"], "--batch"),
    (["--measure-kernels"], "--target local and --runtime onnxruntime or llama.cpp"),
    (["--choices", "fp7"], "unknown precision"),
    (["--target", "xeon-8480", "--runtime", "onnxruntime", "--choices", "int8"],
     "accelerates no compressed format"),
    (["--choices", ","], "--choices is empty"),
])
def test_user_mistakes_exit_2_with_one_line(model_dir: Path, tmp_path: Path, args: list[str],
                                            needle: str) -> None:
    out = tmp_path / "p.json"
    result = CliRunner().invoke(cli, ["search", "--model", str(model_dir), "--out", str(out),
                                      "--quiet", "--trials", "5", *args])
    assert needle in _one_error_line(result)
    assert not out.exists()


def test_profile_json(model_dir: Path) -> None:
    result = CliRunner().invoke(cli, ["profile", "--model", str(model_dir), "--target", "h100-sxm",
                                      "--seq-len", "32", "--calib-blocks", "2", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["target"] == "h100-sxm" and doc["tokens"] == 64
    assert "2:4+bf16" in doc["choices"]  # union of every runtime's space (tensorrt-llm)
    assert "lm_head" not in doc["layers"]  # protected on GPUs: never profiled
    assert len(doc["layers"]) == 14
    for scores in doc["layers"].values():
        assert set(scores) == set(doc["choices"])
        assert all(v >= 0 for v in scores.values())
