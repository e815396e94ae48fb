"""`autoplan search`: the main job. Thin over autoplan.search.run_search."""

from __future__ import annotations

from pathlib import Path

import click

from autoplan.cli._args import finite_non_negative, positive_int, seed_in_range
from autoplan.cli._execution import execution_options, settings_from
from autoplan.cli._output import console, emit_json, err_console
from autoplan.cli._plan_view import render
from autoplan.cli._progress import RichReporter
from autoplan.cli._ray import executor_for, ray_option
from autoplan.cli._recover_options import method_option, recover_options, recovery_settings
from autoplan.cli._workload_options import operating_from, workload_options
from autoplan.cost.report import Objective
from autoplan.prune import PruneScore
from autoplan.quant import QuantMethod


@click.command("search")
@click.option("--model", default="smollm2-135m", show_default=True,
              help="Alias, HF folder or GGUF file.")
@click.option("--target", default="h100-sxm", show_default=True, help="Catalog target (autoplan targets).")
@click.option("--runtime", default=None, help="vllm | tensorrt-llm | sglang | torchao | onnxruntime | llama.cpp | autoplan (default: the target's usual engine).")
@click.option("--budget", "budgets", multiple=True, default=("kl<=0.05",), show_default=True,
              help="kl<=X, ppl<=+P% (or ppl<=+X), suite:FILE>=-POINTS, kl:SLICE<=X (numbers, "
                   "names, non-english), longctx[:MAXLEN]>=-POINTS or lm-eval:TASK>=-POINTS; "
                   "repeat it: the first steers the search, every one must pass.")
@click.option("--objective", type=click.Choice(Objective.values()),
              default=Objective.THROUGHPUT.value, show_default=True)
@workload_options(32)
@click.option("--trials", type=int, default=2000, show_default=True,
              help="Surrogate trials of the first round; each later round runs a quarter as "
                   "many (the plan records the total).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--storage", default=None, help="Optuna storage URL (default: journal file beside --out).")
@click.option("--study", default=None, help="Study name (default: derived from all settings).")
@click.option("--out", type=click.Path(path_type=Path), default=Path("plan.json"),
              show_default=True, help="Plan file to write (checked writable before the search).")
@click.option("--multi-objective", is_flag=True, help="Also report the Pareto front of objective vs predicted KL.")
@click.option("--prune-score", type=click.Choice(PruneScore.values()), default=PruneScore.WANDA.value,
              show_default=True)
@click.option("--quant-method", type=click.Choice(QuantMethod.values()), default=QuantMethod.RTN.value, show_default=True)
@click.option("--text", default=None, help="Calibration/evaluation text (.txt or .jsonl); default pydoc topics.")
@click.option("--protect-first/--no-protect-first", default=None, help="Keep block 0 uncompressed.")
@click.option("--protect-last/--no-protect-last", default=None, help="Keep the last block uncompressed.")
@click.option("--price-per-hour", type=float, default=None, help="Override the target's $/hour.")
@click.option("--cost-table", default=None, help="Measured GEMM times (cost_table.json from benchmarks/gpu_check.sh) replacing the analytic ones.")
@click.option("--measure-kernels/--no-measure-kernels", default=None,
              help="Time this machine's kernels (ONNX Runtime's, or ggml's for llama.cpp) for "
                   "every candidate (cached) and plan with them instead of the roofline. "
                   "Default: on for --target local with --runtime onnxruntime or llama.cpp, "
                   "the only places it applies.")
@click.option("--choices", default=None,
              help="Comma-separated formats to search (e.g. int8a8_g128 or "
                   "int4a8_g32,int4a8_g64, or q4_0,q4_1,q8_0 on llama.cpp); default: the "
                   "platform's search space.")
@click.option("--threads", type=int, default=None,
              help="Engine threads the measured kernels are timed with (default: physical "
                   "cores); use what the engine will run with.")
@click.option("--min-gain", type=float, default=None,
              help="Predicted speed gain (0.05 = 5 %) a plan needs over a measured candidate "
                   "of better quality to be returned instead of it. Default: the speed "
                   "prediction's uncertainty for the target and runtime (the plan says it).")
@click.option("--kv-cache", "kv_cache", default=None,
              help="KV-cache formats searched with the weights, each at its own operating "
                   "point: auto (every one the runtime serves here) or a list, e.g. "
                   "fp8,fp8_e4m3_head or q8_0,q4_0; default: the runtime's own cache. A "
                   "compressed cache is also measured on long prompts and must pass the "
                   "long-context check (docs/kv-cache.md).")
@click.option("--long-len", type=int, default=0,
              help="Tokens per long-prompt block with a compressed KV cache (default: "
                   "max(2048, input + output) within the model's context).")
@execution_options
@click.option("--trust-remote-code", is_flag=True, help="Run the model folder's own code (off by default).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option("--quiet", is_flag=True, help="No progress output.")
@method_option(None)
@recover_options
@click.option("--lm-eval-tasks", default=None, help="Folder of local lm-eval task YAML files.")
@click.option("--lm-eval-limit", type=int, default=None, help="Documents per lm-eval task.")
@click.option("--slices/--no-slices", default=True, show_default=True,
              help="Measure KL per slice (numbers, proper names, non-English) for the plan "
                   "(for every candidate when a budget names a slice).")
@ray_option
def command(model, target, runtime, budgets, objective, batch, input_len, output_len, ttft_ms,  # noqa: ANN001, PLR0913
            tpot_ms, trials, seed, storage, study, out, multi_objective, prune_score, quant_method, text,
            protect_first, protect_last, price_per_hour, cost_table, measure_kernels, choices,
            threads, min_gain, device, execution, offload_dir, trust_remote_code, as_json, quiet,
            recover_method, recover_steps, recover_lr, recover_rank, recover_text, recover_batch,
            recover_seq_len, recover_seed, lm_eval_tasks, lm_eval_limit, slices,
            ray_address, kv_cache=None, long_len=0) -> None:
    """Search per-layer sparsity x precision under a quality budget; write an auditable plan."""
    from pydantic import ValidationError

    from autoplan.backends.registry import (
        MEASURE_KERNELS_FIX,
        MEASURE_OR_TABLE,
        measured_here,
        resolve_target,
    )
    from autoplan.cost.measured import load_cost_table
    from autoplan.errors import UserInputError
    from autoplan.formats import parse_choices
    from autoplan.models.registry import resolve_model_arg
    from autoplan.quality.text import check_text_source
    from autoplan.runtimes import get_runtime
    from autoplan.search import QualityBudget, check_writable_file
    from autoplan.search.storage_url import check_storage_early
    from autoplan.streaming.device import check_device_cheaply
    from autoplan.workload import Workload

    # what the arguments alone show to be wrong, before the search stack is imported
    # (torch, transformers, Optuna: seconds); run_search checks all of it again
    positive_int("trials", trials)
    seed_in_range(seed)
    budget = QualityBudget.parse(budgets[0])
    tgt = resolve_target(target)
    if runtime:
        get_runtime(runtime)
    # (with --cost-table too, SearchRequest says "not both")
    if measure_kernels and cost_table is None and not measured_here(tgt.name):
        raise UserInputError(MEASURE_KERNELS_FIX)
    check_device_cheaply(device)  # a GPU on a machine without one (preflight asks torch)
    check_text_source(text)
    if storage:  # preflight opens it, last (opening creates an SQLite file)
        check_storage_early(storage)
    price_per_hour = finite_non_negative("price-per-hour", price_per_hour)
    min_gain = finite_non_negative("min-gain", min_gain)
    picked = None if choices is None else parse_choices(
        tuple(c.strip() for c in choices.split(",") if c.strip()))
    check_writable_file(out, "plan", "pass --out FILE in a writable folder")

    operating = operating_from(batch, input_len, output_len, ttft_ms, tpot_ms, 32)
    try:  # a placeholder batch when it is resolved per target (max / SLO)
        workload = operating.fixed() or Workload(batch=1, input_len=input_len,
                                                 output_len=output_len)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise UserInputError(f"--{str(err['loc'][0]).replace('_', '-')}: {err['msg']}") from None
    # the rest of what SearchRequest refuses from the arguments, that the corpus names, then
    # the model: a name that is no file, folder or alias is refused after every argument
    recovery = recovery_settings(recover_method, recover_steps, recover_lr, recover_rank,
                                 recover_text, recover_batch, recover_seq_len, recover_seed)
    for further in budgets[1:]:  # the further budgets
        QualityBudget.parse(further)
    if cost_table is not None:
        load_cost_table(cost_table)  # a file with no measured rows (CostTable reads it again)
        if measure_kernels:
            raise UserInputError(MEASURE_OR_TABLE)
    resolve_model_arg(model)
    from autoplan.compress import CompressionSettings
    from autoplan.search import CostTable, SearchRequest, run_search

    # Every option is parsed and checked here, before minutes of loading and profiling.
    req = SearchRequest(
        model=model, target=target, runtime=runtime, budget=budget,
        also=tuple(budgets[1:]), lmeval_tasks=lm_eval_tasks, lmeval_limit=lm_eval_limit,
        slices=slices, recovery=recovery,
        objective=Objective(objective), workload=workload, trials=trials, seed=seed,
        storage=storage, study=study, out=out, multi_objective=multi_objective,
        settings=CompressionSettings(prune_score, quant_method), text=text,
        protect_first_block=protect_first, protect_last_block=protect_last,
        price_per_hour=price_per_hour, min_gain=min_gain, trust_remote_code=trust_remote_code,
        cost_table=CostTable.load(cost_table) if cost_table else None,
        measure_kernels=measure_kernels, execution=settings_from(device, execution, offload_dir, threads),
        operating=None if operating.mode == "fixed" else operating,
        choices=picked,
        kv_cache=kv_cache, long_len=long_len,
        # connected now, so a bad --ray fails before the model loads; closed with the command
        executor=click.get_current_context().with_resource(executor_for(ray_address)))
    with RichReporter(quiet=quiet or as_json) as reporter:
        outcome = run_search(req, reporter)
    if as_json:
        emit_json(outcome.plan.model_dump(mode="json") | ({"pareto_front": outcome.front}
                                                         if outcome.front else {}))
        return
    if not quiet:
        console.print(render(outcome.plan))
        if outcome.front:
            console.print(f"Pareto front: {len(outcome.front)} points (objective vs predicted KL); "
                          "--json prints them")
    err_console.print(f"plan written to {out}")
