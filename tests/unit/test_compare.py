"""`autoplan compare` on the tiny Llama: one profile pass for the union of the targets'
choices, verifications shared between targets with identical decisions, the table sorted by
the objective, 'does not fit' rows with their bytes, and bad input refused before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoplan.cli import cli
from autoplan.compare import CompareRequest, parse_entries, run_compare
from autoplan.cost.operating import OperatingRequest
from autoplan.errors import UnknownNameError, UserInputError
from autoplan.plan.io import load_plan
from autoplan.quality.slices import SLICES
from autoplan.search import SearchRequest
from autoplan.search.jobs import JobQueue, open_storage
from autoplan.streaming import runner as runner_module
from autoplan.targets import _MEASURED, get_target
from tests.unit._tiny import FAST, WORKLOAD, one_torch_thread, tiny_model_dir  # noqa: F401


def _base(model_dir: Path, **kw) -> SearchRequest:  # noqa: ANN003
    return SearchRequest(**({"model": str(model_dir), "budget": "kl<=0.05", "trials": 60,
                             "workload": WORKLOAD} | FAST | kw))


@pytest.fixture(scope="module")
def compared(model_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """h100 and h200 on vLLM (the same choices: identical decisions), xeon-8480 on ONNX
    Runtime; counts the profile passes (calls into the runner's build_profile)."""
    calls = []
    original = runner_module.ModelRunner.build_profile

    def counting(self, layers, choices, *a, **kw):  # noqa: ANN001, ANN002, ANN003
        calls.append((list(layers), {n: [str(c) for c in cs] for n, cs in choices.items()}))
        return original(self, layers, choices, *a, **kw)

    out = tmp_path_factory.mktemp("cmp")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner_module.ModelRunner, "build_profile", counting)
        comparison = run_compare(CompareRequest(
            _base(model_dir), parse_entries("h100,h200,xeon-8480"), out))
    return comparison, calls, out


def test_one_profile_over_the_union_of_choices(compared) -> None:  # noqa: ANN001
    comparison, calls, _ = compared
    assert len(calls) == 1  # one profile pass for three targets
    layers, choices = calls[0]
    block = choices["model.layers.0.mlp.down_proj"]  # searched by every entry
    assert "dense+int8_wo" in block and "dense+int4a8_g32" in block  # GPU and CPU formats
    assert "lm_head" in layers  # searched on CPUs, protected on GPU spaces: still in the union
    # ... and scored for the CPU entry's formats only: no GPU space offers it anything
    assert "dense+int4a8_g32" in choices["lm_head"] and "dense+int8_wo" not in choices["lm_head"]
    assert comparison.profile_entries >= sum(map(len, choices.values()))


def test_rows_plans_and_shared_verification(compared) -> None:  # noqa: ANN001
    comparison, _, out = compared
    assert [r.status for r in comparison.rows] == ["ok"] * 3
    tps = [r.plan["tokens_per_s"] for r in comparison.rows]
    assert tps == sorted(tps, reverse=True)  # ranked by the objective (throughput)
    for r in comparison.rows:
        plan = load_plan(out / r.plan_file)
        assert plan.target.name == r.target and plan.runtime.name == r.runtime
        assert r.kl == plan.quality.kl and plan.quality.budget_met
        assert r.gain_over_baseline == pytest.approx(
            plan.predicted["plan"].tokens_per_s / plan.predicted["baseline"].tokens_per_s)
        assert plan.search.points and plan.search.points[-1].kind == "plan"
        assert set(plan.quality.slices) == set(SLICES)  # measured for the chosen plan
    # h100 and h200 search the same choices: their uniform recipes and candidates coincide
    assert comparison.reused >= 1
    xeon = next(r for r in comparison.rows if r.target == "xeon-8480")
    assert "dense+fp8_e4m3" in xeon.not_accelerated  # ONNX Runtime's refusals are listed
    saved = json.loads((out / "compare.json").read_text())
    assert [r["target"] for r in saved["rows"]] == [r.target for r in comparison.rows]


def test_each_entry_is_driven_through_its_job_queue(compared) -> None:  # noqa: ANN001
    """compare runs the search's pipeline: each entry's study has a job queue holding the
    request record `autoplan worker` rebuilds from, marked done once its plan is written."""
    comparison, _, out = compared
    for r in comparison.rows:
        plan = load_plan(out / r.plan_file)
        queue = JobQueue(open_storage(plan.search.storage), plan.search.study)
        assert queue.attr("done") is True and not queue.driver_alive()
        record = queue.attr("request")
        assert record["target"] == r.target and record["profile"]


def test_a_target_that_cannot_hold_the_model_is_listed_with_its_bytes(
        model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tiny = get_target("h100").model_copy(update={"name": "tiny-gpu", "aliases": ()})
    # A 1 kB device: the nominal figure shrunk and the nvidia-smi reading dropped (it wins).
    tiny = tiny.model_copy(update={"memory_gb": tiny.memory_gb.model_copy(
        update={"value": 1e-6}), "visible_memory_mib": None})
    monkeypatch.setitem(_MEASURED.entries, "tiny-gpu", lambda: tiny)
    for operating in (None, OperatingRequest("max", 128, 32)):
        base = _base(model_dir, operating=operating)
        comparison = run_compare(CompareRequest(base, parse_entries("tiny-gpu"), tmp_path / "o"))
        (row,) = comparison.rows
        assert row.status == "does not fit" and row.needed_bytes > row.usable_bytes > 0
        assert "GB" in row.reason


def test_no_batch_meets_the_slo_is_a_row(model_dir: Path, tmp_path: Path) -> None:
    base = _base(model_dir, operating=OperatingRequest(None, 128, 32, ttft_s=1e-9))
    comparison = run_compare(CompareRequest(base, parse_entries("h100"), tmp_path / "o"))
    assert comparison.rows[0].status == "no operating point"
    assert "TTFT" in comparison.rows[0].reason


def test_entries_from_targets_and_runtimes() -> None:
    entries = parse_entries("h100,mi300x", ("h100=tensorrt-llm", "h100=vllm"))
    assert [(e.target, e.runtime) for e in entries] == [
        ("h100-sxm", "tensorrt-llm"), ("h100-sxm", "vllm"), ("mi300x", "vllm")]
    with pytest.raises(UnknownNameError, match="Did you mean 'h200'"):
        parse_entries("h100,h2000")
    with pytest.raises(UserInputError, match="listed twice"):
        parse_entries("h100,h100-sxm")
    with pytest.raises(UserInputError, match="not in --targets"):
        parse_entries("h100", ("b200=vllm",))
    with pytest.raises(UserInputError, match="TARGET=RUNTIME"):
        parse_entries("h100", ("vllm",))


def test_cli_refuses_before_any_work(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(cli, ["compare", "--targets", "h100,mi3000x", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "Did you mean 'mi300x'" in res.output
    assert "Traceback" not in res.output and not list(tmp_path.iterdir())
    res = runner.invoke(cli, ["compare", "--targets", "h100", "--batch", "8", "--ttft-ms", "5"])
    assert res.exit_code == 2 and "--ttft-ms" in res.output


def test_cli_table_and_json(model_dir: Path, tmp_path: Path) -> None:
    args = ["compare", "--model", str(model_dir), "--targets", "h100,mi300x", "--trials", "30",
            "--batch", "8", "--input-len", "128", "--output-len", "32", "--out",
            str(tmp_path / "c"), "--objective", "cost"]
    res = CliRunner().invoke(cli, args + ["--json"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    costs = [r["plan"]["usd_per_1m_tokens"] for r in doc["rows"]]
    assert costs == sorted(costs) and doc["objective"] == "cost"
    res = CliRunner().invoke(cli, args, env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "mi300x / vllm" in res.output and "PREDICTED" in res.output


def test_batch_max_is_resolved_per_target_and_recorded(model_dir: Path, tmp_path: Path) -> None:
    # million-token prompts, so the tiny model's KV cache (256 B per token) binds the batch
    base = _base(model_dir, operating=OperatingRequest("max", 1_000_000, 32))
    comparison = run_compare(CompareRequest(base, parse_entries("l40s,h200"), tmp_path / "o"))
    batches = {}
    for row in comparison.rows:
        plan = load_plan(tmp_path / "o" / row.plan_file)
        assert plan.operating_point.mode == "max" and plan.operating_point.bound
        assert plan.workload.batch == row.batch == plan.operating_point.batch > 8
        assert plan.operating_point.bound == "memory"
        assert plan.predicted["baseline"].fits and plan.predicted["plan"].fits
        batches[row.target] = row.batch
    assert batches["h200"] > batches["l40s"]  # 141 GB hold more sequences than 48 GB
