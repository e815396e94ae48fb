"""A worker says when it waits: for a search that has not started (at once, with how long),
and for work while the search's queue holds none for it (once, then as its stage)."""

from __future__ import annotations

import contextlib
import time

import pytest

from autoplan.errors import UserInputError
from autoplan.search.reporter import Reporter
from autoplan.search.run import _worker


class _Said(Reporter):
    def __init__(self) -> None:
        self.t0, self.lines = time.monotonic(), []

    def stage(self, name: str) -> None:
        self.lines.append(("stage", name, time.monotonic() - self.t0))

    def note(self, text: str) -> None:
        self.lines.append(("note", text, time.monotonic() - self.t0))


class _Queue:
    """A job queue whose claims give `script`'s jobs in turn (None: nothing queued now)."""

    def __init__(self, script: list) -> None:
        self.script, self.ran = list(script), []

    def fail_stale(self) -> None: ...

    @contextlib.contextmanager
    def claim(self, _accept):  # noqa: ANN001, ANN202
        yield self.script.pop(0) if self.script else None

    def attr(self, name: str):  # noqa: ANN202
        return name == "done" and not self.script

    def driver_alive(self) -> bool:
        return True


def test_a_missing_search_is_said_at_once_with_the_wait(monkeypatch):
    said = _Said()
    with pytest.raises(UserInputError, match="no search named s1 .* after 1.5 s"):
        _worker._wait_for_record(lambda: None, "s1", "journal", 1.5, said)
    notes = [(text, t) for kind, text, t in said.lines if kind == "note"]
    assert len(notes) == 1 and "waiting up to 1.5 s" in notes[0][0]
    assert notes[0][1] < 0.5, "the wait must be said before waiting, not after"


def test_an_empty_queue_is_said_once_then_shown_as_the_stage(monkeypatch):
    monkeypatch.setattr(_worker, "POLL_S", 0.0)
    queue = _Queue(["a", None, None, "b", None, "c"])
    said = _Said()
    reason = _worker._serve(queue, queue.ran.append, "s1", 60.0, said)
    assert reason == "the search is done" and queue.ran == ["a", "b", "c"]
    notes = [text for kind, text, _ in said.lines if kind == "note"]
    assert len(notes) == 1 and "waiting for the search s1" in notes[0] and "60 s" in notes[0]
    stages = [text for kind, text, _ in said.lines if kind == "stage"]
    assert stages == ["working for s1", "waiting for work from s1", "working for s1",
                      "waiting for work from s1", "working for s1"]
