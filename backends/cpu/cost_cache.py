"""A measured kernel table cached on disk per machine: rows accumulate, only missing ones
are timed. Shared by the ONNX Runtime (ort_microbench) and llama.cpp (ggml_microbench)
kernel tables, which differ only in how one row is timed and what makes a cache valid."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from autoplan.formats import Choice

Row = tuple[int, int, int, str]  # m, n, k, choice


def row_key(m: int, n: int, k: int, choice: Choice | str) -> Row:
    """The identity of a cost-table row (the format implies the kernel and its settings)."""
    c = Choice.parse(choice) if isinstance(choice, str) else choice
    return int(m), int(n), int(k), str(c)


def key_of(row: Mapping[str, Any]) -> Row:
    """The identity of a stored row."""
    return int(row["m"]), int(row["n"]), int(row["k"]), str(row["choice"])


def _read(path: Path) -> dict[str, Any]:
    """A cached table, or {} when unreadable (it is then re-measured). Rows need their
    timing fields; their choice is not parsed here (a llama.cpp table also keeps rows of
    source-file types autoplan does not plan with, e.g. ``gguf:Q4_K``)."""
    import json

    from autoplan.backends.microbench import SCHEMA_VERSION

    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    need = {"m", "n", "k", "choice", "median_us", "p10_us", "p90_us"}
    rows = data.get("rows") if isinstance(data, dict) else None
    if data.get("schema_version") != SCHEMA_VERSION or not isinstance(rows, list) or \
            any(not isinstance(r, dict) or need - r.keys() for r in rows):
        return {}
    return data


def cached_table(path: Path, header: dict[str, Any], wanted: Iterable[Row],
                 time_row: Callable[[Row], dict[str, Any]] | None, *, match: tuple[str, ...],
                 refresh: bool = False, progress: Callable[[str], None] | None = None,
                 label: str = "kernel",
                 time_rows: Callable[[list[Row]], Iterator[dict[str, Any]]] | None = None,
                 ) -> dict[str, Any]:
    """The cost table (``header`` + ``rows``) holding every wanted row, every shape's rows
    timed in one session.

    Args:
        path: the cache file (read if present, written back when rows were timed, also
            when timing stopped on an error: the rows timed until then are kept).
        header: the table's header fields for this machine and method.
        wanted: rows needed.
        time_row: times one missing row, returning the stored row dict.
        time_rows: instead of time_row, times all missing rows together (e.g. interleaved),
            yielding each stored row dict when it is done.
        match: header fields a cached table must share to be reused (else re-measured).
        refresh: ignore the cache.
        progress: called with one line per row timed.
        label: what the progress line calls a row.
    """
    from autoplan.backends.microbench import write_cost_table

    table = {**header, "rows": [], "skipped": []}
    if path.is_file() and not refresh:
        old = _read(path)
        if old and all(old.get(k) == header.get(k) for k in match):
            table["rows"] = list(old["rows"])
    have = {key_of(r) for r in table["rows"]}
    missing = [w for w in dict.fromkeys(wanted) if w not in have]
    # A shape's rows are compared with each other (which format is faster), so they are
    # timed in one session: a cached row of a shape that gains a row is timed again with it,
    # not left from another hour's load (a new format timed on a quiet machine beside rows
    # timed under load would look faster than it is).
    shapes = {row[:3] for row in missing}
    again = [key_of(r) for r in table["rows"] if key_of(r)[:3] in shapes]
    if again:
        table["rows"] = [r for r in table["rows"] if key_of(r)[:3] not in shapes]
        missing = list(dict.fromkeys([*again, *missing]))
    done = 0
    try:
        if time_rows is not None:
            if missing and progress:
                progress(f"timing {len(missing)} {label} rows")
            for out in time_rows(missing):
                table["rows"].append(out)
                done += 1
        else:
            assert time_row is not None
            for i, row in enumerate(missing):
                if progress:
                    m, n, k, choice = row
                    progress(f"{label} {i + 1}/{len(missing)}: m={m} n={n} k={k} {choice}")
                table["rows"].append(time_row(row))
                done += 1
    finally:
        if done:
            write_cost_table(table, path)
    return table


def nearest_rank(values: Iterable[float], q: float) -> float:
    """The q-quantile of timed runs by nearest rank (p10 / p90 of a kernel row): the same
    rule for every runtime's table, so their spreads compare."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


__all__ = ["Row", "cached_table", "key_of", "nearest_rank", "row_key"]
