"""The pure parts of benchmarks/peers.py: budgets from a peer's KL, peer-vs-autoplan pairs
and the markdown table users read (docs/peers.md), from the sections' results JSON."""

from __future__ import annotations

import math

SECTION_TITLES = {
    "llamacpp": "llama.cpp K-quant mixes (llama-quantize, with and without llama-imatrix)",
    "autoround": "AutoRound AutoScheme (GGUF mixes, served by llama.cpp)",
    "nncf": "NNCF mixed INT4/INT8 (OpenVINO GenAI) vs autoplan's ONNX Runtime plan",
    "modelopt": "ModelOpt AutoQuantize's effective-bits objective (H100, predicted)",
    "quark": "AMD Quark mixed-precision search (MI300X)",
}


def floor_budget(kl: float, digits: int = 3) -> float:
    """``kl`` rounded down to ``digits`` significant digits: a budget the peer's own KL meets,
    so a plan within it is at equal or better KL by construction of the search."""
    if kl <= 0 or not math.isfinite(kl):
        raise ValueError(f"a KL budget needs a positive finite KL, not {kl}")
    scale = 10 ** (digits - 1 - math.floor(math.log10(kl)))
    return math.floor(kl * scale) / scale


def pair(peer: dict, ours: dict, goal: float, metric: str = "decode_tok_s",
         label: str | None = None) -> dict:
    """One peer row beside autoplan's row: the speed ratio on ``metric`` and whether the goal
    (``ratio >= goal`` at equal or better KL) is met, with the shortfall said in words."""
    ratio = ours[metric] / peer[metric]
    kl_ok = ours["kl"] <= peer["kl"]
    met = kl_ok and ratio >= goal
    why = None
    if not kl_ok:
        why = (f"autoplan's KL {ours['kl']:.4f} is above the peer's {peer['kl']:.4f}: "
               "not equal quality")
    elif not met:
        why = f"{ratio:.2f}x is {(goal - ratio) / goal:.0%} short of the {goal:.2f}x goal"
    out = {"peer": peer["name"], "autoplan": ours["name"], "metric": label or metric,
           "peer_value": peer[metric], "autoplan_value": ours[metric], "ratio": ratio,
           "kl_peer": peer["kl"], "kl_autoplan": ours["kl"], "kl_equal_or_better": kl_ok,
           "goal": goal, "met": met, "why": why, "workload": peer.get("workload"),
           "speed_kind": peer.get("speed_kind", "measured"),
           "peer_command": peer.get("command", ""), "autoplan_command": ours.get("command", "")}
    for key in ("file_mb", "linear_bits", "prefill_tok_s"):
        if key in peer and key in ours:
            out[f"peer_{key}"], out[f"autoplan_{key}"] = peer[key], ours[key]
    return out


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def pairs_table(pairs: list[dict]) -> list[str]:
    """Markdown rows: peer vs autoplan side by side, one pair per line."""
    lines = ["| peer | autoplan | speed | peer | autoplan | ratio | size MB / bits (peer, "
             "autoplan) | KL peer | KL autoplan | goal | commands |",
             "|---|---|---|---:|---:|---:|---|---:|---:|---|---|"]
    for p in pairs:
        size = "-"
        if "peer_file_mb" in p:
            size = (f"{p['peer_file_mb']:.1f} / {_num(p.get('peer_linear_bits'), '.2f')}, "
                    f"{p['autoplan_file_mb']:.1f} / {_num(p.get('autoplan_linear_bits'), '.2f')}")
        elif "peer_linear_bits" in p:
            size = f"{p['peer_linear_bits']:.2f}, {p['autoplan_linear_bits']:.2f} bits"
        verdict = "met" if p["met"] else f"missed: {p['why']}"
        cmds = f"peer: `{_cell(p['peer_command'])}`; autoplan: `{_cell(p['autoplan_command'])}`"
        lines.append(
            f"| {_cell(p['peer'])} | {_cell(p['autoplan'])} | {p['metric']} "
            f"({p['speed_kind']}) | {p['peer_value']:.1f} | {p['autoplan_value']:.1f} | "
            f"{p['ratio']:.2f}x | {size} | {p['kl_peer']:.4f} | {p['kl_autoplan']:.4f} | "
            f"{_cell(verdict)} (>= {p['goal']:.2f}x) | {cmds} |")
    return lines


def unpaired_table(rows: list[dict], pairs: list[dict]) -> list[str]:
    """Rows measured without their other side yet (a section stopped before it paired
    them): what each is, its size, KL and speed where measured."""
    paired = {(p[side], p.get("workload")) for p in pairs for side in ("peer", "autoplan")}
    alone = [r for r in rows if (r["name"], r.get("workload")) not in paired]
    if not alone:
        return []
    lines = ["Measured, not yet paired:", "",
             "| row | side | workload | size MB / bits | KL | speed | command |",
             "|---|---|---|---|---:|---|---|"]
    for r in alone:
        size = "-"
        if "file_mb" in r:
            size = f"{r['file_mb']:.1f} / {_num(r.get('linear_bits'), '.2f')}"
        elif "effective_bits" in r:
            size = f"{r['effective_bits']:.2f} effective bits"
        if "decode_tok_s" in r:
            speed = f"{r['decode_tok_s']:.1f} decode tok/s ({r.get('speed_kind', 'measured')})"
        elif "tokens_per_s" in r:
            speed = f"{r['tokens_per_s']:.0f} tok/s ({r.get('speed_kind', 'predicted')})"
        else:
            speed = "not measured (stopped before timing)"
        lines.append(f"| {_cell(r['name'])} | {r.get('side', '-')} | "
                     f"{_cell(r.get('workload', 'batch 1'))} | {size} | {r['kl']:.4f} | "
                     f"{speed} | `{_cell(r.get('command', ''))}` |")
    return [*lines, ""]


def error_lines(errors: list[dict]) -> list[str]:
    """A peer that could not be installed or run: one line with its own error."""
    return [f"- **{_cell(e['peer'])}: "
            f"{'not finished' if e['error'].startswith('NotFinished') else 'not runnable'}"
            f" here.** `{_cell(e['error'])}`"
            + (f" (command: `{_cell(e['command'])}`)" if e.get("command") else "")
            for e in errors]


def section_markdown(name: str, doc: dict) -> list[str]:
    """The table block of one section's results JSON."""
    lines = [f"### {SECTION_TITLES.get(name, name)}", ""]
    if doc.get("command"):
        lines += [f"Command: `{doc['command']}` (results `benchmarks/results/peers_{name}.json`"
                  f"{', machine ' + doc['machine']['cpu'] if doc.get('machine') else ''})", ""]
    if doc.get("pairs"):
        lines += pairs_table(doc["pairs"]) + [""]
    lines += unpaired_table(doc.get("rows") or [], doc.get("pairs") or [])
    if doc.get("errors"):
        lines += error_lines(doc["errors"]) + [""]
    if not doc.get("pairs") and not doc.get("errors") and not doc.get("rows"):
        lines += ["(no rows: the section has not been run)", ""]
    return lines


def goals_summary(docs: dict[str, dict]) -> list[str]:
    """One line per section: how many pairs meet their goal, and the worst ratio."""
    out = []
    for name, doc in docs.items():
        pairs = doc.get("pairs") or []
        if not pairs:
            rows = doc.get("rows") or []
            if rows:  # stopped or failed before pairing: what was measured is listed below
                state = (f"{len(rows)} rows measured, none paired with autoplan yet (goal not "
                         "assessed; the section's lines below say why)")
            elif any(e.get("error", "").startswith("NotFinished")
                     for e in doc.get("errors") or []):
                state = "not finished here (stopped before any row; its line below says why)"
            else:
                state = "not measured" if not doc.get("errors") else "peer not runnable"
            out.append(f"- {name}: {state}")
            continue
        met = sum(p["met"] for p in pairs)
        worst = min(pairs, key=lambda p: p["ratio"])
        out.append(f"- {name}: {met} of {len(pairs)} pairs meet the goal; lowest ratio "
                   f"{worst['ratio']:.2f}x ({worst['peer']} vs {worst['autoplan']})")
    return out


__all__ = ["SECTION_TITLES", "error_lines", "floor_budget", "goals_summary", "pair",
           "pairs_table", "section_markdown", "unpaired_table"]
