"""Section `modelopt` of benchmarks/peers.py: ModelOpt AutoQuantize's effective-bits objective for
an H100 (TensorRT-LLM: FP8 and INT4-AWQ/W4A16; NVFP4 needs Blackwell, so it is not offered),
scored with autoplan's measured KL and cost model beside autoplan's own plan at the same KL,
per workload (batch 1, batch 32, `--batch max`).

ModelOpt's per-layer choice comes from `mtq.auto_quantize` itself when it runs on this CPU (in
its own venv, `$AUTOPLAN_CACHE/peers/modelopt`, on autoplan's calibration blocks); else from
its published method re-implemented on autoplan's own profile: per (layer group, format) a
gradient score (autoplan's profile is the same Fisher-weighted output error ModelOpt's
`gradient` method computes), then the exact minimum of the summed score under
sum(bits x params) <= effective_bits x params (ModelOpt solves this LP too). The JSON says
which one was used. Both sides' KL is measured by the same verifier on the real model (the
search's evaluation blocks); both speeds are the same cost model's predictions.
"""

from __future__ import annotations

import json
from pathlib import Path

from peers_common import PeerError, PeerVenv, error_row, last_line, peers_dir, run_tool
from peers_gpu import WORKLOADS, autoplan_at, command, prepare_for, score_peer
from peers_table import floor_budget, pair

GOAL = 1.15
TARGET, RUNTIME = "h100-sxm", "tensorrt-llm"
# ModelOpt config -> autoplan choice. INT4_AWQ_CFG's groups of 128 do not tile SmolLM2's
# 576-wide inputs (every projection but down_proj): there its deployable twin is W4A16 in groups
# of 64 (TensorRT-LLM's INT4-AWQ runs group 64 too), so autoplan's menu holds both.
FORMATS = {"FP8_DEFAULT_CFG": "dense+fp8_e4m3", "INT4_AWQ_CFG": "dense+int4_g128"}
MENU = ("dense+fp8_e4m3", "dense+int4_g64", "dense+int4_g128")
# ModelOpt counts every Linear, the lm_head it leaves in BF16 included (its minimum on this
# model, everything else INT4, is 6.53 bits; all FP8 is 9.68)
EFFECTIVE_BITS = (7.0, 8.0, 9.5)
VENV = PeerVenv("modelopt", (("torch==2.13.0",), ("nvidia-modelopt[hf]==0.47.0",)),
                "modelopt.torch.quantization")
WORKER = Path(__file__).with_name("peers_modelopt_worker.py")
# what the one full attempt on the 2-core reference VM found (docs/peers.md), the error row of a
# run told not to start ModelOpt's own planner again (--peer-timeout 0)
NOT_FINISHING = ("mtq.auto_quantize ran without CUDA here (nvidia-modelopt 0.47.0, torch "
                 "2.13.0+cpu) but did not finish: after FP8 calibration it spent 45 min in "
                 "INT4-AWQ calibration on the 4 calibration blocks (2-core VM, load ~8) and was "
                 "stopped")


def modelopt_bits(choice: str) -> float:
    """ModelOpt's effective bits of a weight in ``choice`` (estimate_quant_compression: FP8
    E4M3 (4+3+1), INT4 4; unquantized layers count 16)."""
    if choice.startswith("dense+int4_g"):
        return 4.0
    return {"dense+fp8_e4m3": 8.0}.get(choice, 16.0)


def effective_bits(prep, by_unit: dict[str, str]) -> float:  # noqa: ANN001
    """ModelOpt's effective_bits of a per-unit choice over every linear layer, the protected
    (BF16) lm_head included, as its constraint counts them."""
    units, fixed = prep.space.units, prep.space.protected
    total = sum(u.params for u in units) + sum(layer.params for layer in fixed)
    return (sum(modelopt_bits(by_unit[u.name]) * u.params for u in units)
            + 16.0 * sum(layer.params for layer in fixed)) / total


def lp_choice(prep, effective_bits: float) -> dict[str, str]:  # noqa: ANN001
    """ModelOpt's published objective on autoplan's profile: minimum summed score with
    sum(bits x params) <= effective_bits x sum(params), one format per layer group."""
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp

    from autoplan.formats import Choice

    units = prep.space.units
    scores = [np.asarray(q, float) for q in prep.tables.quality]
    sizes = [len(s) for s in scores]
    n = sum(sizes)
    c = np.concatenate(scores)
    bits = np.concatenate([[modelopt_bits(str(ch)) * u.params for ch in u.choices] for u in units])
    fixed = sum(layer.params for layer in prep.space.protected)  # lm_head, BF16: 16 bits
    total = sum(u.params for u in units) + fixed
    rows = np.zeros((len(units), n))
    start = 0
    for i, k in enumerate(sizes):
        rows[i, start:start + k] = 1
        start += k
    # ModelOpt's INT4 is one format: groups of 128 where they tile the layer, else 64 (MENU)
    g128 = Choice.parse("dense+int4_g128")
    allowed = np.concatenate([[not (str(ch) == "dense+int4_g64" and g128 in u.choices)
                               for ch in u.choices] for u in units])
    budget = effective_bits * total - 16.0 * fixed
    res = milp(c, constraints=[LinearConstraint(rows, 1, 1),
                               LinearConstraint(bits[None], -np.inf, budget)],
               integrality=np.ones(n), bounds=Bounds(0, allowed.astype(float)))
    if res.x is None:
        raise PeerError(f"effective_bits {effective_bits}: no feasible choice ({res.message})")
    picks, start = {}, 0
    for u, k in zip(units, sizes, strict=True):
        picks[u.name] = str(u.choices[int(np.argmax(res.x[start:start + k]))])
        start += k
    return picks


def _real_modelopt(loaded, data, log, timeout: float) -> dict:  # noqa: ANN001
    """{bits: {module: ModelOpt recipe}} from mtq.auto_quantize in ModelOpt's venv (a run
    still going in another process is not started twice: its state is the error)."""
    import time

    import numpy as np

    if timeout <= 0:
        raise PeerError(f"not started (--peer-timeout 0): {NOT_FINISHING}")
    python = VENV.ensure(log)
    work = peers_dir() / "modelopt"
    out, log_file = work / "auto_quantize.json", work / "auto_quantize.log"
    cfg = {"hf": str(loaded.path), "calib_npy": str(work / "calib.npy"),
           "formats": list(FORMATS), "effective_bits": list(EFFECTIVE_BITS), "out": str(out),
           "checkpoint": str(work / "auto_quantize_state.pth")}
    prior = json.loads(out.read_text()) if out.is_file() else {}
    if all(f"{b}" in prior.get("runs", {}) for b in EFFECTIVE_BITS):
        return prior
    if _running(out) and log_file.is_file():
        started = log_file.stat().st_ctime
        raise PeerError(f"mtq.auto_quantize still running here after "
                        f"{(time.time() - started) / 60:.0f} min (no CUDA needed; last line: "
                        f"'{last_line(log_file.read_text(), 120)}')")
    np.save(work / "calib.npy", data.calib.numpy())
    try:
        run_tool([str(python), str(WORKER), json.dumps(cfg)], "mtq.auto_quantize",
                 timeout=timeout, log=log_file)
    finally:
        doc = json.loads(out.read_text()) if out.is_file() else {}
    if doc.get("error"):
        raise PeerError(f"mtq.auto_quantize: {doc['error']}")
    return doc


def _running(out: Path) -> bool:
    """Whether a ModelOpt worker writing ``out`` is alive (another process started it)."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if WORKER.name in cmd and str(out) in cmd:
            return True
    return False


def _by_unit(prep, per_layer: dict[str, str]) -> dict[str, str]:  # noqa: ANN001
    """ModelOpt's per-module recipes as autoplan's per-unit choices."""
    from autoplan.formats import Choice

    out = {}
    for unit in prep.space.units:
        names = [per_layer.get(layer.name, "NONE") for layer in unit.layers]
        choice = FORMATS.get(names[0], str(prep.space.baseline))
        if choice == "dense+int4_g128" and Choice.parse(choice) not in unit.choices:
            choice = "dense+int4_g64"  # see MENU
        out[unit.name] = choice
    return out


def run(args, log=print) -> dict:  # noqa: ANN001
    from autoplan.models import load_model
    from autoplan.quality.text import load_text_dataset

    choices = MENU
    loaded = load_model("smollm2-135m")
    data = load_text_dataset(None, tokenizer=loaded.tokenizer, seq_len=256, n_calib=4,
                             n_eval=6, seed=0)
    errors, method = [], "mtq.auto_quantize"
    prep = {w: prepare_for(TARGET, RUNTIME, w, choices, "modelopt") for w in WORKLOADS}
    try:
        real = _real_modelopt(loaded, data, log, args.peer_timeout)
        picks = {bits: _by_unit(prep["1"], {k.removesuffix(".quant_recipe"): v for k, v in
                                            real["runs"][str(bits)]["recipes"].items()})
                 for bits in EFFECTIVE_BITS}
    except Exception as exc:  # noqa: BLE001 - recorded, then the published method on our profile
        errors.append(error_row("modelopt", "ModelOpt mtq.auto_quantize on CPU", exc))
        method = "re-implementation on autoplan's profile (gradient scores, exact LP)"
        picks = {bits: lp_choice(prep["1"], bits) for bits in EFFECTIVE_BITS}
    head = {"section": "modelopt", "method": method, "target": TARGET, "runtime": RUNTIME,
            "formats": FORMATS, "effective_bits": list(EFFECTIVE_BITS), "goal": GOAL}
    progress = getattr(args, "progress", {})
    # every peer row first (KL measured, speed predicted: minutes), then autoplan's searches
    peers = {}
    for bits, by_unit in picks.items():
        eff = effective_bits(prep["1"], by_unit)
        for w in WORKLOADS:
            peers[bits, w] = {"section": "modelopt", "name": f"modelopt-e{bits:g}",
                              "side": "peer", "workload": w, "effective_bits": eff,
                              "target_effective_bits": bits, "method": method,
                              **score_peer(prep[w], by_unit, f"modelopt-e{bits:g}"),
                              "command": "python benchmarks/peers.py modelopt  "
                                         f"# effective_bits {bits:g}"}
            log(f"modelopt-e{bits:g} batch {w}: KL {peers[bits, w]['kl']:.4f}, "
                f"{peers[bits, w]['tokens_per_s']:.0f} tok/s predicted")
    rows, pairs = list(peers.values()), []
    progress.update({**head, "rows": rows, "pairs": pairs, "errors": errors})
    for (bits, w), peer in peers.items():
        try:
            ours = autoplan_at(prep[w], TARGET, RUNTIME, w, peer["kl"], choices, "modelopt", log)
        except Exception as exc:  # noqa: BLE001 - autoplan's own failure is that pair's row
            errors.append(error_row("modelopt", f"autoplan beside modelopt-e{bits:g} batch {w}",
                                    exc, command(TARGET, RUNTIME, w,
                                                 f"kl<={floor_budget(peer['kl'])}", choices)))
            continue
        ours["effective_bits"] = _plan_bits(prep[w], ours["plan"])
        rows.append(ours)
        pairs.append(pair(peer, ours, GOAL, metric="tokens_per_s",
                          label=f"tokens/s, H100, batch {w}"))
        log(f"modelopt-e{bits:g} batch {w}: autoplan {pairs[-1]['ratio']:.2f}x")
    return {**head, "rows": rows, "pairs": pairs, "errors": errors,
            "goal_met_somewhere": any(p["met"] for p in pairs),
            "modelopt_versions": VENV.versions()}


def _plan_bits(prep, plan_path: str) -> float:  # noqa: ANN001
    """ModelOpt's effective bits of autoplan's plan (same accounting as the peer's)."""
    from autoplan.plan.io import load_plan

    decisions = load_plan(plan_path).decisions
    return effective_bits(prep, {u.name: decisions[u.layers[0].name] for u in prep.space.units})


__all__ = ["EFFECTIVE_BITS", "FORMATS", "GOAL", "lp_choice", "run"]
