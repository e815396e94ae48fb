"""Section `quark` of benchmarks/peers.py: AMD Quark's mixed-precision search for an MI300X, scored
with autoplan's measured KL and cost model beside autoplan's plan at the same KL.

Quark 0.13's search (`quark.experimental.torch.mix_precision`, what `quark-quant-perf` runs)
picks one mode per module group (self-attention, dense MLP; KV cache and attention apart) from
the modes an MI300X runs (native BF16, per-tensor FP8, per-token-per-channel FP8), sorts the
configs from the most conservative to the most aggressive by its sensitivity prior, and keeps
the most aggressive one whose exported checkpoint passes an accuracy gate evaluated in vLLM.
Here: Quark's own candidate list and order (its ConfigSearcher, run in Quark's venv); whether
its managed search runs on this CPU (its own error when not); each candidate's KL measured by
autoplan's verifier and tokens/s predicted by autoplan's cost model for vLLM on MI300X; and
Quark's pick under its default gate (perplexity within 1.02x of the original) on that KL
measurement. Both FP8 modes map to autoplan's fp8_e4m3 (per-channel weights, per-token
inputs: exactly `ptpc_fp8`, slightly kinder than Quark's per-tensor `fp8`); the KV cache stays
BF16 on both sides.
"""

from __future__ import annotations

import json
from pathlib import Path

from peers_common import PeerError, PeerVenv, error_row, peers_dir, run_tool
from peers_gpu import WORKLOADS, autoplan_at, command, prepare_for, score_peer
from peers_table import floor_budget, pair

GOAL = 1.15
TARGET, RUNTIME = "mi300x", "vllm"
CHOICES = ("dense+fp8_e4m3",)
PARTITIONS = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
              "dense_mlp": ("gate_proj", "up_proj", "down_proj")}
PPL_GATE = 1.02  # Quark's default eval_threshold for perplexity
# the check is the package, not its mix_precision search: that one imports vLLM's plugin and
# fails on a CPU, which the worker records as the finding (search_error) rather than an install
VENV = PeerVenv("quark", (("torch==2.13.0",), ("amd-quark[quant-perf]==0.13",)), "quark")
WORKER = Path(__file__).with_name("peers_quark_worker.py")


def quark_candidates(loaded, log) -> dict:  # noqa: ANN001
    python = VENV.ensure(log)
    work = peers_dir() / "quark"
    work.mkdir(parents=True, exist_ok=True)
    out = work / "quark_search.json"
    prior = json.loads(out.read_text()) if out.is_file() else {}
    if prior.get("configs"):
        return prior
    try:
        cfg = json.dumps({"hf": str(loaded.path), "out": str(out)})
        run_tool([str(python), str(WORKER), cfg], "Quark ConfigSearcher", timeout=1800,
                 log=work / "quark_search.log")
    finally:
        doc = json.loads(out.read_text()) if out.is_file() else {}
    if doc.get("error") or not doc.get("configs"):
        raise PeerError(f"Quark: {doc.get('error', 'no candidate configs')}")
    return doc


def by_unit(prep, config: dict) -> dict[str, str]:  # noqa: ANN001
    """One Quark module-group config as autoplan's per-unit choices."""
    out = {}
    for unit in prep.space.units:
        leaf = unit.layers[0].name.rsplit(".", 1)[-1]
        group = next((g for g, leaves in PARTITIONS.items() if leaf in leaves), None)
        mode = config.get(f"{group}_mode", "native") if group else "native"
        out[unit.name] = str(prep.space.baseline) if mode == "native" else CHOICES[0]
    return out


def run(args, log=print) -> dict:  # noqa: ANN001
    from autoplan.models import load_model

    loaded = load_model("smollm2-135m")
    errors = []
    try:
        doc = quark_candidates(loaded, log)
    except Exception as exc:  # noqa: BLE001 - the peer's own error is its table line
        return {"section": "quark", "rows": [], "pairs": [],
                "errors": [error_row("quark", "AMD Quark mix_precision", exc)]}
    if doc.get("search_error"):
        errors.append(error_row("quark", "AMD Quark MixPrecisionQuantizer.search (managed, "
                                "vLLM-evaluated) on CPU", PeerError(doc["search_error"])))
    head = {"section": "quark", "target": TARGET, "runtime": RUNTIME, "goal": GOAL,
            "quark_order": doc["configs"], "quark_sensitivity": doc.get("sensitivity"),
            "quark_versions": doc.get("versions"), "ppl_gate": PPL_GATE}
    progress = getattr(args, "progress", {})
    progress.update({**head, "rows": [], "pairs": [], "errors": errors})
    prep = {w: prepare_for(TARGET, RUNTIME, w, CHOICES, "quark") for w in WORKLOADS}
    # every candidate scored first (KL measured, speed predicted), then autoplan's searches
    peers, scored = {}, []
    for i, config in enumerate(doc["configs"]):
        name = "quark-" + "-".join(f"{g}:{config.get(f'{g}_mode')}" for g in PARTITIONS)
        units = by_unit(prep["1"], config)
        for w in WORKLOADS:
            peers[i, w] = {"section": "quark", "name": name, "side": "peer", "workload": w,
                           "order": i, "config": config, **score_peer(prep[w], units, name),
                           "command": "python benchmarks/peers.py quark  # Quark candidate "
                                      f"{i + 1} of {len(doc['configs'])}"}
        scored.append((i, name, peers[i, "1"]))
        log(f"{name}: KL {peers[i, '1']['kl']:.4f}")
    passing = [n for _i, n, r in scored if r["ppl"] <= PPL_GATE * r["ppl_ref"]]
    head["quark_pick_at_ppl_gate"] = passing[-1] if passing else None
    rows, pairs = list(peers.values()), []
    progress.update({**head, "rows": rows, "pairs": pairs})
    for (_i, w), peer in peers.items():
        try:
            ours = autoplan_at(prep[w], TARGET, RUNTIME, w, peer["kl"], CHOICES, "quark", log)
        except Exception as exc:  # noqa: BLE001 - autoplan's own failure is that pair's row
            errors.append(error_row("quark", f"autoplan beside {peer['name']} batch {w}", exc,
                                    command(TARGET, RUNTIME, w,
                                            f"kl<={floor_budget(peer['kl'])}", CHOICES)))
            continue
        rows.append(ours)
        pairs.append(pair(peer, ours, GOAL, metric="tokens_per_s",
                          label=f"tokens/s, MI300X, batch {w}"))
    return {**head, "rows": rows, "pairs": pairs, "errors": errors}


__all__ = ["GOAL", "by_unit", "run"]
