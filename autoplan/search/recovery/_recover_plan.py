"""`autoplan recover plan.json`: a recovery pass on a finished plan, written as a new plan.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import copy
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoplan.errors import UserInputError
from autoplan.export import pick_runtime, plan_settings, prepare
from autoplan.export.calibration import CalibrationArgs, plan_dataset
from autoplan.models.graph import set_module
from autoplan.plan import schema as ps
from autoplan.plan.io import save_plan
from autoplan.quality.evaluator import QualityEvaluator
from autoplan.quality.slices import build_slices
from autoplan.recover import RecoverySettings, weights_path_for
from autoplan.search.recovery._stage import plan_quality, recovery_text, run_key, run_pass
from autoplan.search.reporter import Reporter
from autoplan.search.verify import QualityBudget, build_gates

if TYPE_CHECKING:
    from autoplan.models import LoadedModel


@dataclass(frozen=True)
class RecoverOptions:
    """What `recover_plan` needs besides the plan and the model."""

    settings: RecoverySettings
    out: Path
    calibration: CalibrationArgs = CalibrationArgs()
    lmeval_tasks: str | None = None
    lmeval_limit: int | None = None


def default_out(plan_path: str | Path) -> Path:
    p = Path(plan_path)
    return p.with_name(f"{p.stem}-recovered.json")


def _budgets(plan: ps.Plan) -> tuple[QualityBudget, ...]:
    texts = [plan.budget.text, *plan.budget.also]
    return tuple(QualityBudget.parse(t) for t in texts)


def _evaluator(plan: ps.Plan, loaded: LoadedModel, eval_tokens: Any, opts: RecoverOptions,
               budgets: tuple[QualityBudget, ...]) -> QualityEvaluator:
    from autoplan.quality.suite import load_suite

    suite = load_suite(budgets[0].suite_file, loaded.tokenizer) if budgets[0].suite_file else None
    gates = build_gates(budgets, loaded, seed=plan.search.seed, lmeval_tasks=opts.lmeval_tasks,
                        lmeval_limit=opts.lmeval_limit)
    return QualityEvaluator(loaded.model, eval_tokens, suite=suite,
                            slices=build_slices(loaded.tokenizer), gates=gates)


def recover_plan(plan: ps.Plan, loaded: LoadedModel, opts: RecoverOptions,
                 reporter: Reporter | None = None) -> ps.Plan:
    """Recover ``plan``'s compressed layers; write and return the recovered plan.

    Raises:
        UserInputError: an already recovered plan, a model or calibration text that is not
            the plan's, or an unwritable ``out``.
        RecoveryDiverged: the pass diverged (nothing is written).
    """
    rep = reporter or Reporter()
    if plan.recovery is not None:
        raise UserInputError("this plan is already recovered: recover the plan it came from")
    if Path(opts.out).resolve() == weights_path_for(opts.out).resolve():
        raise UserInputError("--out must be a .json plan file")
    data, batch = plan_dataset(plan, loaded, opts.calibration)
    calib = list(data.calib.split(batch))
    rep.stage("recomputing the plan's layers")
    checked = prepare(plan, loaded, "recover", (pick_runtime(plan, (plan.runtime.name,)),),
                      calibration=calib)
    from autoplan.compress import collect_stats

    compression = plan_settings(plan)
    layers = {n: sim for n, sim in checked.sims.items() if n in plan.audit.tensors}
    if not layers:
        raise UserInputError("the plan compresses no layer: there is nothing to recover")
    stats = collect_stats(loaded.model, list(layers), calib) if (
        compression.needs_hessian) else None
    budgets = _budgets(plan)
    rep.stage("measuring the original model")
    evaluator = _evaluator(plan, loaded, data.eval, opts, budgets)
    compressed = copy.deepcopy(loaded.model)
    for name, sim in layers.items():
        set_module(compressed, name, sim)
    before = evaluator.evaluate(compressed)
    text = recovery_text(opts.settings, loaded.tokenizer)
    key = run_key(loaded.content_hash, checked.choices, compression, opts.settings,
                  text.content_hash)
    work = opts.out.with_name(opts.out.name + ".recovery")
    rep.stage(f"recovering {len(layers)} layers ({opts.settings.method}, "
              f"{opts.settings.steps} steps)")
    done = run_pass(loaded.model, compressed, dict(layers), stats, compression, opts.settings,
                    text, key, work, rep)
    rep.stage("measuring the recovered model")
    after = evaluator.evaluate(done.model)
    adapter_kl = evaluator.evaluate(done.adapter_model).kl if done.adapter_model else None
    passed = all(b.passes(after) for b in budgets)
    before_ok = all(b.passes(before) for b in budgets)
    surrogate = plan.quality.surrogate_kl
    dest = weights_path_for(opts.out)
    record = done.record(plan_quality(before, surrogate, before_ok),
                         dict(plan.audit.tensors), adapter_kl)
    record = record.model_copy(update={"weights_file": dest.name})
    from autoplan.compress import audit_digests

    new = plan.model_copy(update={
        "quality": plan_quality(after, surrogate, passed),
        "audit": plan.audit.model_copy(update={"tensors": audit_digests(done.sims)}),
        "recovery": record})
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.copyfile(done.weights_file, tmp)
    tmp.replace(dest)
    save_plan(new, opts.out)
    shutil.rmtree(work, ignore_errors=True)
    return new


__all__ = ["RecoverOptions", "default_out", "recover_plan"]
