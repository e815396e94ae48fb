"""`autoplan search` as a library call: the pipeline on one platform.

The process running it drives the search: it holds the study's driver job (a second
search on the same study is refused), records its request for `autoplan worker`
processes, shares the rounds' work with them through the job queue, and alone writes the
plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autoplan.plan import schema as ps
from autoplan.search.reporter import Reporter
from autoplan.search.run._pipeline import Pipeline, Searched
from autoplan.search.request import SearchRequest


@dataclass
class SearchOutcome:
    plan: ps.Plan
    front: list[dict] = field(default_factory=list)


def run_search(req: SearchRequest, reporter: Reporter | None = None) -> SearchOutcome:
    """Run a whole search and write its plan to `req.out`.

    Raises:
        UserInputError: bad input, refused before the work that would have found it.
    """
    (searched,) = Pipeline([req], reporter).run()
    assert isinstance(searched, Searched)  # nothing is skipped without skip_unfit
    return SearchOutcome(searched.plan, searched.front)


__all__ = ["SearchOutcome", "run_search"]
