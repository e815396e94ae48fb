"""`autoplan profile`: the per-layer sensitivity table (KL nats/token per layer x choice)."""

from __future__ import annotations

import time

import click
from rich.table import Table

from autoplan.cli._args import finite_positive, positive_int, seed_in_range
from autoplan.cli._execution import execution_options, settings_from
from autoplan.cli._output import console, emit_json, err_console
from autoplan.cli._progress import RichReporter
from autoplan.cli._ray import executor_for, ray_option
from autoplan.errors import UserInputError
from autoplan.prune import PruneScore
from autoplan.quant import QuantMethod


@click.command("profile")
@click.option("--model", default="smollm2-135m", show_default=True)
@click.option("--target", default="h100-sxm", show_default=True)
@click.option("--runtime", default=None, help="Profile one runtime's space (default: all runtimes' on the target).")
@click.option("--choices", default=None, help="Comma-separated choices instead of the target's space, e.g. fp8,int4_g64,2:4+bf16.")
@click.option("--prune-score", type=click.Choice(PruneScore.values()), default=PruneScore.WANDA.value, show_default=True)
@click.option("--quant-method", type=click.Choice(QuantMethod.values()), default=QuantMethod.RTN.value, show_default=True)
@click.option("--text", default=None, help="Calibration text (.txt or .jsonl); default pydoc topics.")
@click.option("--calib-blocks", type=int, default=4, show_default=True, help="Calibration blocks of --seq-len tokens.")
@click.option("--seq-len", type=int, default=256, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@execution_options
@click.option("--dry-run", is_flag=True, help="Print the memory plan (weights, captures, "
              "activations, peak; host vs device) from config.json alone, and exit.")
@click.option("--gpu-memory", type=float, default=None, help="GiB of the GPU to plan for "
              "with --dry-run (default: this machine's GPU, else 80).")
@click.option("--host-memory", type=float, default=None, help="GiB of host RAM to plan for "
              "with --dry-run (default: what is available here now).")
@click.option("--json", "as_json", is_flag=True)
@click.option("--quiet", is_flag=True)
@ray_option
def command(model, target, runtime, choices, prune_score, quant_method, text, calib_blocks,  # noqa: ANN001, PLR0913
            seq_len, seed, device, execution, offload_dir, dry_run, gpu_memory, host_memory,
            as_json, quiet, ray_address) -> None:
    """Profile every layer x choice (cached on disk, resumable) and show the table."""
    from autoplan.streaming.device import check_device_cheaply, parse_device_name

    # argument checks first, before the stack is imported (torch: seconds) or the model
    # loaded: a bad count or device name is answered at once
    positive_int("calib-blocks", calib_blocks)
    if seq_len < 2:  # a block predicts its tokens from the ones before: 2 at least
        raise UserInputError(f"--seq-len must be >= 2, got {seq_len}")
    seed_in_range(seed)
    finite_positive("gpu-memory", gpu_memory)
    finite_positive("host-memory", host_memory)
    parse_device_name(device)  # whether this machine has that GPU: below, or torch's later
    from autoplan.backends.registry import resolve_target as get_target
    from autoplan.runtimes import get_runtime

    if not dry_run:  # names too (the dry run reads the target only for the lm_head's role)
        get_target(target)
        if runtime:
            get_runtime(runtime)
    from autoplan.formats import parse_choices
    from autoplan.models.registry import resolve_model_arg
    from autoplan.quality.text import check_text_source

    if dry_run:  # a bundled config name: the dry run needs its config only
        from autoplan.models.registry import bundled_config_path

        model = str(bundled_config_path(model) or model)
    # what the arguments and a file's existence show, before the stack is imported
    resolve_model_arg(model)  # no such file, folder or alias
    parsed = None if choices is None else parse_choices(
        tuple(c.strip() for c in choices.split(",") if c.strip()))
    if not dry_run:
        check_text_source(text)
        check_device_cheaply(device)  # a GPU on a machine without one (the dry run plans one)
    from autoplan.cache_dir import cache_root
    from autoplan.models import check_loadable
    from autoplan.quality.text import load_text_dataset
    from autoplan.search import profile_scope
    from autoplan.sensitivity import calibration_key
    from autoplan.streaming import open_model
    from autoplan.streaming.runner import workload_of

    t0 = time.perf_counter()
    work = workload_of(seq_len, calib_blocks, 6)  # eval blocks: `autoplan search`'s default
    if dry_run:
        _dry_run(model, device, _with_head(work, target), gpu_memory, host_memory, as_json)
        return
    # connected first, so a bad --ray fails before the model loads; closed with the command
    executor = click.get_current_context().with_resource(executor_for(ray_address))
    tgt = get_target(target)
    if runtime:
        get_runtime(runtime)
    from autoplan.compress import CompressionSettings

    check_loadable(model)  # headers only: no weights, damaged files, an unreadable GGUF
    settings = CompressionSettings(prune_score, quant_method)
    runner = open_model(model, settings_from(device, execution, offload_dir), workload=work)
    loaded = runner.loaded
    if not (quiet or as_json):
        err_console.print(f"{runner.execution} execution on {runner.device} ({runner.why})")
    layers, scope, _baseline = profile_scope(loaded.spec, tgt, runtime)
    if parsed:
        scope = parsed
    data = load_text_dataset(text, tokenizer=loaded.tokenizer, seq_len=seq_len,
                             n_calib=calib_blocks, n_eval=0, seed=seed)
    with RichReporter(quiet=quiet or as_json) as rep:
        batches = list(data.calib.split(2))
        prof = runner.build_profile(layers, scope, batches,
                             model_hash=loaded.content_hash, calib_hash=calibration_key(batches),
                             settings=settings, cache_dir=cache_root() / "profiles", seed=seed,
                             on_progress=lambda d, t: rep.progress("profile", d, t),
                             executor=executor)
    wall = time.perf_counter() - t0
    keys = [str(c) for c in scope]
    if as_json:
        emit_json({"model": loaded.model_id, "model_hash": loaded.content_hash,
                   "target": tgt.name, "calibration_hash": data.content_hash,
                   "tokens": prof.tokens, "unit": "KL nats/token (surrogate)",
                   "execution": runner.execution, "device": str(runner.device),
                   "wall_time_s": wall, "choices": keys,
                   "layers": {n: {k: prof.scores[n][k] for k in keys} for n in layers},
                   "outlier_ratio": {n: prof.outliers.get(n) for n in layers}})
        return
    table = Table(title=f"sensitivity of {loaded.model_id} for {tgt.name}: surrogate KL "
                        f"(nats/token x 1e3) per layer x choice, {prof.tokens} calibration tokens")
    table.add_column("layer", overflow="fold")  # a narrow terminal folds a name, never cuts it
    for k in keys:
        table.add_column(k, justify="right")
    for n in layers:
        table.add_row(n, *[f"{prof.scores[n][k] * 1e3:.3f}" for k in keys])
    console.print(table)
    console.print(f"{len(layers)} layers x {len(keys)} choices in {wall:.1f} s")


def _with_head(work, target: str):  # noqa: ANN001, ANN202 - an estimate.Workload
    """`work` saying whether the target's search space profiles the lm_head (the CPU one
    does; the GPU ones protect it), which decides its T x vocab captures."""
    import dataclasses

    from autoplan.backends.registry import resolve_target
    from autoplan.search import load_space_file

    roles = load_space_file(resolve_target(target).platform).protect_roles
    return dataclasses.replace(work, head_profiled="lm_head" not in roles)


def _dry_run(model, device, work, gpu_memory, host_memory, as_json) -> None:  # noqa: ANN001
    from autoplan.models import load_spec
    from autoplan.streaming.dryrun import dry_run, render

    report = dry_run(load_spec(model), device, work, gpu_memory_gb=gpu_memory,
                     host_memory_gb=host_memory)
    if as_json:
        emit_json(report)
        return
    for line in render(report):
        click.echo(line)  # plain lines: no wrapping, greppable
