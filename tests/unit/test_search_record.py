"""What a search records for its workers, and its study name, with the recovery branch's
settings: further budgets, slices and lm-eval settings travel to the workers (their posted
measurements must carry what the driver's budgets read); `--recover` stays in the driver."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from autoplan.compress import CompressionSettings
from autoplan.recover import RecoverySettings
from autoplan.search import ExecutionSettings, SearchRequest
from autoplan.search.run import request_from_record, request_record
from autoplan.search.preparation import study_name
from autoplan.sensitivity import SensitivityProfile


def _prep(req: SearchRequest) -> SimpleNamespace:
    return SimpleNamespace(
        req=req, kernel_times=None, study_name="s", profile=SensitivityProfile(
            "m", "c", CompressionSettings()), platform=SimpleNamespace(runtime="vllm"),
        loaded=SimpleNamespace(content_hash="m"), data=SimpleNamespace(content_hash="d"))


def test_the_record_carries_gates_and_slices_but_not_recovery(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    req = SearchRequest(budget="kl<=0.05", also=("kl:numbers<=0.1", "lm-eval:t>=-2"),
                        slices=False, lmeval_tasks=str(tasks), lmeval_limit=5,
                        recovery=RecoverySettings(steps=3))
    back, _ = request_from_record(request_record(_prep(req)), None, ExecutionSettings())
    assert [b.text for b in back.budgets] == ["kl<=0.05", "kl:numbers<=0.1", "lm-eval:t>=-2"]
    assert (back.slices, back.lmeval_tasks, back.lmeval_limit) == (False, str(tasks), 5)
    assert back.recovery is None  # the driver recovers, on the workers' measurements


def test_study_name_changes_with_gates_and_recovery_only() -> None:
    platform = SimpleNamespace(runtime="vllm", measure_kernels=False)

    def name(**kw: object) -> str:
        return study_name(SearchRequest(budget="kl<=0.05", **kw), platform, "m", "c")

    plain = name()
    assert plain == name(lmeval_limit=5)  # no lm-eval budget: the limit changes nothing
    others = [name(also=("kl:names<=0.2",)), name(slices=False),
              name(recovery=RecoverySettings(steps=3)), name(recovery=RecoverySettings(steps=4))]
    assert len({plain, *others}) == 5
