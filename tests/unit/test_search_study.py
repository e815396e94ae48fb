"""run_study: the quality constraint, seeded reproducibility, resume from storage, the
Pareto front; and the storage helpers (journal default, password redaction)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autoplan.cost.report import Objective
from autoplan.errors import UserInputError
from autoplan.search.jobs import default_storage_url, open_storage, redact
from autoplan.search.optimize import StudyConfig, Tables, lagrangian_allocations, run_study
from tests.unit._tiny import llama_tables, random_tables


@pytest.fixture(scope="module")
def setup():  # noqa: ANN201 - (tables, cost, limit)
    tables, cost, _ = llama_tables(n_layers=8)
    full = sum(float(q.max()) for q in tables.quality)
    return tables, cost, 0.15 * full


def _cfg(n: int, *, seed: int = 0, storage: str | None = None, name: str = "s",
         objective: Objective = Objective.THROUGHPUT, multi: bool = False) -> StudyConfig:
    return StudyConfig(objective, n, seed, name, storage, multi_objective=multi, population=20)


def _baseline(tables) -> list[list[int]]:  # noqa: ANN001
    """The all-baseline warm start run_search always enqueues (surrogate 0: feasible)."""
    return [[0] * len(tables.space.units)]


def _stored(url: str, name: str) -> int:
    study = optuna.load_study(study_name=name, storage=open_storage(url))
    return len(study.get_trials(states=(TrialState.COMPLETE,)))


def test_every_candidate_respects_the_limit(setup) -> None:  # noqa: ANN001
    tables, cost, limit = setup
    res = run_study(tables, limit, cost, _cfg(150), _baseline(tables))
    assert res.n_trials == 150 and res.resumed == 0
    assert len(res.candidates) > 10
    for c in res.candidates:
        assert c.surrogate <= limit
        assert c.surrogate == pytest.approx(tables.surrogate(c.picks))
        assert c.value == pytest.approx(cost.metric_from_times(*tables.times(c.picks),
                                                               Objective.THROUGHPUT))
    values = [c.value for c in res.candidates]
    assert values == sorted(values, reverse=True)  # throughput: best (largest) first
    assert len({c.picks for c in res.candidates}) == len(res.candidates)
    # the search moved off the baseline and beat it
    baseline = cost.metric_from_times(*tables.times([0] * len(tables.space.units)),
                                      Objective.THROUGHPUT)
    assert values[0] > baseline


def test_latency_objective_ranks_smallest_first(setup) -> None:  # noqa: ANN001
    tables, cost, limit = setup
    res = run_study(tables, limit, cost, _cfg(60, objective=Objective.LATENCY),
                    _baseline(tables))
    values = [c.value for c in res.candidates]
    assert values == sorted(values)


def test_seeded_runs_are_reproducible(setup) -> None:  # noqa: ANN001
    tables, cost, limit = setup
    warm = lagrangian_allocations(tables, limit, count=3)
    a = run_study(tables, limit, cost, _cfg(80, seed=3), warm)
    b = run_study(tables, limit, cost, _cfg(80, seed=3), warm)
    assert [c.picks for c in a.candidates] == [c.picks for c in b.candidates]
    c = run_study(tables, limit, cost, _cfg(80, seed=4), warm)
    assert [x.picks for x in c.candidates] != [x.picks for x in a.candidates]


def test_warm_starts_are_the_first_trials(setup) -> None:  # noqa: ANN001
    tables, cost, limit = setup
    warm = lagrangian_allocations(tables, limit, count=4)
    res = run_study(tables, limit, cost, _cfg(10), warm)
    by_trial = {c.trial: c.picks for c in res.candidates}
    for i, picks in enumerate(warm):
        assert by_trial.get(i) == tuple(picks)


def test_resume_runs_only_the_missing_trials(setup, tmp_path: Path) -> None:  # noqa: ANN001
    tables, cost, limit = setup
    url = f"journal:{tmp_path / 'study.journal'}"
    progress: list[tuple[int, int]] = []
    first = run_study(tables, limit, cost, _cfg(40, storage=url), _baseline(tables))
    assert (first.resumed, first.n_trials, _stored(url, "s")) == (0, 40, 40)

    second = run_study(tables, limit, cost, _cfg(80, storage=url), _baseline(tables),
                       on_trial=lambda d, t: progress.append((d, t)))
    assert (second.resumed, second.n_trials, _stored(url, "s")) == (40, 80, 80)
    assert progress[0] == (40, 80) and progress[-1] == (80, 80)
    assert len(progress) == 1 + 40  # one report up front, one per new trial
    # resumed candidates still count: the best of the first run is not lost
    assert second.candidates[0].value >= first.candidates[0].value

    third = run_study(tables, limit, cost, _cfg(80, storage=url), _baseline(tables))
    assert (third.resumed, third.n_trials, _stored(url, "s")) == (80, 80, 80)
    assert [c.picks for c in third.candidates] == [c.picks for c in second.candidates]

    # another study name in the same storage starts from zero
    other = run_study(tables, limit, cost, _cfg(5, storage=url, name="other"))
    assert (other.resumed, other.n_trials, _stored(url, "s")) == (0, 5, 80)


def test_multi_objective_front_is_non_dominated(setup) -> None:  # noqa: ANN001
    tables, cost, limit = setup
    warm = lagrangian_allocations(tables, limit, count=6)
    res = run_study(tables, limit, cost, _cfg(200, multi=True), warm)
    front = res.front
    assert len(front) >= 3
    assert all(c.surrogate <= limit for c in front)

    def dominates(a, b) -> bool:  # noqa: ANN001 - throughput up, surrogate down
        return (a.value >= b.value and a.surrogate <= b.surrogate
                and (a.value > b.value or a.surrogate < b.surrogate))

    for a in front:
        assert not any(dominates(b, a) for b in front if b is not a)
    # complete: every feasible candidate is matched or dominated by a front point
    for c in res.candidates:
        assert any(f.picks == c.picks or dominates(f, c) for f in front)
    assert res.candidates[0].picks in {f.picks for f in front}


def test_front_stays_non_dominated_when_surrogates_tie() -> None:
    # choices 1 and 2 cost the same quality at different speeds: equal-surrogate candidates
    _, cost, _ = llama_tables(n_layers=2)
    tables = random_tables(4, 3, 0)
    quality = tuple(q.copy() for q in tables.quality)
    for q in quality:
        q[2] = q[1]
    tables = Tables(tables.space, tables.prefill, tables.decode, quality,
                    tables.const_prefill, tables.const_decode, tables.output_len)
    res = run_study(tables, 1.0, cost, _cfg(60, multi=True), _baseline(tables))
    surrogates = [c.surrogate for c in res.front]
    assert len(set(surrogates)) == len(surrogates)
    values = [c.value for c in res.front]
    assert values == sorted(values)  # more quality spent buys strictly more throughput
    ties = {}
    for c in res.candidates:
        ties.setdefault(c.surrogate, []).append(c.value)
    assert any(len(v) > 1 for v in ties.values())  # the case under test occurred
    for c in res.front:
        assert c.value == max(ties[c.surrogate])


# ---- storage -------------------------------------------------------------------------------
def test_redact_hides_passwords() -> None:
    assert redact("postgresql://user:secret@host/db") == "postgresql://user:***@host/db"
    assert "secret" not in redact("mysql+pymysql://u:secret@h:3306/x?charset=utf8")
    assert "s3cr@t" not in redact("postgresql://user:s3cr@t@host/db")
    assert redact("sqlite:///tmp/x.db") == "sqlite:///tmp/x.db"
    assert redact("journal:/tmp/p.optuna.journal") == "journal:/tmp/p.optuna.journal"


def test_default_storage_is_a_journal_beside_the_plan(tmp_path: Path) -> None:
    url = default_storage_url(tmp_path / "out" / "plan.json")
    assert url == f"journal:{tmp_path / 'out' / 'plan.optuna.journal'}"
    storage = open_storage(url)
    assert isinstance(storage, optuna.storages.JournalStorage)
    assert (tmp_path / "out").is_dir()


@pytest.mark.parametrize("url", ["not a url", "postgresql://user:secret@/"])
def test_bad_storage_url_is_a_user_error_without_the_password(url: str) -> None:
    with pytest.raises(UserInputError) as err:
        open_storage(url)
    msg = str(err.value)
    assert "secret" not in msg and "\n" not in msg
    assert "storage" in msg


def test_journal_appends_are_read_at_once_and_synced_now_and_then(
        tmp_path, monkeypatch) -> None:  # noqa: ANN001
    import os

    from autoplan.search.jobs import _storage as st

    synced = []
    real = os.fsync
    monkeypatch.setattr(st.os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    path = str(tmp_path / "j.journal")
    writer, reader = st.SyncedJournalFile(path), st.SyncedJournalFile(path)
    for i in range(50):
        writer.append_logs([{"op_code": 0, "n": i}])
        assert [log["n"] for log in reader.read_logs(i)] == [i]  # another process sees it now
    assert len(synced) <= 1  # 50 appends well within FSYNC_S
    monkeypatch.setattr(st, "FSYNC_S", 0.0)
    writer.append_logs([{"op_code": 0, "n": 50}])
    assert len(synced) >= 1
