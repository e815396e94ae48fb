"""`autoplan search` streamed vs in memory on the tiny Llama: the same plan, the same
measured quality, the same audit digests (each run with its own cache, so both profile)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.errors import UserInputError
from tests.unit._tiny import (assert_same_plan, one_torch_thread,  # noqa: F401
                              save_tiny_folder, search_plan)


def test_streamed_search_gives_the_in_memory_plan(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    folder = save_tiny_folder(tmp_path / "model")
    mem = search_plan(folder, tmp_path, "memory", monkeypatch)
    st = search_plan(folder, tmp_path, "stream", monkeypatch)
    assert_same_plan(st, mem)
    # in memory a round's candidates are measured one at a time until one settles the
    # rounds; streamed, together in one pass over the blocks: the same verdicts, in order
    verdicts = [[(v.label, v.passed) for r in p.search.rounds for v in r.verified]
                for p in (mem, st)]
    assert verdicts[1][:len(verdicts[0])] == verdicts[0]
    assert st.search.real_evaluations >= mem.search.real_evaluations


def test_streamed_search_refuses_a_suite_budget_early(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    folder = save_tiny_folder(tmp_path / "model")
    suite = tmp_path / "suite.jsonl"
    suite.write_text('{"prompt": "a", "answer": "b"}\n')
    monkeypatch.setattr("autoplan.streaming.runner.ModelRunner.build_profile",
                        lambda *a, **k: pytest.fail("profiled before refusing"))
    with pytest.raises(UserInputError, match="--execution memory"):
        search_plan(folder, tmp_path, "stream", monkeypatch, budget=f"suite:{suite}>=-1")


@pytest.mark.parametrize("execution", ["memory", "stream"])
def test_out_of_memory_while_verifying_is_one_line(tmp_path: Path, execution: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A candidate that runs out of memory ends the search with the fix, not a traceback."""
    from autoplan.errors import AutoplanError

    def oom(*_a, **_k):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB")

    target = ("autoplan.streaming.evaluate.StreamedEvaluator.evaluate_many"
              if execution == "stream" else "autoplan.streaming.candidates.compressed_copy")
    monkeypatch.setattr(target, oom)
    folder = save_tiny_folder(tmp_path / "model")
    with pytest.raises(AutoplanError) as err:
        search_plan(folder, tmp_path, execution, monkeypatch)
    msg = str(err.value)
    assert "out of memory while verifying candidates" in msg and "--dry-run" in msg
    assert "calibration tokens" in msg and "\n" not in msg
    assert not (tmp_path / f"plan-{execution}.json").exists()


def test_out_of_memory_while_loading_is_one_line(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from autoplan.errors import AutoplanError

    def oom(*_a, **_k):  # noqa: ANN002, ANN003, ANN202
        raise MemoryError()

    monkeypatch.setattr("autoplan.streaming.runner.load_model", oom)
    folder = save_tiny_folder(tmp_path / "model")
    with pytest.raises(AutoplanError, match="out of memory while loading the model .*--dry-run"):
        search_plan(folder, tmp_path, "memory", monkeypatch)


def test_device_without_a_gpu_is_refused_before_loading(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the no-GPU refusal")
    monkeypatch.setattr("autoplan.search.preparation._prepare.open_model",
                        lambda *a, **k: pytest.fail("loaded before refusing"))
    folder = save_tiny_folder(tmp_path / "model")
    with pytest.raises(UserInputError, match="no CUDA/ROCm GPU"):
        search_plan(folder, tmp_path, "stream", monkeypatch, device="cuda")
