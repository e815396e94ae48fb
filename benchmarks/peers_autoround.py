"""Section `autoround` of benchmarks/peers.py: AutoRound's AutoScheme (mixed GGUF types under an
average-bits target) exported to GGUF and served by the same llama.cpp as autoplan's plans.

AutoScheme gets the GGUF types autoplan's `--runtime llama.cpp` space holds (Q4_0, Q4_1, Q5_0,
Q5_1, Q8_0: the K types fall back to these on SmolLM2's 576-wide rows, which would make its
bits accounting wrong), autoplan's calibration blocks (as a local dataset file) and, as
`avg_bits`, the average bits over the decoder's linear layers (AutoRound keeps lm_head out
of its budget) of autoplan's section-`llamacpp` plans and of llama.cpp's own mixes; RTN mode
(`iters=0`), what AutoRound recommends for GGUF. Each AutoScheme file is then set beside autoplan's plan searched at the KL
it reaches (`--budget kl<=KL_autoscheme`, plans shared with section `llamacpp`): KL through
llama.cpp against the original file, decode/prefill tok/s interleaved at the same threads.
"""

from __future__ import annotations

import json
from pathlib import Path

from peers_common import PeerError, PeerVenv, error_row, peers_dir, run_tool

GOAL = 1.1
OPTIONS = ("GGUF:Q4_0", "GGUF:Q4_1", "GGUF:Q5_0", "GGUF:Q5_1", "GGUF:Q8_0")
# auto-round does not declare gguf or sentencepiece, which its GGUF export imports (the
# second in its llama vocabulary step, even for a BPE tokenizer like SmolLM2's)
VENV = PeerVenv("autoround", (("torch==2.13.0",),
                              ("auto-round==0.16.1", "gguf>=0.10", "sentencepiece")),
                "auto_round, gguf, sentencepiece")
WORKER = Path(__file__).with_name("peers_autoround_worker.py")
RESULTS = Path(__file__).resolve().parent / "results"


def block_bits(path: Path) -> float:
    """Average stored bits per weight of the decoder blocks' linear layers (blk.*)."""
    from gguf import GGUFReader

    n = nbytes = 0
    for t in GGUFReader(str(path)).tensors:
        if t.name.startswith("blk.") and len(t.shape) == 2:
            n, nbytes = n + int(t.n_elements), nbytes + int(t.n_bytes)
    return 8 * nbytes / n


def _targets() -> list[float]:
    """avg_bits (2 decimals): each distinct section-llamacpp autoplan plan's block bits, and
    each of llama.cpp's own mixes' (the bits its users pick), so AutoScheme also allocates
    below a plan that keeps every layer at one type."""
    try:
        doc = json.loads((RESULTS / "peers_llamacpp.json").read_text())
    except (OSError, ValueError) as exc:
        raise PeerError("run `python benchmarks/peers.py llamacpp` first: AutoScheme's "
                        "avg_bits are its plans' bits") from exc
    work = peers_dir() / "llamacpp"
    plans = {round(block_bits(work / "plans" / r["file"]), 2) for r in doc["rows"]
             if r["side"] == "autoplan"}
    if not plans:
        why = next((e["error"] for e in doc.get("errors", []) if "autoplan" in e["peer"]),
                   "it has no autoplan row")
        raise PeerError("AutoScheme's avg_bits are autoplan's section-llamacpp plans' bits, and "
                        f"that section has no plan: {why}")
    mixes = {round(block_bits(work / r["file"]), 2) for r in doc["rows"]
             if r["side"] == "peer" and not r.get("identical_to")}
    return sorted(plans | mixes)


def run(args, log=print) -> dict:  # noqa: ANN001
    from peers_kquants import search_plan
    from peers_llamacpp import eval_quality, linear_bits, prompts, tensor_types, time_sides
    from peers_table import floor_budget, pair

    from autoplan.models import load_model
    from autoplan.quality.text import load_text_dataset

    loaded = load_model("smollm2-135m")
    data = load_text_dataset(None, tokenizer=loaded.tokenizer, seq_len=256, n_calib=4,
                             n_eval=6, seed=0)
    work = peers_dir() / "autoround"
    work.mkdir(parents=True, exist_ok=True)
    calib = work / "calibration.json"
    calib.write_text(json.dumps([loaded.tokenizer.decode(b.tolist()) for b in data.calib]))
    try:
        targets = _targets()
    except PeerError as exc:  # no plan to match its bits: one row that says why
        return {"section": "autoround", "rows": [], "pairs": [],
                "errors": [error_row("autoround", "AutoRound AutoScheme (not run: no autoplan "
                                     "plan to match)", exc,
                                     "python benchmarks/peers.py autoround")]}
    cfg = {"hf": str(loaded.path), "calib_json": str(calib), "options": list(OPTIONS),
           "avg_bits": targets, "out_dir": str(work), "iters": 0, "nsamples": 4, "seqlen": 256}
    command = (f"AutoRound('{loaded.path.name}', scheme=AutoScheme(avg_bits=B, options="
               f"{OPTIONS}), iters=0, dataset=calibration.json, nsamples=4, seqlen=256)"
               ".quantize_and_save(format='gguf:q4_k_m')")
    try:
        python = VENV.ensure(log)
        done = work / "autoscheme.json"
        prior = json.loads(done.read_text()) if done.is_file() else {}
        if sorted(prior.get("runs", {})) != sorted(f"{b:g}" for b in targets):
            run_tool([str(python), str(WORKER), json.dumps(cfg)], "AutoRound AutoScheme",
                     timeout=5400, log=work / "autoscheme.log")
        doc = json.loads(done.read_text())
        if doc.get("error"):
            raise PeerError(doc["error"])
    except Exception as exc:  # noqa: BLE001 - the peer's own error is its table line
        return {"section": "autoround", "rows": [], "pairs": [],
                "errors": [error_row("autoround", "AutoRound AutoScheme", exc, command)]}
    files = {f"autoscheme-b{b}": Path(r["gguf"]) for b, r in doc["runs"].items()}
    quality = eval_quality(files, loaded.source.path, data.eval, args.threads)
    plans = {}
    for name in files:
        budget = f"kl<={floor_budget(quality[name]['kl'])}"
        gguf, commands = search_plan(budget, args, peers_dir() / "llamacpp" / "plans", log)
        plans[name] = {"path": gguf, "budget": budget, "command": " && ".join(commands),
                       "name": "autoplan-" + budget.replace("kl<=", "kl")}
    plan_files = {p["name"]: p["path"] for p in plans.values()}
    quality.update(eval_quality(plan_files, loaded.source.path, data.eval, args.threads))
    sides = {"original": loaded.source.path, **files, **plan_files}
    timing = time_sides(sides, prompts(loaded.tokenizer, args.rounds, args.input_len, args.seed),
                        threads=args.threads, output_len=args.output_len, log=log)
    rows, pairs = [], []
    for name, path in {**files, **plan_files}.items():
        s = timing["sides"][name]
        rows.append({"section": "autoround", "name": name, "file": path.name,
                     "side": "peer" if name in files else "autoplan",
                     "file_mb": path.stat().st_size / 2**20, "linear_bits": linear_bits(path),
                     "block_bits": block_bits(path), "types": tensor_types(path),
                     "kl": quality[name]["kl"], "ppl": quality[name]["ppl"],
                     "decode_tok_s": s["decode_tok_s"], "prefill_tok_s": s["prefill_tok_s"],
                     "speed_kind": "measured",
                     "command": (command.replace("avg_bits=B", f"avg_bits={name.split('-b')[1]}")
                                 if name in files else
                                 next(p["command"] for p in plans.values()
                                      if p["name"] == name))})
    by_name = {r["name"]: r for r in rows}
    for name in files:
        pairs.append(pair(by_name[name], by_name[plans[name]["name"]], GOAL))
    return {"section": "autoround", "options": OPTIONS, "avg_bits": targets, "rows": rows,
            "pairs": pairs, "errors": [], "goal": GOAL, "autoround": doc.get("versions"),
            "layer_configs": {b: r["layer_config"] for b, r in doc["runs"].items()},
            "original": timing["sides"]["original"], "threads": args.threads,
            "load_avg_1m_per_round": timing["load_avg_1m_per_round"]}


__all__ = ["GOAL", "OPTIONS", "block_bits", "run"]
