"""The code's shape, counted: the import graph's cycles and back-arrows, climb-backs following
a compare request, lines per search subpackage, Any-typed seams, long module docstrings.

Each count uses the rule its test enforces (tests/unit/test_layering.py, test_typed_seams.py,
test_module_docstrings.py), imported from there so the figure and the test cannot disagree.

    python benchmarks/house.py [--out benchmarks/results/house.json]
"""

from __future__ import annotations

import argparse
import graphlib
import importlib.util
import shlex
import sys
from pathlib import Path

from _common import write_result

ROOT = Path(__file__).resolve().parents[1]


def _test_module(name: str):  # noqa: ANN202 - a module
    spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "unit" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _cycles(graph: dict) -> int:
    try:
        graphlib.TopologicalSorter({a: set(b) for a, b in graph.items()}).prepare()
    except graphlib.CycleError:
        return 1  # at least one; the test names it
    return 0


def _back_arrows(graph: dict, layers: dict) -> list[str]:
    return sorted(line for a, arrows in graph.items() for b, lines in arrows.items()
                  if a in layers and b in layers and layers[b] >= layers[a] for line in lines)


def _lines(folder: Path) -> int:
    return sum(len(p.read_text().splitlines()) for p in folder.rglob("*.py"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "house.json")
    args = ap.parse_args(argv)

    layering = _test_module("test_layering")
    seams = _test_module("test_typed_seams")
    docstrings = _test_module("test_module_docstrings")

    graph = layering.import_graph()
    inside = layering.import_graph(inside=layering.SEARCH)
    compare = [p.read_text() for p in sorted((ROOT / "autoplan" / "compare").glob("*.py"))]
    search = ROOT / "autoplan" / "search"
    modules = sorted([*(ROOT / "autoplan").rglob("*.py"), *(ROOT / "backends").rglob("*.py")])
    long_docs = {str(p.relative_to(ROOT)): n for p in modules
                 if (n := docstrings._doc_lines(p)) > docstrings.MAX_LINES}
    untyped = seams._untyped_seams()
    climbs = layering.climb_backs(compare)
    doc = {
        "command": "python " + " ".join(shlex.quote(a) for a in [sys.argv[0],
                                                                *(argv or sys.argv[1:])]),
        "packages": len(set(graph) | {b for arrows in graph.values() for b in arrows}),
        "cycles": _cycles(graph),
        "back_arrows": _back_arrows(graph, layering.declared_layers()),
        "search_cycles": _cycles(inside),
        "search_back_arrows": _back_arrows(
            inside, layering.declared_layers("## Layers inside search\n", layering.SEARCH)),
        "compare_climb_backs": len(climbs),
        "compare_climb_back_calls": climbs,
        "search_subpackage_lines": {p.name: _lines(p) for p in sorted(search.iterdir())
                                    if (p / "__init__.py").exists()},
        "seams": sorted(seams.SEAMS),
        "seams_typed_any_or_object": len(untyped),
        "seams_typed_any_or_object_where": untyped,
        "modules": len(modules),
        "module_docstrings_over_lines": docstrings.MAX_LINES,
        "module_docstrings_over": long_docs,
    }
    write_result(args.out, doc)
    for key, value in doc.items():
        if not isinstance(value, (list, dict)) or key in ("search_subpackage_lines",
                                                          "module_docstrings_over"):
            print(f"{key}: {value}")
        else:
            print(f"{key}: {len(value)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
