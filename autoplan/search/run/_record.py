"""What a search records in its job queue so `autoplan worker` can rebuild its inputs.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autoplan.compress import CompressionSettings
from autoplan.errors import UserInputError
from autoplan.search.request import CostTable, ExecutionSettings, SearchRequest
from autoplan.search.preparation import Prepared
from autoplan.sensitivity import SensitivityProfile
from autoplan.workload import Workload

RECORD_VERSION = 2  # 2: further budgets, slices and lm-eval settings


def _path_or_name(text: str | None) -> str | None:
    """An existing local path made absolute (a worker may run elsewhere); anything else (an
    alias, a hub id) as given."""
    if text is None:
        return None
    p = Path(text).expanduser()
    return str(p.resolve()) if p.exists() else text


def request_record(prep: Prepared) -> dict[str, Any]:
    req = prep.req
    cost_table = None
    if prep.kernel_times is not None:  # measured here or read from --cost-table
        cost_table = {"source": req.cost_table.source if req.cost_table else
                      f"kernels timed by the search on {prep.platform.target.name}",
                      "document": prep.kernel_times}
    return {
        "version": RECORD_VERSION, "study": prep.study_name,
        "model": _path_or_name(req.model), "target": req.target,
        "runtime": prep.platform.runtime, "budget": req.budget.text,
        "objective": req.objective.value, "workload": req.workload.model_dump(),
        "trials": req.trials, "seed": req.seed, "multi_objective": req.multi_objective,
        "settings": {"prune_score": req.settings.prune_score.value,
                     "quant_method": req.settings.quant_method.value,
                     "solver_threads": req.settings.solver_threads},
        "text": _path_or_name(req.text), "seq_len": req.seq_len,
        "calib_blocks": req.calib_blocks, "eval_blocks": req.eval_blocks,
        "protect_first_block": req.protect_first_block,
        "protect_last_block": req.protect_last_block, "verify_top": req.verify_top,
        "max_rounds": req.max_rounds, "price_per_hour": req.price_per_hour,
        "trust_remote_code": req.trust_remote_code, "cost_table": cost_table,
        "choices": None if req.choices is None else [str(c) for c in req.choices],
        "threads": req.threads,
        # what the worker's evaluator must measure besides KL, for the driver's budgets
        "also": [b.text for b in req.also], "slices": req.slices,
        "lmeval_tasks": _path_or_name(req.lmeval_tasks), "lmeval_limit": req.lmeval_limit,
        "profile": prep.profile.to_json(),
        "model_hash": prep.loaded.content_hash, "data_hash": prep.data.content_hash,
    }


def request_from_record(rec: dict[str, Any], storage: Any, execution: ExecutionSettings
                        ) -> tuple[SearchRequest, SensitivityProfile]:
    """The worker's request (its own execution settings; kernel times as a cost table, never
    re-timed) and the driver's profile."""
    if rec.get("version") != RECORD_VERSION:
        raise UserInputError(f"study {rec.get('study')} was recorded by another autoplan "
                             f"version (record {rec.get('version')}, this one reads "
                             f"{RECORD_VERSION}): run the worker with the search's autoplan")
    table = rec["cost_table"]
    req = SearchRequest(
        model=rec["model"], target=rec["target"], runtime=rec["runtime"],
        budget=rec["budget"], objective=rec["objective"],
        workload=Workload(**rec["workload"]), trials=rec["trials"], seed=rec["seed"],
        storage=storage, study=rec["study"], multi_objective=rec["multi_objective"],
        settings=CompressionSettings(**rec["settings"]), text=rec["text"],
        seq_len=rec["seq_len"], calib_blocks=rec["calib_blocks"],
        eval_blocks=rec["eval_blocks"], protect_first_block=rec["protect_first_block"],
        protect_last_block=rec["protect_last_block"], verify_top=rec["verify_top"],
        max_rounds=rec["max_rounds"], price_per_hour=rec["price_per_hour"],
        trust_remote_code=rec["trust_remote_code"],
        cost_table=CostTable(table["source"], table["document"]) if table else None,
        measure_kernels=False, choices=rec["choices"], also=tuple(rec["also"]),
        slices=rec["slices"], lmeval_tasks=rec["lmeval_tasks"], lmeval_limit=rec["lmeval_limit"],
        execution=ExecutionSettings(execution.device, execution.execution,
                                    execution.offload_dir, rec["threads"]))
    return req, SensitivityProfile.from_json(rec["profile"])


def check_same_inputs(rec: dict[str, Any], prep: Prepared) -> None:
    """Refuse a worker whose model or evaluation text is not the driver's."""
    for what, mine, theirs in (("model", prep.loaded.content_hash, rec["model_hash"]),
                               ("evaluation text", prep.data.content_hash, rec["data_hash"])):
        if mine != theirs:
            raise UserInputError(f"this worker's {what} differs from the search's "
                                 f"({mine[:12]} vs {theirs[:12]}): give it the same files at "
                                 "the same paths")


__all__ = ["RECORD_VERSION", "check_same_inputs", "request_from_record", "request_record"]
