"""Read what a GPU check call returned: keep it in benchmarks/results/ and write its tables into
docs/gpu.md (between the gpu-results markers), naming every correction candidate.

    python benchmarks/gpu_read.py FILES_AT [--label h200]

FILES_AT is the folder the `run` tool returned ($OUT's files: gpu_check.json, cost_table.json).
Copies them to benchmarks/results/gpu_check_LABEL.json and gpu_cost_table_LABEL.json, then
renders: section status, GPU test counts, search wall time beside the CPU reference, the
GEMM table (median us and speedup over bf16 per M), the analytic model's error per kernel
class, decode tokens/s and the streamed 8B profile. A class whose MAPE exceeds 15 %
(autoplan.cost.table_check.DISAGREE) is listed as a correction candidate: the rule in
docs/gpu.md says what a correction needs before it changes the cost model.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import write_result  # noqa: E402
RESULTS = HERE / "results"
DOC = HERE.parent / "docs" / "gpu.md"
BEGIN, END = "<!-- gpu-results:begin -->", "<!-- gpu-results:end -->"
DISAGREE = 0.15  # autoplan.cost.table_check.DISAGREE (not imported: this runs anywhere)


def render(report: dict[str, Any], source: str) -> str:
    """Markdown tables of one gpu_check.json."""
    secs = report["sections"]
    env = (secs.get("env") or {}).get("result", {}).get("env", {})
    out = [(f"Source: `{source}` ({report['mode']}, {env.get('device', 'no GPU')}, torch "
            f"{env.get('torch', '?')}, {report.get('elapsed_s', '?')} s of a "
            f"{report['budget_s']:.0f} s budget; command `{report.get('command', '?')}`)."), "",
           "| section | status | seconds | why not ok |", "| --- | --- | ---: | --- |"]
    out += [f"| {n} | {s['status']} | {s['seconds']} | {s.get('reason', '')} |"
            for n, s in secs.items()]
    res = lambda name: (secs.get(name) or {}).get("result") or {}
    if res("tests").get("counts"):
        t = res("tests")
        out += ["", f"GPU tests (`pytest -m gpu tests/gpu`): {t['counts']}"]
        out += [f"- FAILED `{f['test']}`: {f['message']}" for f in t.get("failed", [])]
    if "wall_s" in res("search"):
        s, ref = res("search"), res("search").get("cpu_reference") or {}
        out += ["", "| search (cold cache) | wall s | process CPU s | outcome | real evals |",
                "| --- | ---: | ---: | --- | ---: |",
                (f"| `{s['command']}` | {s['wall_s']} | {s.get('process_cpu_s', '-')} | "
                 f"{s.get('outcome')} | {s.get('real_evaluations')} |")]
        if ref:
            out.append(f"| same on CPU ({ref.get('machine', {}).get('cpu', '?')}, "
                       f"{ref.get('cpus', '?')} cores, load {ref.get('load_before', '?')}) | "
                       f"{ref.get('wall_s')} | {ref.get('process_cpu_s', '-')} | "
                       f"{ref.get('outcome')} | {ref.get('real_evaluations')} |")
    if res("gemm").get("rows"):
        out += ["", *gemm_table(res("gemm")["rows"])]
    if res("validate").get("classes"):
        v = res("validate")
        out += ["", (f"Analytic GEMM time vs measured on {v['target']}: MAPE {v['mape']:.1%} "
                     f"over {len(v.get('rows', []))} rows "
                     f"(`{v.get('command', 'autoplan validate')}`)"), "",
                "| choice | bound | rows | MAPE | mean error | > 15 %? |",
                "| --- | --- | ---: | ---: | ---: | --- |"]
        out += [f"| {c['choice']} | {c['bound']} | {c['rows']} | {c['mape']:.1%} | "
                f"{c['mean_error']:+.1%} | {'correction candidate' if c['disagrees'] else 'no'} |"
                for c in v["classes"]]
    if res("decode").get("decode"):
        out += ["", "| decode plan | batch | tokens/s | first-logits rel. err |",
                "| --- | ---: | ---: | ---: |"]
        for d in res("decode")["decode"]:
            tps = f"{d['tokens_per_s']:.1f}" if "tokens_per_s" in d else d.get("error", "")
            err = d.get("first_logits_rel_err")
            out.append(f"| {d['plan']} | {d.get('batch', '-')} | {tps} | "
                       f"{'' if err is None else f'{err:.3f}'} |")
    if res("stream").get("profile"):
        p, fig = res("stream")["profile"], lambda v: "-" if v is None else f"{v:.1f}"
        out += ["", (f"Streamed profile, {res('stream').get('shape', '?')} shape: "
                     f"`{p.get('command')}` {fig(p.get('wall_s'))} s, peak GPU "
                     f"{fig(p.get('peak_gpu_gib'))} GiB, peak host RSS "
                     f"{fig(p.get('peak_rss_gib'))} GiB (8B goal: <= 300 s, <= 40 GB)")]
    return "\n".join(out)


def gemm_table(rows: list[dict[str, Any]]) -> list[str]:
    """One row per (model, gemm, M): median us of each choice, and its speedup over bf16."""
    choices = list(dict.fromkeys(r["choice"] for r in rows))
    cells: dict[tuple, dict[str, float]] = defaultdict(dict)
    for r in rows:
        cells[(r.get("model", "?"), r.get("gemm", f"{r['n']}x{r['k']}"), r["m"])][r["choice"]] = r["median_us"]
    out = ["| model | GEMM | M | " + " | ".join(choices) + " |",
           "| --- | --- | ---: |" + " ---: |" * len(choices)]
    for (model, gemm, m), by in cells.items():
        base = by.get("dense+bf16")
        row = []
        for c in choices:
            us = by.get(c)
            if us is None:
                row.append("-")
            elif base and c != "dense+bf16":
                row.append(f"{us:.1f} ({base / us:.2f}x)")
            else:
                row.append(f"{us:.1f}")
        out.append(f"| {model} | {gemm} | {m} | " + " | ".join(row) + " |")
    return ["GEMM median us (speedup over dense bf16):", "", *out]


def corrections(report: dict[str, Any]) -> list[str]:
    """The kernel classes over DISAGREE: each one needs a correction with its evidence."""
    classes = ((report["sections"].get("validate") or {}).get("result") or {}).get("classes", [])
    return [f"{c['choice']} ({c['bound']}-bound): MAPE {c['mape']:.1%}, mean error "
            f"{c['mean_error']:+.1%} over {c['rows']} rows; worst m={c['worst']['m']} "
            f"n={c['worst']['n']} k={c['worst']['k']}: {c['worst']['measured_us']:.1f} us "
            f"measured, {c['worst']['predicted_us']:.1f} predicted"
            for c in classes if c["mape"] > DISAGREE]


def write_docs(text: str, doc: Path = DOC) -> None:
    """Replace the text between the gpu-results markers of docs/gpu.md."""
    page = doc.read_text()
    if BEGIN not in page or END not in page:
        raise SystemExit(f"error: {doc} has no {BEGIN} ... {END} block")
    head, rest = page.split(BEGIN, 1)
    doc.write_text(f"{head}{BEGIN}\n{text}\n{END}{rest.split(END, 1)[1]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files_at", type=Path, help="the folder holding the returned gpu_check.json")
    ap.add_argument("--label", default="h200", help="suffix of the results files")
    ap.add_argument("--no-docs", action="store_true", help="print the tables, leave docs alone")
    args = ap.parse_args(argv)
    src = args.files_at / "gpu_check.json"
    if not src.is_file():
        print(f"error: no gpu_check.json in {args.files_at}: pass the run tool's files_at",
              file=sys.stderr)
        return 2
    report = json.loads(src.read_text())
    kept = RESULTS / f"gpu_check_{args.label}.json"
    write_result(kept, report)  # the device's paths made portable
    table = args.files_at / "cost_table.json"
    if table.is_file():
        write_result(RESULTS / f"gpu_cost_table_{args.label}.json", json.loads(table.read_text()))
    text = render(report, str(kept.relative_to(HERE.parent)))
    todo = corrections(report)
    if todo:
        text += "\n\nCorrection candidates (over 15 %; docs/gpu.md, 'Reading the results'):\n"
        text += "\n".join(f"- {c}" for c in todo)
    print(text)
    if not args.no_docs:
        write_docs(text)
        print(f"\nwrote the tables into {DOC.relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
