"""The house drawn from the code's imports: packages only point down.

Every import in autoplan/ and backends/ (module level and inside functions, found with ast,
so an import hidden in a function to dodge a cycle still counts) is an arrow between
packages (``autoplan.X``; ``backends/`` is the one package ``autoplan.backends``). The test
asserts that the arrows form no cycle and that none points up against the layer order
written down in docs/architecture.md, "## Layers" (one source: the test reads it there).
The same holds one level down inside ``autoplan.search`` ("## Layers inside search"), whose
subpackages other code reaches only through their ``__all__``.
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


def _package(module: str, depth: int = 2) -> str:
    return ".".join(module.split(".")[:depth])


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


SEARCH = "autoplan.search"


def import_graph(inside: str | None = None) -> dict[str, dict[str, list[str]]]:
    """package -> imported package -> the 'module -> module' lines that make the arrow.

    With ``inside`` (a package), its subpackages and top-level modules are the nodes, and
    only imports between them count; the package's own ``__init__`` (its front door, which
    re-exports them all) is left out.
    """
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    files = [*(ROOT / "autoplan").rglob("*.py"), *(ROOT / "backends").rglob("*.py")]
    depth = 2 if inside is None else inside.count(".") + 2
    for path in files:
        module = _module(path)
        if inside is not None and not module.startswith(inside + "."):
            continue
        for target in _imports(path, module):
            if inside is not None and not target.startswith(inside + "."):
                continue
            a, b = _package(module, depth), _package(target, depth)
            if a != b:
                graph[a][b].append(f"{module} -> {target}")
    return graph


def declared_layers(heading: str = "## Layers\n", prefix: str = "autoplan") -> dict[str, int]:
    """package -> layer number, from a block of docs/architecture.md (by its heading)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split(heading, 1)[1]
    block = section.split("```", 2)[1]
    layers: dict[str, int] = {}
    for line in block.splitlines():
        match = re.match(r"\s*(\d+)\s+(.+)", line)
        if match:
            for name in match.group(2).split(","):
                layers[f"{prefix}.{name.strip()}"] = int(match.group(1))
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


def test_search_subpackages_only_point_down() -> None:
    graph = import_graph(inside=SEARCH)
    layers = declared_layers("## Layers inside search\n", SEARCH)
    nodes = set(graph) | {b for arrows in graph.values() for b in arrows}
    nodes |= {f"{SEARCH}.{p.stem if p.is_file() else p.name}"
              for p in (ROOT / "autoplan" / "search").iterdir()
              if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    missing = sorted(nodes - set(layers))
    assert not missing, f"add {missing} to docs/architecture.md, ## Layers inside search"
    upward = [line for a, arrows in graph.items() for b, lines in arrows.items()
              if layers[b] >= layers[a] for line in lines]
    assert not upward, "search imports against its layer order:\n" + "\n".join(sorted(upward))


def _public_names(module: str) -> set[str] | None:
    """A package's ``__all__`` as written in its __init__ (None: not a package)."""
    init = ROOT / Path(*module.split(".")) / "__init__.py"
    if not init.exists():
        return None
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return {elt.value for elt in node.value.elts}  # type: ignore[attr-defined]
    return set()


def test_search_is_used_through_its_public_api() -> None:
    """Outside autoplan.search, code imports the front door, a subpackage's ``__all__`` or a
    public module (reporter, writable); only tests may reach a private name, by its own
    private name (monkeypatching a module, checking a private class)."""
    bad = []
    files = [p for d in ("autoplan", "backends", "benchmarks", "examples", "tests")
             for p in (ROOT / d).rglob("*.py")]
    for path in files:
        module = _module(path) if path.parts[len(ROOT.parts)] in ("autoplan", "backends") \
            else str(path.relative_to(ROOT))
        if module.startswith(SEARCH + "."):
            continue
        is_test = path.parts[len(ROOT.parts)] == "tests"
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(SEARCH):
                continue
            private_module = any(part.startswith("_") for part in node.module.split("."))
            public = _public_names(node.module)
            for alias in node.names:
                if is_test and alias.name.startswith("_"):
                    continue
                if private_module or (public is not None and alias.name not in public):
                    bad.append(f"{path.relative_to(ROOT)}: from {node.module} import {alias.name}")
    assert not bad, "import these through autoplan.search's public API:\n" + "\n".join(bad)


def climb_backs(sources: list[str]) -> list[str]:
    """The calls in these modules into the search's stages: each is a point where following
    a request means going down into the search, coming back up here and going down again.

    A call counts when its callee was imported from ``autoplan.search`` (any subpackage) or
    ``autoplan.plan.io``, or is a method of an object such a call returned
    (``pipeline = Pipeline(...)`` then ``pipeline.run()``). Attribute reads and the
    progress sink (``Reporter()``) do not count.
    """
    calls: list[str] = []
    for text in sources:
        tree = ast.parse(text)
        imported = {a.asname or a.name for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom)
                    and (node.module or "").startswith(("autoplan.search", "autoplan.plan.io"))
                    for a in node.names} - {"Reporter"}
        made = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
                and node.value.func.id in imported for t in node.targets
                if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if isinstance(f, ast.Name) and f.id in imported:
                calls.append(f"{f.id}() line {node.lineno}")
            elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) \
                    and f.value.id in made:
                calls.append(f"{f.value.id}.{f.attr}() line {node.lineno}")
    return calls


def test_following_a_compare_request_climbs_back_at_most_3_times() -> None:
    """compare runs the search's Pipeline instead of sequencing the stages itself (it
    called 12 of them by hand: preflight, open_model_work, ... build_plan, save_plan)."""
    sources = [p.read_text() for p in sorted((ROOT / "autoplan" / "compare").glob("*.py"))]
    calls = climb_backs(sources)
    assert len(calls) <= 3, calls


def test_no_package_imports_another_packages_private_module() -> None:
    """A private module (``_name``) or name is its package's own; others use its public API."""
    bad = []
    for path in [*(ROOT / "autoplan").rglob("*.py"), *(ROOT / "backends").rglob("*.py")]:
        module = _module(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(
                    "autoplan.") or _package(node.module) == _package(module):
                continue
            private = [a.name for a in node.names if a.name.startswith("_")
                       and not a.name.startswith("__")]
            if any(p.startswith("_") for p in node.module.split(".")[1:]) or private:
                bad.append(f"{module} -> {node.module} {[a.name for a in node.names]}")
    assert not bad, "import through the package's public API:\n" + "\n".join(bad)
