"""The docs table of benchmarks/search_quality.py's results (docs/search-quality.md).

Usage:
  python benchmarks/search_quality_table.py [benchmarks/results/search_quality*.json ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from search_quality import answer_uses_budget  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

HEADER = ("| model | target / runtime | budget | uncertainty | reference mix: KL, evals | "
          "stronger reference: KL, evals | search (min gain 0): KL, evals | x reference | "
          "x stronger | P4 | stopped | answer (noise rule) | answer KL | answer P4 | goals |")


def _strong(r: dict) -> tuple[str, str]:
    """The stronger reference's cells: its KL and evaluations and the plan over it; 'same'
    where it is the reference (a faster uniform recipe fails); '-' in a row run before it."""
    strong = r.get("reference_strong")
    if strong is None:
        return ("same", "same") if r["reference"]["faster_b"] is not None else ("-", "-")
    if not strong.get("extended"):
        return "same", "same"
    return (f"{strong['kl']:.4f}, {strong['real_evaluations']}",
            f"{r['plan_over_strong_reference_ratio']:.4f}")


def _goals(r: dict) -> str:
    goals = dict(r["goals"])
    if goals.get("answer_uses_budget") is not None:  # read again from the recorded plan
        goals["answer_uses_budget"] = answer_uses_budget(r["plan"], r["limit"])
    failed = [k for k, v in goals.items() if v is False]
    return "all met" if not failed else "missed: " + ", ".join(failed)


def row_line(model: str, r: dict) -> str:
    ref, loose, plan = r["reference"], r["plan_min_gain_0"], r["plan"]
    strong, over_strong = _strong(r)
    return (f"| {model} | {r['target']} / {r['runtime']} | {r['budget']} "
            f"| {r['speed_uncertainty']['relative']:.1%} "
            f"| {ref['kl']:.4f}, {ref['real_evaluations']} | {strong} "
            f"| {loose['kl']:.4f}, {loose['real_evaluations']} "
            f"| {r['plan_over_reference_ratio']:.4f} | {over_strong} "
            f"| {r['p4_plan_over_best_uniform']:.4f} "
            f"| {loose['stopped'].split(':')[0]} | {plan['label']} ({plan['outcome']}) "
            f"| {plan['kl']:.4f} | {r['p4_answer_over_best_uniform']:.4f} "
            f"| {_goals(r)} |")


def table(paths: list[Path]) -> str:
    lines = [HEADER, "|" + "---|" * HEADER.count(" | ") + "---|"]
    for path in paths:
        doc = json.loads(path.read_text())
        model = Path(doc["model"]).name  # a folder: its name, not where it lies
        lines += [row_line(model, r) for r in doc["rows"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    paths = [Path(a) for a in args] or sorted(RESULTS.glob("search_quality*.json"))
    print(table(paths))


if __name__ == "__main__":
    main()
