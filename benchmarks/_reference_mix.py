"""A reference best mix found with real measurements only, to judge the search against.

Between the best acceptable uniform recipe A (the fastest that passes, or the model as is)
and a faster recipe B (which fails), the units B makes faster are ordered by the profile's
time saved per unit of surrogate damage (A -> B), and the mix "first k units at B, the rest
at A" is bisected on k with real measurements: the largest k that passes. B is the next
faster recipe, then the fastest one; the reference is the faster of the two mixes. The
profile only orders the units; every pass/fail is measured. Uniform recipes are measured
as the search measures them (fastest first, a failing pass stopped once the budget is
certainly exceeded), so both count their real evaluations alike, but all of them until one
is acceptable where the search stops after six.

When the fastest uniform recipe passes there is no B and that reference stops at A. The
stronger reference (`stronger_reference`) then bisects on from A toward F, each unit's
fastest choice (by the tables' time; of equal times, the least surrogate damage), the units
ordered the same way, every step measured (F's own end too: it is not a recipe known to
fail). Where a faster recipe fails, it is the reference above.

    reference_mix(prep, rep) -> Reference     (prep: autoplan.search.Prepared, fresh verifier)
    stronger_reference(prep, rep, ref) -> Reference   (the same prep, after reference_mix)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Reference:
    picks: tuple[int, ...]
    label: str
    objective: float
    badness: float
    evaluations: int  # real passes (the uncompressed model, known without one, not counted)
    uniform: str  # A: the best acceptable uniform recipe (or the model as is)
    faster: str | None  # B
    uniform_picks: tuple[int, ...] = ()
    steps: list[dict[str, Any]] = field(default_factory=list)  # the bisection, in order
    extended: bool = False  # a stronger reference that bisected on past A (stronger_reference)
    a_is_fastest: bool = False  # no uniform recipe (or the model as is) is faster than A


def real_evaluations(prep: Any) -> int:
    """Candidates measured with a pass on the real model (the baseline is known without)."""
    return sum(1 for k in prep.verifier.measured if k != prep.baseline_picks)


def reference_mix(prep: Any, rep: Any) -> Reference:
    """The reference best mix of `prep`'s platform (see module doc)."""
    from autoplan.search.stages import acceptable, recipes

    verifier = prep.verifier
    faster: list[tuple[str, tuple[int, ...]]] = []  # failing recipes faster than A
    best_a: tuple[str, tuple[int, ...]] | None = None
    for label, picks in recipes(prep):  # every one until one is acceptable (the search: 6)
        m = verifier.measure(picks, label, bounded=picks != prep.as_is.picks)
        if acceptable(prep, m):
            best_a = (label, picks)
            break
        faster.append((label, picks))
    if best_a is None:  # nothing acceptable: the baseline
        best_a = ("baseline", prep.baseline_picks)
        verifier.measure(prep.baseline_picks, "baseline")
    label_a, a = best_a
    best = Reference(a, label_a, prep.value(a), verifier.measured[a].badness, 0, label_a, None,
                     a, a_is_fastest=not faster)
    # toward the next faster recipe and toward the fastest: the best of both bisections
    for label_b, b in dict.fromkeys([*faster[-1:], *faster[:1]]):
        found = _bisect(prep, rep, a, label_a, b, label_b)
        if prep.sign * found.objective < prep.sign * best.objective:
            best = found
    best.evaluations = real_evaluations(prep)
    return best


FASTEST = "each unit's fastest choice"


def fastest_picks(prep: Any) -> tuple[int, ...]:
    """Each unit's fastest choice by the tables' time (ties: the least surrogate damage)."""
    tables = prep.tables
    return tuple(min(range(len(tables.total_time(u))),
                     key=lambda c, u=u: (float(tables.total_time(u)[c]),
                                         float(tables.quality[u][c])))
                 for u in range(len(tables.space.units)))


def stronger_reference(prep: Any, rep: Any, ref: Reference) -> Reference:
    """`ref` where a uniform recipe faster than A fails; where none does (A is the fastest
    recipe), the better of `ref` and the bisection from A toward each unit's fastest choice.
    Its evaluations count every real pass on `prep`'s verifier, `ref`'s included."""
    if not ref.a_is_fastest:
        return Reference(**{**ref.__dict__, "steps": list(ref.steps)})
    a = ref.uniform_picks
    best = Reference(**{**ref.__dict__, "steps": [], "extended": True})
    f = fastest_picks(prep)
    if f != a:
        found = _bisect(prep, rep, a, ref.uniform, f, FASTEST, measure_end=True)
        found.extended = True
        if prep.sign * found.objective < prep.sign * best.objective:
            best = found
        else:
            best.steps = found.steps
    best.evaluations = real_evaluations(prep)
    return best


def _bisect(prep: Any, rep: Any, a: tuple[int, ...], label_a: str, b: tuple[int, ...],
            label_b: str, measure_end: bool = False) -> Reference:
    """The largest k whose mix (the k units B speeds up most per unit of surrogate damage at
    B, the rest at A) passes when measured (`measure_end`: B itself is measured too, not
    known to fail)."""
    verifier, tables, metric = prep.verifier, prep.tables, prep.req.budget.metric
    gains = []
    for u in range(len(a)):
        t = tables.total_time(u)
        dt = float(t[a[u]] - t[b[u]])
        if dt <= 0:
            continue  # B is not faster on this unit
        dq = float(tables.quality[u][b[u]] - tables.quality[u][a[u]])
        gains.append((dt / dq if dq > 0 else float("inf"), u))
    order = [u for _, u in sorted(gains, key=lambda g: -g[0])]

    def mix(k: int) -> tuple[int, ...]:
        picks = list(a)
        for u in order[:k]:
            picks[u] = b[u]
        return tuple(picks)

    steps: list[dict[str, Any]] = []

    def passes(k: int) -> bool:
        m = verifier.measure(mix(k), f"reference k={k} toward {label_b}")
        steps.append({"toward": label_b, "k": k, "badness": m.badness, "passed": m.passed})
        rep.note(f"reference: {k} of {len(order)} units at {label_b}: {metric} "
                 f"{m.badness:.4g} ({'passes' if m.passed else 'fails'})")
        return m.passed

    lo, hi = 0, len(order)  # mix(lo) passes; mix(hi) fails (B itself, or measured so)
    if (measure_end or mix(hi) != b) and passes(hi):
        lo = hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if passes(mid) else (lo, mid)
    found = mix(lo)
    label = label_a if lo == 0 else f"{lo} of {len(order)} units {label_b}, rest {label_a}"
    return Reference(found, label, prep.value(found), verifier.measured[found].badness, 0,
                     label_a, label_b, a, steps)


__all__ = ["FASTEST", "Reference", "fastest_picks", "real_evaluations", "reference_mix",
           "stronger_reference"]
