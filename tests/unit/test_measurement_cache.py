"""Real-model measurements cached on disk (autoplan/search/measurement_cache.py): a rerun
answers a candidate from an earlier run's file, bit for bit; a different context, a damaged
file or a stopped-early bound under a looser budget is measured again."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.compress import CompressionSettings
from autoplan.quality.evaluator import QualityResult
from autoplan.search import preflight, prepare
from autoplan.search.reporter import Reporter
from autoplan.search.verify import MeasurementStore, measurement_store
from tests.unit._tiny import one_torch_thread, tiny_model_dir  # noqa: F401
from tests.unit.test_search_run import _request

KEY = ("dense+bf16", (("model.layers.0.mlp.up_proj", "dense+int8"),))


def test_store_round_trip_and_damaged_or_foreign_files(tmp_path: Path) -> None:
    store = MeasurementStore(tmp_path / "ctx")
    q = QualityResult(ppl=12.5, ppl_ref=12.25, kl=0.0123456789, n_tokens=64, seconds=1.5,
                      slices={"numbers": 0.5})
    assert store.get(KEY) is None
    store.put(KEY, q, {"layer": {"weight": "ab"}})
    assert store.get(KEY) == (q, {"layer": {"weight": "ab"}})  # floats exact through JSON
    path = store._path(KEY)
    path.write_text(path.read_text().replace("dense+int8", "dense+fp8_e4m3"))
    assert store.get(KEY) is None  # the file holds another candidate
    path.write_text("{not json")
    assert store.get(KEY) is None


class _Evaluator:
    suite_reference = None
    gates = ()
    slice_reference = None


def test_the_context_holds_what_a_measurement_depends_on(tmp_path: Path) -> None:
    def folder(**kw):  # noqa: ANN003, ANN202
        args = {"reference_key": "r", "calib_hash": "c", "settings": CompressionSettings(),
                "evaluator": _Evaluator()} | kw
        return measurement_store(tmp_path, **args).folder

    base = folder()
    assert base == folder()
    assert base != folder(reference_key="r2") and base != folder(calib_hash="c2")
    assert base != folder(settings=CompressionSettings(prune_score="sparsegpt"))
    assert base != folder(settings=CompressionSettings(solver_threads=1))
    gated = _Evaluator()
    gated.gates = ("longctx",)
    assert measurement_store(tmp_path, reference_key="r", calib_hash="c",
                             settings=CompressionSettings(), evaluator=gated) is None


def test_a_rerun_answers_from_the_earlier_runs_measurement(
        model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOPLAN_CACHE", str(tmp_path / "cache"))

    def verifier(budget: str):  # noqa: ANN202
        req = _request(model_dir, tmp_path / "p.json", budget=budget, trials=10)
        return prepare(req, preflight(req), Reporter()).verifier

    first = verifier("kl<=0.05")
    harsh = tuple(len(u.choices) - 1 for u in first.space.units)
    measured = first.measure(harsh, "round1-candidate1")
    again = verifier("kl<=0.05")
    answered = again.measure(harsh, "round1-candidate1")
    assert again.shared.cached == 1 and answered.quality == measured.quality
    assert answered.audit == measured.audit
    # a bound proved under a tight budget says nothing under a looser one: measured again
    tight = verifier("kl<=1e-6")
    tight.shared.results.clear()
    tight.measured.clear()
    other = tuple(0 if i % 2 else len(u.choices) - 1 for i, u in enumerate(tight.space.units))
    bound = tight.measure(other, "uniform x", bounded=True)
    assert bound.quality.stopped_early
    loose = verifier(f"kl<={bound.quality.kl * 1.01}")
    redone = loose.measure(other, "uniform x", bounded=True)
    assert loose.shared.cached == 0 and loose.shared.measured == 1  # read, not an answer
    assert redone.quality.kl > bound.quality.kl  # more blocks measured: a later bound or all
    assert not redone.quality.stopped_early or redone.quality.kl > loose.kl_limit
