"""Scoring a GPU peer's per-layer choice with autoplan's own tools, beside autoplan's plan at the
same measured KL (benchmarks/peers.py sections `modelopt` and `quark`).

For one target, runtime and format menu, per workload (`--batch 1`, `32`, `max`, 512 in / 128
out): the peer's choice is measured by the search's own verifier (KL on the real model, the
search's evaluation blocks, measurements cached like a search's) and predicted by the search's
own cost model; autoplan's plan is `autoplan search` with the same menu at `--budget
kl<=KL_peer` (run through the library, cached as a plan file), predicted by the same model.
"""

from __future__ import annotations

from pathlib import Path

from peers_common import peers_dir
from peers_table import floor_budget

WORKLOADS = ("1", "32", "max")
INPUT_LEN, OUTPUT_LEN = 512, 128


def request(target: str, runtime: str, workload: str, budget: str, out: Path,
            choices: tuple[str, ...]):  # noqa: ANN201 - a SearchRequest
    from autoplan.cost.operating import OperatingRequest
    from autoplan.search import QualityBudget, SearchRequest, parse_choices
    from autoplan.workload import Workload

    fixed = workload != "max"
    wl = Workload(batch=int(workload) if fixed else 1, input_len=INPUT_LEN, output_len=OUTPUT_LEN)
    operating = None if fixed else OperatingRequest(batch="max", input_len=INPUT_LEN,
                                                    output_len=OUTPUT_LEN)
    return SearchRequest(model="smollm2-135m", target=target, runtime=runtime,
                         budget=QualityBudget.parse(budget), workload=wl, out=out,
                         operating=operating, choices=parse_choices(choices))


def command(target: str, runtime: str, workload: str, budget: str,
            choices: tuple[str, ...]) -> str:
    """The CLI line equivalent to ``request``."""
    menu = ",".join(c.split("+", 1)[1] for c in choices)
    return (f"autoplan search --target {target} --runtime {runtime} --batch {workload} "
            f"--input-len {INPUT_LEN} --output-len {OUTPUT_LEN} --choices {menu} "
            f"--budget '{budget}'")


def prepare_for(target: str, runtime: str, workload: str, choices: tuple[str, ...],
                folder: str):  # noqa: ANN201 - a Prepared
    """The search's prepared stage (space, profile, cost model, verifier) for one workload."""
    from autoplan.search import Reporter, preflight, prepare

    req = request(target, runtime, workload, "kl<=1", peers_dir() / folder / "scratch.json",
                  choices)
    return prepare(req, preflight(req), Reporter())


def counts(values) -> dict[str, int]:  # noqa: ANN001
    out: dict[str, int] = {}
    for v in values:
        out[str(v)] = out.get(str(v), 0) + 1
    return out


def score_peer(prep, by_unit: dict[str, str], label: str) -> dict:  # noqa: ANN001
    """Measured KL (and perplexities) and predicted tokens/s of a per-unit choice."""
    from autoplan.formats import Choice

    units = {u: Choice.parse(c) for u, c in by_unit.items()}
    m = prep.verifier.measure(prep.tables.picks_of(units), label)
    est = prep.cost.evaluate(prep.space.decisions(units))
    return {"kl": m.quality.kl, "ppl": m.quality.ppl, "ppl_ref": m.quality.ppl_ref,
            "tokens_per_s": est.metrics.throughput, "batch": prep.req.workload.batch,
            "unit_choices": counts(by_unit.values()), "speed_kind": "predicted"}


def autoplan_at(prep, target: str, runtime: str, workload: str, kl: float,
                choices: tuple[str, ...], folder: str, log=print) -> dict:  # noqa: ANN001
    """autoplan's plan with the same menu at the peer's measured KL (searched once, cached)."""
    from autoplan.formats import Choice
    from autoplan.plan.io import load_plan
    from autoplan.search import run_search

    budget = f"kl<={floor_budget(kl)}"
    tag = budget.replace("kl<=", "kl")
    path = peers_dir() / folder / f"plan_{target}_b{workload}_{tag}.json"
    if not path.is_file():
        log(f"autoplan search {target} batch {workload} {budget} ...")
        run_search(request(target, runtime, workload, budget, path, choices))
    plan = load_plan(path)
    decisions = {k: Choice.parse(v) for k, v in plan.decisions.items()}
    return {"name": f"autoplan-b{workload}-{tag}", "side": "autoplan", "workload": workload,
            "budget": budget, "kl": plan.quality.kl,
            "tokens_per_s": prep.cost.evaluate(decisions).metrics.throughput,
            "plan_tokens_per_s": plan.predicted["plan"].tokens_per_s,
            "batch": plan.workload.batch,
            "unit_choices": counts(plan.decisions[u.layers[0].name] for u in prep.space.units),
            "speed_kind": "predicted", "plan": str(path),
            "command": command(target, runtime, workload, budget, choices)}


__all__ = ["INPUT_LEN", "OUTPUT_LEN", "WORKLOADS", "autoplan_at", "command", "counts",
           "prepare_for", "request", "score_peer"]
