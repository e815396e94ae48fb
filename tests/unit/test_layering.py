"""The house drawn from the code's imports: packages only point down.

Every import in autoplan/ and backends/ (module level and inside functions, found with ast,
so an import hidden in a function to dodge a cycle still counts) is an arrow between
packages (``autoplan.X``; ``backends/`` is the one package ``autoplan.backends``). The test
asserts that the arrows form no cycle and that none points up against the layer order
written down in docs/architecture.md, "## Layers" (one source: the test reads it there).
"""

from __future__ import annotations

import ast
import graphlib
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "backends":
        parts.insert(0, "autoplan")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _imports(path: Path, module: str) -> list[str]:
    out: list[str] = []
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                out.append(".".join(base + ([node.module] if node.module else [])))
            else:
                out.append(node.module or "")
    return [m for m in out if m.startswith("autoplan.")]


def import_graph() -> dict[str, dict[str, list[str]]]:
    """package -> imported package -> the 'module -> module' lines that make the arrow."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    files = [*(ROOT / "autoplan").rglob("*.py"), *(ROOT / "backends").rglob("*.py")]
    for path in files:
        module = _module(path)
        for target in _imports(path, module):
            a, b = _package(module), _package(target)
            if a != b:
                graph[a][b].append(f"{module} -> {target}")
    return graph


def declared_layers() -> dict[str, int]:
    """package -> layer number, from docs/architecture.md's "## Layers" block."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Layers", 1)[1]
    block = section.split("```", 2)[1]
    layers: dict[str, int] = {}
    for line in block.splitlines():
        match = re.match(r"\s*(\d+)\s+(.+)", line)
        if match:
            for name in match.group(2).split(","):
                layers[f"autoplan.{name.strip()}"] = int(match.group(1))
    return layers


def test_every_package_has_a_declared_layer() -> None:
    graph, layers = import_graph(), declared_layers()
    packages = set(graph) | {b for arrows in graph.values() for b in arrows}
    missing = sorted(packages - set(layers))
    assert not missing, f"add {missing} to docs/architecture.md, ## Layers"


def test_no_cycle_between_packages() -> None:
    graph = import_graph()
    sorter = graphlib.TopologicalSorter({a: set(b) for a, b in graph.items()})
    try:
        sorter.prepare()
    except graphlib.CycleError as err:
        cycle = err.args[1]
        where = [line for a, b in zip(cycle, cycle[1:]) for line in graph[a][b][:2]]
        raise AssertionError(f"import cycle {' -> '.join(cycle)}: {where}") from None


def test_no_arrow_points_up() -> None:
    graph, layers = import_graph(), declared_layers()
    upward = [line for a, arrows in graph.items() for b, lines in arrows.items()
              if a in layers and b in layers and layers[b] >= layers[a] for line in lines]
    assert not upward, "imports against the layer order (or within one layer):\n" + "\n".join(
        sorted(upward))


def test_the_graph_sees_function_level_imports() -> None:
    """The drawing is real: a known import inside a function is an arrow in it."""
    graph = import_graph()
    lines = graph["autoplan.cli"]["autoplan.export"]
    assert any("autoplan.cli.export -> autoplan.export" in line for line in lines)
