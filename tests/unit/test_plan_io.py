"""Plan files: JSON round trip, atomic writes, schema-version checks and migrations."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from autoplan.errors import PlanError
from autoplan.plan import io as plan_io
from autoplan.plan import schema as ps
from autoplan.plan.io import load_plan, migrate, save_plan


def sample_plan(**changes) -> ps.Plan:  # noqa: ANN003 - field overrides
    pred = ps.Predicted(label="plan", tokens_per_s=1000.0, ttft_s=0.1, tpot_s=0.01,
                        request_latency_s=1.4, memory_gb=10.0, fits=True,
                        energy_j_per_token=0.5, usd_per_1m_tokens=0.8, weight_gb=2.0)
    plan = ps.Plan(
        autoplan_version="0.1.0", created="2026-01-01T00:00:00+00:00",
        model=ps.ModelRef(id="tiny", content_hash="ab" * 32, model_type="llama", n_layers=2,
                          params=123456),
        target=ps.TargetRef(name="h100-sxm", price_per_hour=2.5, price_source="catalog"),
        runtime=ps.RuntimeRef(name="vllm", version="0.10"),
        workload={"batch": 8, "input_len": 128, "output_len": 32}, objective="throughput",
        budget=ps.Budget(text="kl<=0.05", metric="kl", limit=0.05),
        compression=ps.Compression(prune_score="wanda", quant_method="rtn"),
        decisions={"model.layers.0.self_attn.q_proj": "dense+fp8_e4m3",
                   "lm_head": "dense+bf16"},
        predicted={"plan": pred, "baseline": pred.model_copy(update={"label": "baseline"})},
        quality=ps.Quality(kl=0.01, ppl=10.1, ppl_ref=10.0, surrogate_kl=0.012,
                           budget_met=True, eval_tokens=512),
        search=ps.SearchMeta(
            sampler="ExchangeSampler (optuna)", seed=0, trials=200, wall_time_s=1.0,
            study="autoplan-x", storage="journal:p.optuna.journal", real_evaluations=3,
            rounds=[{"round": 1, "surrogate_limit": 0.045, "trials": 200}],
            certificate=ps.Certificate(solver="milp", optimum_objective=1.0,
                                       search_objective=1.0, gap=0.0, surrogate_limit=0.045),
            outcome="plan"),
        audit=ps.Audit(calibration_source="pydoc", calibration_hash="cd" * 32,
                       tensors={"model.layers.0.self_attn.q_proj": {"mask": "00", "weight": "11"}}),
    )
    return plan.model_copy(update=changes)


def _raw(path: Path) -> dict:
    return json.loads(path.read_text())


def test_round_trip(tmp_path: Path) -> None:
    plan = sample_plan()
    path = tmp_path / "sub" / "plan.json"
    save_plan(plan, path)
    assert load_plan(path) == plan
    text = path.read_text()
    assert list(_raw(path)) == sorted(_raw(path))  # sorted keys: stable diffs
    save_plan(load_plan(path), path)
    assert path.read_text() == text


def test_failed_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "plan.json"
    save_plan(sample_plan(), path)
    before = path.read_bytes()

    def broken(*_a, **_k) -> None:  # noqa: ANN002, ANN003
        raise OSError("disk full")

    # fails after the bytes are written, before the rename: the old file must survive
    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(OSError, match="disk full"):
        save_plan(sample_plan(objective="latency"), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]  # no temp file left
    monkeypatch.undo()
    assert load_plan(path).objective == "throughput"


def test_newer_schema_refused_with_upgrade_hint(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    save_plan(sample_plan(), path)
    raw = _raw(path)
    raw["schema_version"] = ps.SCHEMA_VERSION + 1
    path.write_text(json.dumps(raw))
    with pytest.raises(PlanError, match="upgrade autoplan") as err:
        load_plan(path)
    assert str(ps.SCHEMA_VERSION + 1) in str(err.value)


@pytest.mark.parametrize(("where", "key"), [((), "colour"), (("quality",), "klx"),
                                            (("search", "certificate"), "extra")])
def test_unknown_key_is_a_one_line_error_naming_it(tmp_path: Path, where: tuple, key: str) -> None:
    path = tmp_path / "plan.json"
    save_plan(sample_plan(), path)
    raw = _raw(path)
    node = raw
    for part in where:
        node = node[part]
    node[key] = 1
    path.write_text(json.dumps(raw))
    with pytest.raises(PlanError) as err:
        load_plan(path)
    msg = str(err.value)
    assert "\n" not in msg and key in msg and ".".join((*where, key)) in msg


@pytest.mark.parametrize(("content", "needle"), [
    ("{not json", "not valid JSON"), ("[1, 2]", "expected a JSON object"),
    ('{"model": {}}', "schema_version"), ('{"schema_version": "1"}', "schema_version")])
def test_not_a_plan(tmp_path: Path, content: str, needle: str) -> None:
    path = tmp_path / "plan.json"
    path.write_text(content)
    with pytest.raises(PlanError, match=needle) as err:
        load_plan(path)
    assert "\n" not in str(err.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="no plan file"):
        load_plan(tmp_path / "absent.json")


def test_missing_required_field_named(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    save_plan(sample_plan(), path)
    raw = _raw(path)
    del raw["quality"]["budget_met"]
    path.write_text(json.dumps(raw))
    with pytest.raises(PlanError, match=r"quality\.budget_met"):
        load_plan(path)


@pytest.mark.parametrize("routing", [
    {"shares": {"0": ["x"]}}, {"shares": [0.5, 0.5]}, {"shares": {"first": [0.5]}},
    {"shares": {"0": []}}, {"shares": {"0": [-0.1]}}, {"shares": {"0": [True]}},
    {"source": 3, "shares": {"0": [0.5]}}])
def test_malformed_routing_is_a_one_line_error(tmp_path: Path, routing: dict) -> None:
    """report and fleet price an MoE plan with its routing shares: a hand-edited one that
    cannot be read is refused at load, not a traceback when a command uses it."""
    path = tmp_path / "plan.json"
    save_plan(sample_plan(routing={"source": "calibration routing (8 tokens)",
                                   "shares": {"0": [0.25, 1.75], "1": [1.0, 1.0]}}), path)
    assert load_plan(path).routing["shares"]["0"] == [0.25, 1.75]
    raw = _raw(path)
    raw["routing"] = routing
    path.write_text(json.dumps(raw))
    with pytest.raises(PlanError, match=r"not a valid plan: routing: .*'(shares|source)'"):
        load_plan(path)


def test_migrations_applied_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A v1 plan written before two imaginary schema bumps still loads."""
    path = tmp_path / "old.json"
    save_plan(sample_plan(), path)
    raw = _raw(path)
    raw["goal"] = raw.pop("objective")  # v1 called it 'goal' in this imaginary history
    raw["schema_version"] = 1
    path.write_text(json.dumps(raw))
    calls: list[int] = []

    def v1_to_v2(r: dict) -> dict:
        calls.append(1)
        r = dict(r)
        r["objective"] = r.pop("goal")
        return {**r, "schema_version": 2}

    def v2_to_v3(r: dict) -> dict:
        calls.append(2)
        assert "objective" in r  # runs after v1_to_v2
        return {**r, "schema_version": 3}

    monkeypatch.setattr(plan_io, "SCHEMA_VERSION", 3)
    monkeypatch.setattr(plan_io, "MIGRATIONS", {1: v1_to_v2, 2: v2_to_v3})
    plan = load_plan(path)
    assert calls == [1, 2]
    assert plan.schema_version == 3 and plan.objective == "throughput"
    assert plan.decisions == sample_plan().decisions


def test_missing_migration_step_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_io, "SCHEMA_VERSION", 3)
    monkeypatch.setattr(plan_io, "MIGRATIONS", {1: lambda r: {**r, "schema_version": 2}})
    with pytest.raises(PlanError, match="no migration from plan schema_version 2"):
        migrate({"schema_version": 1})


def test_current_version_needs_no_migration() -> None:
    raw = {"schema_version": ps.SCHEMA_VERSION, "x": 1}
    assert migrate(raw) == raw


OLD_PLAN = Path(__file__).resolve().parents[1] / "data" / "plan_v1.json"


def test_a_version_1_plan_is_read_into_the_typed_schema(tmp_path: Path) -> None:
    """tests/data/plan_v1.json was written by `run_search` at schema_version 1 (the tiny
    Llama, h100-sxm / vLLM): its free-form rounds, points and workload load as models."""
    raw = _raw(OLD_PLAN)
    assert raw["schema_version"] == 1 and isinstance(raw["search"]["rounds"][0], dict)
    plan = load_plan(OLD_PLAN)
    assert plan.schema_version == ps.SCHEMA_VERSION
    assert plan.workload.batch == raw["workload"]["batch"]
    assert plan.search.outcome == raw["search"]["outcome"]
    rounds = raw["search"]["rounds"]
    assert [r.trials for r in plan.search.rounds] == [r["trials"] for r in rounds]
    assert [v.passed for r in plan.search.rounds for v in r.verified] == \
        [v["passed"] for r in rounds for v in r["verified"]]
    assert [p.kind for p in plan.search.points] == [p["kind"] for p in raw["search"]["points"]]
    assert plan.decisions == raw["decisions"]
    save_plan(plan, tmp_path / "v2.json")  # written at the current version, read back equal
    assert _raw(tmp_path / "v2.json")["schema_version"] == ps.SCHEMA_VERSION
    assert load_plan(tmp_path / "v2.json") == plan


def test_an_unknown_outcome_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    save_plan(sample_plan(), path)
    raw = _raw(path)
    raw["search"]["outcome"] = "maybe"
    path.write_text(json.dumps(raw))
    with pytest.raises(PlanError, match=r"search\.outcome"):
        load_plan(path)
