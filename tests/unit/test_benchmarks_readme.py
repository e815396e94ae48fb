"""benchmarks/README.md names every script and covers every results file."""

from __future__ import annotations

from fnmatch import fnmatch
from pathlib import Path
import re

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
README = (BENCH / "README.md").read_text()


def _results_patterns() -> list[str]:
    """The results column of the scripts' table, a placeholder in capitals read as a wildcard."""
    patterns = []
    for line in README.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            for name in re.findall(r"`([^`]+\.json)`", cells[2]):
                patterns.append(re.sub(r"[A-Z]+", "*", name))
    return patterns


def test_every_script_is_named() -> None:
    scripts = sorted(p.name for p in BENCH.iterdir() if p.suffix in {".py", ".sh"})
    assert scripts
    missing = [s for s in scripts if f"`{s}`" not in README]
    assert not missing, f"benchmarks/README.md does not name {missing}"


def test_every_named_script_exists() -> None:
    named = set(re.findall(r"`([\w.]+\.(?:py|sh))`", README))
    assert named
    gone = sorted(n for n in named if not (BENCH / n).exists())
    assert not gone, f"benchmarks/README.md names scripts that are not there: {gone}"


def test_every_results_file_has_a_script() -> None:
    patterns = _results_patterns()
    assert len(patterns) > 20
    files = sorted(p.name for p in (BENCH / "results").glob("*.json"))
    orphans = [f for f in files if not any(fnmatch(f, pat) for pat in patterns)]
    assert not orphans, f"no script in benchmarks/README.md writes {orphans}"
