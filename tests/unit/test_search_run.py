"""run_search end to end on a tiny Llama folder: plan round trip, audit, predictions, the
verification fallbacks (stage by stage), resume through the default journal, a sampler and a
storage passed in as objects, and no password in the plan or in any message."""

from __future__ import annotations

import re
from pathlib import Path

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from autoplan.errors import UserInputError
from autoplan.formats import Choice
from autoplan.modelspec import ModelSpec
from autoplan.plan import schema as ps
from autoplan.plan.io import load_plan
from autoplan.quality.slices import SLICES
from autoplan.search import (
    Outcome,
    Rounds,
    SearchOutcome,
    SearchRequest,
    build_plan,
    certify,
    choose,
    load_space_file,
    preflight,
    prepare,
    run_search,
)
from autoplan.runtimes import get_runtime
from autoplan.search.jobs import redact
from autoplan.search.optimize import Candidate
from autoplan.search.reporter import Reporter
from autoplan.streaming.candidates import CandidateContext, evaluate_candidate
from autoplan.targets import get_target
from tests.unit._tiny import FAST, WORKLOAD, one_torch_thread, tiny_model_dir  # noqa: F401

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _request(model_dir: Path, out: Path, **kw) -> SearchRequest:  # noqa: ANN003
    args = {"model": str(model_dir), "target": "h100-sxm", "runtime": "vllm",
            "budget": "kl<=0.05", "trials": 200, "out": out, "workload": WORKLOAD, **FAST}
    return SearchRequest(**(args | kw))


@pytest.fixture(scope="module")
def h100(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> SearchOutcome:
    """min_gain 0: on the tiny model every mix is predicted within H100's stated speed
    uncertainty of int8_wo and of bf16 (the noise rule, tested in test_search_as_is.py)."""
    out = tmp_path_factory.mktemp("h100") / "plan.json"
    return run_search(_request(model_dir, out, min_gain=0.0))


def _baseline(plan) -> str:  # noqa: ANN001
    return load_space_file(get_target(plan.target.name).platform).baseline


def _check_plan_file(outcome: SearchOutcome, out: Path) -> None:
    assert load_plan(out) == outcome.plan  # round trip through the file


def _check_audit(plan) -> None:  # noqa: ANN001
    base = Choice.parse(_baseline(plan))
    compressed = {n for n, c in plan.decisions.items() if Choice.parse(c) != base}
    assert set(plan.audit.tensors) == compressed
    for name, digests in plan.audit.tensors.items():
        assert {"mask", "weight"} <= set(digests), name
        assert all(_HEX64.match(d) for d in digests.values()), name
        if Choice.parse(plan.decisions[name]).precision.info.value_bits < 16:
            assert len(digests) > 2, f"{name}: quantized but no scale digest"


def test_h100_plan_round_trips_and_meets_budget(h100: SearchOutcome, model_dir: Path,
                                                tmp_path_factory: pytest.TempPathFactory) -> None:
    plan = h100.plan
    out = Path(plan.search.storage.removeprefix("journal:")).with_name("plan.json")
    _check_plan_file(h100, out)
    assert plan.search.outcome == "plan"
    assert plan.quality.budget_met and plan.quality.kl <= 0.05
    assert plan.search.rounds[0].trials == 200 and plan.search.rounds[0].resumed_trials == 0
    assert plan.search.trials == sum(r.trials for r in plan.search.rounds)
    assert plan.search.stopped  # the record says why the rounds stopped
    assert plan.target.name == "h100-sxm" and plan.runtime.name == "vllm"
    assert plan.target.machine is None
    assert plan.budget.metric == "kl" and plan.budget.limit == 0.05
    # every linear decided, lm_head kept, fused q/k/v and gate/up share one choice
    spec = ModelSpec.from_path(model_dir)
    assert set(plan.decisions) == {la.name for la in spec.layers}
    assert plan.decisions["lm_head"] == "dense+bf16"
    for block in range(2):
        a, m = f"model.layers.{block}.self_attn", f"model.layers.{block}.mlp"
        assert len({plan.decisions[f"{a}.{p}_proj"] for p in "qkv"}) == 1
        assert plan.decisions[f"{m}.gate_proj"] == plan.decisions[f"{m}.up_proj"]
    assert any(c != "dense+bf16" for c in plan.decisions.values())
    assert all("2:4" not in c for c in plan.decisions.values())  # vLLM has no 2:4


def test_h100_audit_and_predictions(h100: SearchOutcome) -> None:
    plan = h100.plan
    _check_audit(plan)
    assert {"plan", "baseline"} <= set(plan.predicted)
    assert plan.predicted["plan"].tokens_per_s >= plan.predicted["baseline"].tokens_per_s
    assert plan.predicted["plan"].weight_gb < plan.predicted["baseline"].weight_gb
    cert = plan.search.certificate
    assert cert is not None and -1e-9 <= cert.gap <= 0.01
    # the gap is between whole request times: throughput is inversely proportional to them
    assert plan.objective == "throughput"
    assert cert.gap == pytest.approx(cert.optimum_objective / cert.search_objective - 1,
                                     abs=1e-9)
    # every verified candidate was measured and its verdict matches the budget
    for rnd in plan.search.rounds:
        for v in rnd.verified:
            assert v.passed == (v.badness <= 0.05)
        # measured one at a time, best first: a round stops at its first passing candidate
        assert all(not v.passed for v in rnd.verified[:-1])
    assert plan.quality.surrogate_kl <= cert.surrogate_limit


def test_rerun_resumes_every_trial(h100: SearchOutcome, model_dir: Path) -> None:
    out = Path(h100.plan.search.storage.removeprefix("journal:")).with_name("plan.json")
    again = run_search(_request(model_dir, out, min_gain=0.0))
    assert again.plan.search.study == h100.plan.search.study
    assert again.plan.search.rounds[0].resumed_trials == 200
    assert again.plan.search.rounds[0].trials == 200  # none new
    assert again.plan.decisions == h100.plan.decisions


def test_cpu_target_onnxruntime(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "cpu.json"
    outcome = run_search(_request(model_dir, out, target="xeon-8480", runtime="onnxruntime",
                                  min_gain=0.0))
    plan = outcome.plan
    _check_plan_file(outcome, out)
    assert plan.runtime.name == "onnxruntime" and plan.quality.budget_met
    assert plan.quality.kl <= 0.05
    assert plan.search.outcome in ("plan", "uniform-fallback")
    _check_audit(plan)
    # What ONNX Runtime accelerates on CPU; never its per-tensor int8 or its slow int8_wo.
    allowed = {"dense+fp32", "dense+int4_g32", "dense+int4_g64", "dense+int4_g128",
               "dense+int4a8_g32", "dense+int4a8_g64", "dense+int4a8_g128", "dense+int8a8_g128",
               "dense+uint4a8_g32", "dense+uint4a8_g64", "dense+uint4a8_g128"}
    assert set(plan.decisions.values()) <= allowed
    spec = ModelSpec.from_path(model_dir)
    for la in spec.layers:  # int4_g128 only where 128 divides in_features
        if plan.decisions[la.name] == "dense+int4_g128":
            assert la.in_features % 128 == 0
    assert plan.predicted["plan"].tokens_per_s > plan.predicted["baseline"].tokens_per_s
    assert plan.runtime.version == get_runtime("onnxruntime").version  # the catalog's: a Xeon


def test_a_local_plan_records_the_installed_runtime_version(model_dir: Path,
                                                             tmp_path: Path) -> None:
    """`local` is this machine: its plan runs on the ONNX Runtime installed here, and says
    which machine it was searched on (a catalog target's plan names no machine)."""
    from importlib.metadata import version

    from autoplan.backends.cpu.local_target import machine_of
    from autoplan.backends.cpu.probe import cpu_info

    outcome = run_search(_request(model_dir, tmp_path / "local.json", target="local",
                                  runtime="onnxruntime", trials=20))
    assert outcome.plan.runtime.version == version("onnxruntime")
    assert outcome.plan.target.machine == machine_of(cpu_info())


def test_impossible_budget_falls_back_and_still_meets_it(model_dir: Path, tmp_path: Path) -> None:
    outcome = run_search(_request(model_dir, tmp_path / "p.json", budget="kl<=0.0000001",
                                  trials=50))
    plan = outcome.plan
    assert plan.search.outcome in ("baseline-fallback", "uniform-fallback")
    assert plan.quality.budget_met and plan.quality.kl <= 1e-7
    if plan.search.outcome == "baseline-fallback":
        assert set(plan.decisions.values()) == {"dense+bf16"}
        assert plan.audit.tensors == {}
    _check_plan_file(outcome, tmp_path / "p.json")


def test_failing_candidates_fall_back_to_a_passing_uniform(model_dir: Path,
                                                           tmp_path: Path) -> None:
    """The rounds end with one searched candidate, the harshest plan, which fails when
    measured: `choose` returns the best passing uniform recipe, and the plan says so."""
    req = _request(model_dir, tmp_path / "p.json", budget="kl<=0.001", trials=10, min_gain=0.0)
    prep = prepare(req, preflight(req), Reporter())
    harsh = tuple(len(u.choices) - 1 for u in prep.space.units)  # int4 everywhere
    failed = prep.verifier.measure(harsh, "round1-candidate1")
    assert not failed.passed
    rounds = Rounds(limit=1e-4, chosen=None, trials=10,
                    best_searched=Candidate(harsh, prep.value(harsh), failed.surrogate, 0),
                    log=[ps.Round(round=1, surrogate_limit=1e-4, trials=10, verified=[
                        ps.VerifiedCandidate(label=failed.label, surrogate_kl=failed.surrogate,
                                             badness=failed.badness, passed=False)])])
    chosen = choose(prep, rounds, Reporter())
    assert chosen.outcome is Outcome.UNIFORM and chosen.measurement.passed
    _check_slices_of_the_chosen_only(prep, chosen.measurement)
    plan = build_plan(prep, rounds, chosen, certify(prep, rounds, Reporter()), 0.0)
    assert plan.search.outcome == "uniform-fallback"
    assert plan.quality.budget_met and plan.quality.kl <= 0.001
    assert plan.search.best_uniform is not None
    uniform = plan.search.best_uniform.removeprefix("uniform ")
    assert uniform in set(plan.decisions.values()) and uniform != _baseline(plan)
    assert plan.predicted["plan"].weight_gb < plan.predicted["baseline"].weight_gb
    _check_audit(plan)


def _check_slices_of_the_chosen_only(prep, chosen) -> None:  # noqa: ANN001
    """No budget names a slice: candidates are measured without the KL slices, the chosen
    one gets them afterwards, equal to the bit to a measurement that took them at once."""
    measured = prep.verifier.measured
    assert set(chosen.quality.slices) == set(SLICES)
    assert measured[chosen.picks].quality.slices == chosen.quality.slices
    # (the uncompressed model's quality, known without a pass, comes with its zero slices)
    assert all(not m.quality.slices for k, m in measured.items()
               if k not in (chosen.picks, prep.baseline_picks))
    ctx = CandidateContext(prep.loaded.model, prep.verifier.evaluator,
                           prep.verifier._calibration_stats(), prep.req.settings,
                           prep.space.baseline)
    whole, _ = evaluate_candidate(ctx, prep.verifier._task(chosen.picks, slices=True))
    assert whole.slices == chosen.quality.slices and whole.kl == chosen.quality.kl


def test_a_slice_budget_measures_the_slices_of_every_candidate(model_dir: Path,
                                                                tmp_path: Path) -> None:
    req = _request(model_dir, tmp_path / "p.json", also=("kl:numbers<=10",), trials=10)
    prep = prepare(req, preflight(req), Reporter())
    harsh = tuple(len(u.choices) - 1 for u in prep.space.units)
    m = prep.verifier.measure(harsh, "round1-candidate1")
    assert set(m.quality.slices) == set(SLICES) and m.passed == (m.quality.kl <= 0.05)
    assert prep.verifier.with_slices(m) is m  # nothing left to measure


def test_a_bounded_measurement_stops_once_the_kl_budget_is_certainly_exceeded(
        model_dir: Path, tmp_path: Path) -> None:
    req = _request(model_dir, tmp_path / "p.json", budget="kl<=1e-6", trials=10)
    prep = prepare(req, preflight(req), Reporter())
    shared = prep.verifier.shared
    shared.store = None  # measured here, not answered by an earlier test's run
    harsh = tuple(len(u.choices) - 1 for u in prep.space.units)
    early = prep.verifier.measure(harsh, "uniform harsh", bounded=True)
    assert early.quality.stopped_early and not early.passed and early.audit == {}
    cal = prep.verifier.calibration(1.5)  # a bound the prior already predicts moves nothing
    assert cal.base == pytest.approx(1.5) and all(
        s == pytest.approx(1.5) for s in cal.scales.values())
    prep.verifier.measured.clear()
    full = prep.verifier.measure(harsh, "uniform harsh")  # a full pass: not the bound again
    assert not full.quality.stopped_early and 1e-6 < early.quality.kl <= full.quality.kl
    assert full.audit and shared.reused == 0


def test_ppl_budget_with_a_sampler_and_storage_passed_in(model_dir: Path, tmp_path: Path) -> None:
    storage = JournalStorage(JournalFileBackend(str(tmp_path / "mine.journal")))
    sampler = optuna.samplers.RandomSampler(seed=1)
    out = tmp_path / "p.json"
    outcome = run_search(_request(model_dir, out, budget="ppl<=+50%", storage=storage,
                                  sampler=sampler, min_gain=0.0))
    plan = outcome.plan
    assert plan.search.sampler == "RandomSampler (passed in)"
    assert plan.search.storage == "JournalStorage (passed in)"
    study = optuna.load_study(study_name=plan.search.study, storage=storage)
    assert len(study.trials) == plan.search.rounds[0].trials == 200  # kept in OUR storage
    assert not out.with_name("p.optuna.journal").exists()  # and in no default journal
    assert plan.search.outcome == "plan" and plan.quality.budget_met
    assert plan.budget.metric == "ppl"
    assert any(c != "dense+bf16" for c in plan.decisions.values())


def test_storage_url_is_opened_before_work_and_its_password_never_shown(
        model_dir: Path, tmp_path: Path) -> None:
    url = "postgresql://autoplan:s3cret-pw@127.0.0.1:1/optuna"  # nothing listens on port 1
    out = tmp_path / "p.json"
    with pytest.raises(UserInputError, match="storage") as info:
        preflight(_request(model_dir, out, storage=url))
    assert "s3cret" not in str(info.value) and "\n" not in str(info.value)
    assert list(tmp_path.iterdir()) == []  # no plan, no journal
    assert "s3cret" not in redact(url)


def test_bad_inputs_are_user_errors(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="trials"):
        run_search(_request(model_dir, tmp_path / "p.json", trials=0))
    with pytest.raises(UserInputError, match="budget"):
        run_search(_request(model_dir, tmp_path / "p.json", budget="kl<0.1"))
    assert not (tmp_path / "p.json").exists()


def test_the_plan_note_says_where_speed_figures_come_from() -> None:
    from autoplan.search.stages import SpeedSource

    head, tail = "speed figures are cost-model predictions", "; quality is measured"
    assert SpeedSource().note() == head + tail
    assert SpeedSource(cost_table="t.json").note() == \
        f"{head} using measured GEMM times from t.json{tail}"
    assert SpeedSource(kernels="ONNX Runtime", non_gemm_decode=True).note() == \
        f"{head} using this machine's measured ONNX Runtime kernel times and non-GEMM decode " \
        f"step{tail}"


def test_a_local_plan_timed_on_fewer_threads_says_so() -> None:
    """Kernels timed on --threads N are not the machine's: the recorded machine differs, so
    fleet (which sizes the whole machine) does not take the plan's times for its own."""
    from types import SimpleNamespace

    from autoplan.search.stages._build import _machine

    def prep(machine: str | None, threads: int | None) -> SimpleNamespace:
        return SimpleNamespace(platform=SimpleNamespace(target=SimpleNamespace(machine=machine)),
                               req=SimpleNamespace(threads=threads))

    assert _machine(prep("AMD EPYC, 2 cores, 2 threads", None)) == "AMD EPYC, 2 cores, 2 threads"
    assert _machine(prep("AMD EPYC, 2 cores, 2 threads", 1)) == ("AMD EPYC, 2 cores, 2 threads; "
                                                                 "timed on 1 thread")
    assert _machine(prep(None, 4)) is None  # a catalog target: no machine
