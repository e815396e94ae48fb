"""Many processes, one search: `autoplan worker` processes join a search (PostgreSQL started
here from Debian's package, and a journal file), share its trial batches and measurements,
and one killed with SIGKILL loses only the trial it was running; the job queue's pieces
(stale jobs by heartbeat and by dead process, the driver's lease, re-queued batches, the
one-attribute trial format) on their own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autoplan.cost.report import Objective
from autoplan.errors import UserInputError
from autoplan.search import SearchOutcome, SearchRequest, run_search
from autoplan.search.jobs import JobQueue, open_storage, process_alive, retry_stale_job, worker_id
from autoplan.search.optimize import RoundStudy, StudyConfig, run_batch, run_study, stored_by
from autoplan.search.reporter import Reporter
from tests.postgres import PostgresServer, why_not_available
from tests.unit._tiny import FAST, WORKLOAD, llama_tables, one_torch_thread, tiny_model_dir  # noqa: F401

STUDY = "shared"


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    reason = why_not_available()
    if reason:
        pytest.skip(reason)
    with PostgresServer(durable=False) as pg:
        yield pg.url


def _worker(url: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "autoplan.cli", "worker", "--storage", url, "--study", STUDY,
         "--quiet", "--wait", "300"], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env=os.environ | {"OMP_NUM_THREADS": "1"})


def _stored(storage, name: str) -> list[optuna.trial.FrozenTrial]:  # noqa: ANN001
    return optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)


def _held_batch(storage, pid: int):  # noqa: ANN001, ANN202 - the RUNNING batch `pid` holds
    try:
        queue = optuna.load_study(study_name=f"{STUDY}.jobs", storage=storage)
    except KeyError:  # not created yet
        return None
    for t in queue.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = (t.system_attrs.get("owner") or {}).get("worker", "")
        if t.user_attrs.get("kind") == "trials" and owner.split("/")[1:2] == [str(pid)]:
            return t
    return None


def _kill_mid_batch(storage, victim: subprocess.Popen, search: threading.Thread):  # noqa: ANN001, ANN202
    """SIGKILL `victim` once it holds a batch and has stored some of its trials; returns
    (the batch it held, the trials it had stored), or None if the search ended first."""
    while search.is_alive():
        held = _held_batch(storage, victim.pid)
        if held is not None:
            mine = [t for t in _stored(storage, STUDY)
                    if stored_by(t)[1] == held.user_attrs["batch"]]
            if mine:
                victim.send_signal(signal.SIGKILL)
                return held, [t.number for t in mine]
        time.sleep(0.02)
    return None


def _check_exact(storage, outcome: SearchOutcome) -> None:  # noqa: ANN001
    names = [r.study for r in outcome.plan.search.rounds]
    assert names[0] == STUDY
    for name, logged in zip(names, outcome.plan.search.rounds, strict=True):
        trials = _stored(storage, name)
        assert {t.state for t in trials} == {TrialState.COMPLETE}
        assert len(trials) == logged.trials  # exact: not one more, not one less
        numbers = Counter(t.number for t in trials)
        assert max(numbers.values()) == 1 and sorted(numbers) == list(range(len(trials)))
        # every batch holds exactly its size, whoever ran it and however often it was retried
        per_batch = Counter(stored_by(t)[1] for t in trials)
        assert sum(per_batch.values()) == logged.trials
        for batch, n in per_batch.items():
            assert n <= 25, batch


class _AfterWorkersJoin(Reporter):
    """Holds the search at its first round until `n` workers have joined it: on a busy
    2-core machine their start (imports, model) takes longer than a tiny model's search."""

    def __init__(self, storage, n: int) -> None:  # noqa: ANN001
        self.storage, self.n = storage, n

    def stage(self, name: str) -> None:
        if name.startswith("search round 1"):
            queue = JobQueue(self.storage, STUDY)
            deadline = time.monotonic() + 240
            while len(queue.workers()) < self.n and time.monotonic() < deadline:
                time.sleep(0.1)


def _shared_search(url: str, model_dir: Path, tmp_path: Path, n_workers: int) -> None:
    out = tmp_path / "plan.json"
    workers = [_worker(url, tmp_path) for _ in range(n_workers)]  # first: they wait for it
    req = SearchRequest(model=str(model_dir), target="h100-sxm", runtime="vllm",
                        # enough trials that workers get batches: the driver samples one in
                        # ~1.5 ms (TableStudy), so 300 could all be done before a worker joins
                        trials=2000, out=out, workload=WORKLOAD, storage=url, study=STUDY,
                        **FAST)
    storage = open_storage(url)
    result: dict[str, SearchOutcome] = {}
    search = threading.Thread(target=lambda: result.update(
        outcome=run_search(req, _AfterWorkersJoin(storage, n_workers))))
    search.start()
    killed = _kill_mid_batch(storage, workers[0], search)
    search.join(timeout=300)
    assert "outcome" in result
    outputs = [w.communicate(timeout=60)[0].decode() for w in workers]
    outcome = result["outcome"]
    _check_exact(storage, outcome)
    trials = _stored(storage, STUDY)
    by = Counter(stored_by(t)[0].split("/")[1] for t in trials)
    assert len(by) >= 2, by  # the trials were shared
    assert len(JobQueue(storage, STUDY).workers()) == len(workers)
    for w, text in zip(workers[1:], outputs[1:], strict=True):
        assert w.returncode == 0 and "the search is done" in text, text
    if killed is not None:
        held, stored_before = killed
        assert workers[0].returncode == -signal.SIGKILL
        kept = {t.number for t in trials}
        assert set(stored_before) <= kept  # nothing it had stored was lost
        jobs = _stored(storage, f"{STUDY}.jobs")
        states = {t.number: t.state for t in jobs}
        if states[held.number] != TrialState.COMPLETE:  # killed before it finished the batch
            assert states[held.number] == TrialState.FAIL
            retries = [t for t in jobs if t.system_attrs.get("failed_trial") == held.number]
            assert [t.state for t in retries] == [TrialState.COMPLETE]
            batch = [t for t in trials if stored_by(t)[1] == held.user_attrs["batch"]]
            assert len(batch) == held.user_attrs["size"]  # its running trial alone was redone
    # the plan was written once, by the search; the workers wrote none
    assert out.exists() and sorted(p.name for p in tmp_path.glob("*.json")) == ["plan.json"]
    assert outcome.plan.search.trials == sum(r.trials for r in outcome.plan.search.rounds)


def test_three_postgres_workers_one_search_one_killed(postgres: str, model_dir: Path,
                                                       tmp_path: Path) -> None:
    _shared_search(postgres, model_dir, tmp_path, 3)


def test_a_journal_worker_killed_mid_batch(model_dir: Path, tmp_path: Path) -> None:
    _shared_search(f"journal:{tmp_path / 'study.journal'}", model_dir, tmp_path, 1)


# ---- the queue's pieces, in one process --------------------------------------------------
@pytest.fixture(scope="module")
def setup():  # noqa: ANN201 - (tables, cost, limit)
    tables, cost, _ = llama_tables(n_layers=4)
    full = sum(float(q.max()) for q in tables.quality)
    return tables, cost, 0.15 * full


def _journal(tmp_path: Path, grace_s: int = 30):  # noqa: ANN202
    return open_storage(f"journal:{tmp_path / 'q.journal'}", heartbeat_s=1, grace_s=grace_s)


def test_stored_trials_hold_one_attribute_and_resume_the_sampler(setup, tmp_path: Path) -> None:  # noqa: ANN001
    tables, cost, limit = setup
    storage = _journal(tmp_path)
    cfg = StudyConfig(Objective.THROUGHPUT, 60, 0, "s", storage)
    first = run_study(tables, limit, cost, cfg, [[0] * len(tables.space.units)])
    stored = _stored(storage, "s")
    assert len(stored) == 60 and all(not t.params and set(t.user_attrs) == {"trial"}
                                     for t in stored)
    worker, batch = stored_by(stored[0])
    assert worker.startswith(worker_id()) and batch == "s#0"
    again = run_study(tables, limit, cost, cfg)  # every stored trial is read back
    assert again.resumed == 60 and [c.picks for c in again.candidates] == \
        [c.picks for c in first.candidates]


def test_trials_stored_with_parameters_by_an_older_autoplan_still_resume(setup, tmp_path: Path
                                                                         ) -> None:  # noqa: ANN001
    tables, cost, limit = setup
    storage = _journal(tmp_path)
    memory = run_study(tables, limit, cost, StudyConfig(Objective.THROUGHPUT, 30, 0, "m", None),
                       [[0] * len(tables.space.units)])
    old = optuna.create_study(study_name="s", storage=storage, directions=["maximize"])
    for c in memory.candidates[:5]:  # the old format: one Optuna parameter per unit
        old.add_trial(optuna.trial.create_trial(
            params={u.name: tables.labels[i][p] for i, (u, p) in
                    enumerate(zip(tables.space.units, c.picks, strict=True))},
            distributions={u.name: optuna.distributions.CategoricalDistribution(tables.labels[i])
                           for i, u in enumerate(tables.space.units)},
            value=c.value, user_attrs={"surrogate": c.surrogate}))
    res = run_study(tables, limit, cost, StudyConfig(Objective.THROUGHPUT, 20, 0, "s", storage))
    assert res.resumed == 5 and res.n_trials == 20 and len(_stored(storage, "s")) == 20
    assert {c.picks for c in memory.candidates[:5]} <= {c.picks for c in res.candidates}


def test_a_retried_batch_runs_only_the_trials_its_killed_holder_had_not_stored(
        setup, tmp_path: Path) -> None:  # noqa: ANN001
    tables, cost, limit = setup
    storage = _journal(tmp_path)
    cfg = StudyConfig(Objective.THROUGHPUT, 25, 0, "s", storage)
    queue = JobQueue(storage, "s")
    queue.plan_batches("s", 25, 0, {"limit": limit})
    study = RoundStudy(tables, limit, cost, cfg, storage)
    with queue.claim(lambda j: True) as job:
        assert job is not None and job.attrs["size"] == 25
        study.run(10, job.attrs["batch"])  # 10 stored, then the holder "dies"
        queue.storage.set_trial_state_values(job.trial_id, TrialState.FAIL)
        retry_stale_job(queue.study, queue.storage.get_trial(job.trial_id))
    with queue.claim(lambda j: True) as retry:
        assert retry is not None and retry.retry and retry.attrs["batch"] == job.attrs["batch"]
        run_batch(queue, retry, RoundStudy(tables, limit, cost, cfg, storage))
    assert len(_stored(storage, "s")) == 25 and queue.batches_done("s")


@pytest.mark.parametrize("kind", ["journal", "postgresql"])
def test_a_job_whose_heartbeat_stopped_is_failed_and_requeued(kind: str, tmp_path: Path,
                                                              request: pytest.FixtureRequest
                                                              ) -> None:
    if kind == "journal":
        storage = _journal(tmp_path, grace_s=1)
    else:  # Optuna's own heartbeats, in the database, on the database's clock
        storage = open_storage(request.getfixturevalue("postgres"), heartbeat_s=1, grace_s=1)
    queue = JobQueue(storage, f"hb-{tmp_path.name}")
    queue.submit_verify([1, 2], "c1")
    with queue.claim(lambda j: True) as job:  # held, beating, by a live process
        queue.storage.set_trial_system_attr(job.trial_id, "owner", {
            "worker": "another-host/1/1", "claimed": queue.storage.get_trial(
                job.trial_id).datetime_start.isoformat()})  # one this machine cannot see
    # the holder left the `with` without finishing: its heartbeat stopped
    time.sleep(2.5)
    queue.fail_stale()
    states = [t.state for t in queue.jobs()]
    assert states == [TrialState.FAIL, TrialState.WAITING]
    assert queue.jobs()[1].user_attrs["picks"] == [1, 2]


def test_a_dead_local_process_loses_its_job_at_once(tmp_path: Path) -> None:
    storage = _journal(tmp_path)
    queue = JobQueue(storage, "s")
    queue.submit_verify([3], "c1")
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    dead = f"{worker_id().split('/')[0]}/{child.pid}/0"
    assert not process_alive(dead) and process_alive(worker_id())
    with queue.claim(lambda j: True) as job:
        queue.storage.set_trial_system_attr(job.trial_id, "owner", {
            "worker": dead, "claimed": queue.storage.get_trial(
                job.trial_id).datetime_start.isoformat()})
        queue.fail_stale()  # well inside the grace period
        assert not queue.still_mine(job) and not queue.complete(job)
    assert [t.state for t in queue.jobs()] == [TrialState.FAIL, TrialState.WAITING]


def test_a_second_search_on_a_driven_study_is_refused(tmp_path: Path) -> None:
    storage = _journal(tmp_path)
    with JobQueue(storage, "s").driving("s", "use autoplan worker"):
        with pytest.raises(UserInputError, match="already being searched.*autoplan worker"):
            with JobQueue(storage, "s").driving("s", "use autoplan worker"):
                pass
    with JobQueue(storage, "s").driving("s", "use autoplan worker"):  # released: fine again
        assert JobQueue(storage, "s").driver_alive()


def test_a_worker_for_a_study_that_never_starts_stops_with_one_line(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from autoplan.cli import cli

    result = CliRunner().invoke(cli, ["worker", "--storage", f"journal:{tmp_path / 'j.journal'}",
                                      "--study", "nope", "--wait", "0", "--quiet"])
    assert result.exit_code == 2
    assert result.output.startswith("error: no search named nope") and \
        "autoplan search --storage URL --study nope" in result.output
    assert len(result.output.strip().splitlines()) == 1
