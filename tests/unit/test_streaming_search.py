"""`autoplan search` streamed vs in memory on the tiny Llama: the same plan, the same
measured quality, the same audit digests (each run with its own cache, so both profile)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.errors import UserInputError
from autoplan.search.run import SearchRequest, run_search
from autoplan.streaming import ExecutionSettings
from tests.unit._tiny import FAST, WORKLOAD, one_torch_thread, save_tiny_folder  # noqa: F401


def _run(folder: Path, root: Path, execution: str, monkeypatch: pytest.MonkeyPatch, **kw):  # noqa: ANN003, ANN202
    monkeypatch.setenv("AUTOPLAN_CACHE", str(root / f"cache-{execution}"))
    args = {"model": str(folder), "target": "h100-sxm", "runtime": "vllm",
            "budget": "kl<=0.05", "trials": 100, "out": root / f"plan-{execution}.json",
            "workload": WORKLOAD,
            "execution": ExecutionSettings(device="cpu", execution=execution)}
    req = SearchRequest(**(args | FAST | kw))
    return run_search(req).plan


def test_streamed_search_gives_the_in_memory_plan(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    folder = save_tiny_folder(tmp_path / "model")
    mem = _run(folder, tmp_path, "memory", monkeypatch)
    st = _run(folder, tmp_path, "stream", monkeypatch)
    assert st.decisions == mem.decisions
    assert st.quality.kl == pytest.approx(mem.quality.kl, rel=1e-4, abs=1e-9)
    assert st.quality.ppl == pytest.approx(mem.quality.ppl, rel=1e-6)
    assert st.audit.tensors == mem.audit.tensors
    assert st.search.real_evaluations == mem.search.real_evaluations


def test_streamed_search_refuses_a_suite_budget_early(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    folder = save_tiny_folder(tmp_path / "model")
    suite = tmp_path / "suite.jsonl"
    suite.write_text('{"prompt": "a", "answer": "b"}\n')
    monkeypatch.setattr("autoplan.streaming.runner.ModelRunner.build_profile",
                        lambda *a, **k: pytest.fail("profiled before refusing"))
    with pytest.raises(UserInputError, match="--execution memory"):
        _run(folder, tmp_path, "stream", monkeypatch, budget=f"suite:{suite}>=-1")
