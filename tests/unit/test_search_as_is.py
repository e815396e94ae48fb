"""What a search may return (issue 30 item 5, issue 29 items 6 and 7): the model as is is
always a candidate and counts as a uniform recipe; a quantized source (a GGUF) is a plan the
search can return unchanged; and a plan whose predicted gain over a measured candidate of
better quality is inside the speed prediction's uncertainty is that candidate."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from autoplan.plan.io import load_plan
from autoplan.search import SearchRequest, run_search
from tests.unit._tiny import FAST, WORKLOAD, one_torch_thread, tiny_llama, tiny_model_dir  # noqa: F401

gguf = pytest.importorskip("gguf")


def _search(model: Path | str, out: Path, **kw):  # noqa: ANN003, ANN202 - a Plan
    args = {"model": str(model), "target": "h100-sxm", "runtime": "vllm", "budget": "kl<=0.05",
            "trials": 200, "out": out, "workload": WORKLOAD,
            "storage": optuna.storages.InMemoryStorage(), **FAST}
    plan = run_search(SearchRequest(**(args | kw))).plan
    assert load_plan(out) == plan
    return plan


def _speed(plan, label: str) -> float:  # noqa: ANN001
    return plan.predicted[label].tokens_per_s


def test_a_gain_inside_the_speed_uncertainty_keeps_the_better_quality(model_dir, tmp_path):
    """On H100 the tiny model's best mix and int8_wo are predicted within validate's mean
    error on Hopper of bf16: the plan keeps the model as is, at KL 0, and says why. Today
    the search returns the mix (outcome "plan")."""
    from autoplan.cost.validate import family_error

    fast = _search(model_dir, tmp_path / "fast.json", min_gain=0.0)
    assert fast.search.outcome in ("plan", "uniform-fallback") and fast.quality.kl > 0
    plan = _search(model_dir, tmp_path / "plan.json")
    u = plan.search.speed_uncertainty
    assert u["relative"] == family_error("hopper")[0] > 0.05
    assert "autoplan validate" in u["source"] and "hopper" in u["source"]
    assert _speed(fast, "plan") / _speed(fast, "baseline") < 1 + u["relative"]
    assert plan.search.outcome == "baseline-fallback" and plan.quality.kl == 0
    assert set(plan.decisions.values()) == {"dense+bf16"}
    assert f"within the speed prediction's uncertainty of +-{u['relative']:.1%}" in \
        plan.search.why
    assert plan.search.stopped.startswith(("no faster candidate", "converged"))


def test_the_best_uniform_recipe_includes_the_model_as_is(model_dir, tmp_path):
    """On MI300X the tiny model's only other recipe, FP8, is slower than bf16: the best
    uniform recipe is the model as is (gain 1.000), and FP8 is never measured. Today the
    plan is the baseline yet reports 1.235x over uniform FP8 (the compare table's
    "x best uniform 1.292" for the embedded model)."""
    plan = _search(model_dir, tmp_path / "p.json", target="mi300x", min_gain=0.0)
    assert plan.search.outcome == "baseline-fallback"
    assert plan.search.best_uniform == "as is (baseline)"
    assert plan.search.gain_over_best_uniform == pytest.approx(1.0)
    assert plan.predicted["best_uniform"].label == "as is (baseline)"
    assert not any(p.measured_kl is not None for p in plan.search.points
                   if p.label == "uniform dense+fp8_e4m3")


def _vocab(size: int) -> list[str]:
    from tests.unit.tiny_llama import tiny_tokenizer

    chars = [t for t, _ in sorted(tiny_tokenizer().get_vocab().items(), key=lambda kv: kv[1])]
    return chars + [f"<extra{i}>" for i in range(size - len(chars))]


@pytest.fixture(scope="module")
def tiny_gguf(model_dir, tmp_path_factory) -> Path:  # noqa: ARG001 - model_dir: the cache
    from tests.unit._tiny_gguf import write_tiny_gguf

    model = tiny_llama()
    path = tmp_path_factory.mktemp("gguf") / "tiny.Q4_1.gguf"
    return write_tiny_gguf(model, path, _vocab(model.config.vocab_size))


def test_a_quantized_source_is_returned_unchanged_when_nothing_beats_it(tiny_gguf, tmp_path):
    """A Q4_1 GGUF under a budget nothing but the file meets: the plan is the file as it is
    (outcome "as-is"), not the fp32-dequantized baseline, which is larger and slower.
    Today the search returns that baseline ("baseline-fallback", every layer fp32)."""
    plan = _search(tiny_gguf, tmp_path / "p.json", target="xeon-8480", runtime="llama.cpp",
                   budget="kl<=1e-7")
    assert plan.search.outcome == "as-is"
    assert set(plan.decisions.values()) == {"dense+q4_1"}
    assert _speed(plan, "plan") > _speed(plan, "baseline")
    assert "source GGUF" in plan.search.quality_reference
    assert "as is (the source GGUF) measures kl" in plan.search.quality_reference


def test_no_plan_is_slower_than_the_source_and_no_better(tiny_gguf, tmp_path):
    """With any gain allowed, a plan is the file or predicted faster than it; with the
    stated uncertainty of a CPU target (validate: 28.7 %), a gain the tiny model's mixes
    cannot reach, the plan is the file."""
    loose = _search(tiny_gguf, tmp_path / "loose.json", target="xeon-8480",
                    runtime="llama.cpp", min_gain=0.0)
    source = {p.label: p for p in loose.search.points}["as is (the source GGUF)"]
    assert loose.search.outcome == "as-is" or _speed(loose, "plan") > source.objective
    plan = _search(tiny_gguf, tmp_path / "p.json", target="xeon-8480", runtime="llama.cpp")
    assert plan.search.outcome == "as-is", plan.search.why


def test_a_quantized_source_is_the_quality_reference_as_llama_cpp_runs_it(tiny_gguf):
    """On a GGUF source the budget counts KL from the file as llama.cpp runs it (its types
    with llama.cpp's activation rounding, simulated), the frame of a KL measured through
    llama.cpp against the file: the file unchanged measures exactly 0, and its fp32
    dequantization, which skips that rounding, does not; streamed, the same."""
    from autoplan.search import Reporter, preflight, prepare
    from autoplan.streaming import ExecutionSettings

    args = {"model": str(tiny_gguf), "target": "xeon-8480", "runtime": "llama.cpp",
            "budget": "kl<=0.05", "trials": 10, "out": Path("unused.json"),
            "workload": WORKLOAD, "storage": optuna.storages.InMemoryStorage(), **FAST}
    req = SearchRequest(**args)
    prep = prepare(req, preflight(req), Reporter())
    prep.verifier.shared.store = None  # measured here, not read from another run
    assert prep.as_is.quantized_source and prep.as_is.frame == "as-is"
    assert "as llama.cpp runs it" in prep.as_is.reference
    as_is = prep.verifier.measure(prep.as_is.picks, prep.as_is.label)
    baseline = prep.verifier.measure(prep.baseline_picks, "baseline")
    assert as_is.quality.kl == 0.0
    assert baseline.quality.kl > 1e-6  # the activation rounding the fp32 model skips
    streamed = SearchRequest(**(args | {"execution": ExecutionSettings(execution="stream")}))
    prep = prepare(streamed, preflight(streamed), Reporter())
    prep.verifier.shared.store = None
    assert prep.runner.execution == "stream" and prep.as_is.frame == "as-is"
    streamed_as_is = prep.verifier.measure(prep.as_is.picks, prep.as_is.label)
    streamed_baseline = prep.verifier.measure(prep.baseline_picks, "baseline")
    assert streamed_as_is.quality.kl == 0.0
    assert streamed_baseline.quality.kl == pytest.approx(baseline.quality.kl, rel=1e-3)


def test_when_the_fastest_uniform_recipes_all_fail_the_least_lossy_is_tried():
    """A CPU space has six 4-bit recipes faster than its int8 one: when a budget fails them
    all, the recipe the profile predicts least lossy is measured too, so the plan has a bar;
    a recipe slower than the model as is is never tried."""
    from dataclasses import dataclass
    from types import SimpleNamespace

    from autoplan.search.stages import UNIFORM_TRIES, best_uniform

    @dataclass(frozen=True)
    class Measured:
        picks: tuple
        passed: bool
        label: str = ""

    # (speed, surrogate KL, passes when measured): seven lossy 4-bit recipes, then int8
    # (faster than the model as is), then a recipe slower than the model as is
    recipes = {f"q4_{i}": ((i + 1,), 100.0 - i, 0.5, False) for i in range(UNIFORM_TRIES + 1)}
    recipes |= {"int8": ((20,), 60.0, 0.01, True), "slow": ((30,), 10.0, 0.0, True)}
    as_is = (0,)
    speed = {p: s for p, s, _, _ in recipes.values()} | {as_is: 50.0}
    kl = {p: k for p, _, k, _ in recipes.values()} | {as_is: 0.0}
    passes = {p: ok for p, _, _, ok in recipes.values()} | {as_is: True}
    tried = []

    def measure(picks, label, bounded):  # noqa: ANN001, ANN202
        tried.append(label)
        return Measured(picks, passes[picks])

    prep = SimpleNamespace(
        as_is=SimpleNamespace(picks=as_is, label="as is (baseline)"), baseline_picks=as_is,
        uniform={name: list(r[0]) for name, r in recipes.items()}, sign=-1.0,
        value=lambda picks: speed[tuple(picks)],
        tables=SimpleNamespace(surrogate=lambda picks: kl[tuple(picks)]),
        verifier=SimpleNamespace(measure=measure))
    best = best_uniform(prep, SimpleNamespace(stage=lambda name: None))
    assert best is not None and best.label == "uniform int8"
    assert tried == [f"uniform q4_{i}" for i in range(UNIFORM_TRIES)] + ["uniform int8"]
