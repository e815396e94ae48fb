"""`CompareRequest`: one search request template and the (target, runtime) pairs to run it on.

Everything the arguments alone can show to be wrong is refused here, before a model is
loaded: an unknown target (the message names the nearest one), an unknown runtime, a
`--runtime T=R` for a target that is not in the list, a target listed twice.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from autoplan.backends.registry import resolve_target
from autoplan.errors import UserInputError
from autoplan.runtimes import default_runtime, get_runtime
from autoplan.search import SearchRequest


@dataclass(frozen=True)
class CompareEntry:
    """One search of the comparison: a target with one of its runtimes."""

    target: str  # the catalog name (aliases resolved)
    runtime: str

    @property
    def name(self) -> str:
        """The plan's file stem in the output folder."""
        return f"{self.target}.{self.runtime}"


def parse_entries(targets: str | list[str],
                  runtimes: tuple[str, ...] = ()) -> tuple[CompareEntry, ...]:
    """`h100,mi300x` and `--runtime h100=tensorrt-llm --runtime h100=vllm`: one entry per
    target and runtime (a target without `--runtime` gets its default runtime).

    Raises:
        UnknownNameError: a target or runtime that does not exist (naming the nearest one).
        UserInputError: an empty list, a target twice, a `T=R` whose T is not listed.
    """
    names = [t.strip() for t in (targets.split(",") if isinstance(targets, str) else targets)]
    names = [n for n in names if n]
    if not names:
        raise UserInputError("--targets is empty: list catalog targets, e.g. h100,mi300x,xeon-8480")
    resolved = [resolve_target(n) for n in names]
    seen: dict[str, str] = {}
    for given, t in zip(names, resolved, strict=True):
        if t.name in seen:
            raise UserInputError(f"target '{given}' is listed twice (as '{seen[t.name]}' too): "
                                 "give several runtimes with --runtime T=R instead")
        seen[t.name] = given
    by_target: dict[str, list[str]] = {}
    for spec in runtimes:
        target_text, sep, runtime = spec.partition("=")
        if not sep or not target_text.strip() or not runtime.strip():
            raise UserInputError(f"--runtime '{spec}': write TARGET=RUNTIME, "
                                 "e.g. h100=tensorrt-llm")
        t = resolve_target(target_text.strip())
        if t.name not in seen:
            raise UserInputError(f"--runtime '{spec}': target {t.name} is not in --targets")
        by_target.setdefault(t.name, []).append(get_runtime(runtime.strip()).name)
    entries = []
    for t in resolved:
        for runtime in dict.fromkeys(by_target.get(t.name) or [default_runtime(t)]):
            entries.append(CompareEntry(t.name, runtime))
    return tuple(entries)


@dataclass(frozen=True)
class CompareRequest:
    """The search settings every entry shares (`base`: model, budget, objective, workload or
    operating point, trials, compression settings...) and the entries."""

    base: SearchRequest
    entries: tuple[CompareEntry, ...]
    out_dir: Path = Path("compare")

    def __post_init__(self) -> None:
        object.__setattr__(self, "out_dir", Path(self.out_dir))
        if not self.entries:
            raise UserInputError("nothing to compare: pass --targets")

    def search_request(self, entry: CompareEntry) -> SearchRequest:
        """The entry's own search request: its plan and study journal in the folder."""
        return dataclasses.replace(self.base, target=entry.target, runtime=entry.runtime,
                                   out=self.out_dir / f"{entry.name}.json")


__all__ = ["CompareEntry", "CompareRequest", "parse_entries"]
