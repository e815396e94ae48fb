"""Checks a search runs before any work: everything that would otherwise fail only after
minutes of loading, profiling and kernel timing, or after the whole search (the plan file).

`preflight` resolves the platform (target, runtime, whether this machine's kernels are
timed), checks that the plan and the study can be written and opened, and that the model
can be loaded and, for ONNX Runtime, exported: each refusal is one line naming the fix.
"""

from __future__ import annotations

from dataclasses import dataclass

from optuna.storages import BaseStorage

from autoplan.backends.registry import resolve_target as get_target
from autoplan.cost.operating import OperatingPoint, resolve_operating_point
from autoplan.errors import UserInputError
from autoplan.quality.text import check_text_source
from autoplan.runtimes import default_runtime, get_runtime
from autoplan.search.jobs import check_storage, default_storage_url, redact
from autoplan.search.stages._request import SearchRequest
from autoplan.search.writable import check_writable_file
from autoplan.streaming.device import resolve_device
from autoplan.targets import Target

# Runtimes whose kernels --measure-kernels times on this machine, and what times them.
KERNEL_TABLES = {"onnxruntime": ("ONNX Runtime", "autoplan.backends.cpu.predict"),
                 "llama.cpp": ("llama.cpp (ggml)", "autoplan.engines.ggml_microbench")}
# Plans for this runtime become artifacts through autoplan's own ONNX export (`apply`).
ONNX_RUNTIME = "onnxruntime"


@dataclass(frozen=True)
class Platform:
    """What the request resolves to once checked."""

    target: Target
    runtime: str
    measure_kernels: bool
    storage: BaseStorage | str  # an Optuna storage object, or a URL checked and reachable
    storage_label: str  # for the plan: the URL without its password, or the object's type
    point: OperatingPoint | None = None  # the resolved `--batch max` / SLO operating point


def measures_kernels(req: SearchRequest, target: str, runtime: str) -> bool:
    """Whether this machine's kernels are timed: as asked, else exactly when planning for it."""
    if req.measure_kernels is not None:
        return req.measure_kernels
    return target == "local" and runtime in KERNEL_TABLES and req.cost_table is None


def _check_kernel_timing(target: Target, runtime: str) -> None:
    if target.name != "local" or runtime not in KERNEL_TABLES:
        raise UserInputError("--measure-kernels times this machine's kernels: use it with "
                             "--target local and --runtime onnxruntime or llama.cpp")
    if runtime == "llama.cpp":
        from autoplan.engines import engine_python

        engine_python("llama.cpp")  # a missing engine is refused before any work


def _storage(req: SearchRequest) -> tuple[BaseStorage | str, str]:
    if isinstance(req.storage, BaseStorage):
        return req.storage, f"{type(req.storage).__name__} (passed in)"
    url = req.storage or default_storage_url(req.out)
    check_storage(url)  # validated and opened: a bad URL or a missing driver fails now
    return url, redact(url)


def check_model(model: str, runtime: str) -> None:
    """Refuse, from its config and file headers alone, a model the search could not finish.

    For ONNX Runtime the architecture must be one autoplan's ONNX export builds, or the
    search would profile and time kernels for minutes and write a plan `apply` cannot use.
    """
    from autoplan.models.loader import check_loadable

    if runtime == ONNX_RUNTIME:
        _check_onnx_exportable(model)
    check_loadable(model)  # weights present and whole, a GGUF readable: headers only


def operating_point(req: SearchRequest, target: Target) -> OperatingPoint | None:
    """The request's `--batch max` / SLO operating point on this target, from the model's
    config alone, for the uncompressed baseline of the target's search space (so every plan
    fits there too); None when the workload's batch is fixed."""
    if req.operating is None or req.operating.mode == "fixed":
        return None
    from autoplan.cost.model import CostModel
    from autoplan.formats import Choice
    from autoplan.models.loader import load_spec
    from autoplan.search.optimize import load_space_file

    spec = load_spec(req.model)
    baseline = Choice.parse(load_space_file(target.platform).baseline)
    measured = req.cost_table.document if req.cost_table else None
    return resolve_operating_point(
        spec, target, None, req.operating,
        model_for=lambda w: CostModel(spec, target, w, price_per_hour=req.price_per_hour,
                                      measured=measured, baseline=baseline))


def _check_onnx_exportable(model: str) -> None:
    """The architecture and the config flags autoplan's ONNX export needs, from the config
    alone (a multimodal wrapper such as Gemma 3's image-text `gemma3` is refused by its own
    model_type, although its text model is supported)."""
    from types import SimpleNamespace

    from autoplan.backends.cpu.onnx_graph import SUPPORTED_TYPES, check_supported
    from autoplan.errors import ModelConfigError
    from autoplan.models.loader import load_config_dict, load_spec

    load_spec(model)  # refuses what autoplan cannot plan at all (MoE, unknown types)
    cfg = load_config_dict(model)
    model_type = str(cfg.get("model_type", ""))
    if model_type not in SUPPORTED_TYPES:
        raise UserInputError(
            f"--runtime onnxruntime plans are applied through autoplan's ONNX export, which "
            f"supports model_type {', '.join(SUPPORTED_TYPES)}, not '{model_type}': plan "
            "this model for another runtime or target")
    try:
        check_supported(SimpleNamespace(**cfg))
    except ModelConfigError as exc:
        raise UserInputError(f"--runtime onnxruntime plans are applied through autoplan's "
                             f"ONNX export: {exc}") from None


def in_memory_only(req: SearchRequest, measure_kernels: bool) -> str | None:
    """What in the request cannot stream (named as the user gave it), or None."""
    gated = [b.text for b in req.budgets if b.metric in ("gate", "slice")]
    return ("--measure-kernels" if measure_kernels else "a suite budget"
            if req.budget.suite_file else f"budget '{gated[0]}'" if gated
            else "--recover" if req.recovery is not None else None)


def _check_gates(req: SearchRequest, measure_kernels: bool) -> None:
    """Gates, suites, kernel timing and recovery that cannot run as asked, refused before
    the model loads."""
    what = in_memory_only(req, measure_kernels)
    if what and req.execution.execution == "stream":
        raise UserInputError(f"{what} needs the model in memory: pass --execution memory")
    for b in req.budgets:
        if b.name and b.name.startswith("lm-eval:"):
            from autoplan.quality.lmeval import check_task

            check_task(b.name.removeprefix("lm-eval:"), req.lmeval_tasks)
    if req.recovery is not None and req.recovery.method == "lora":
        try:
            import peft  # noqa: F401
        except ModuleNotFoundError:
            raise UserInputError("--recover lora needs PEFT: pip install 'autoplan[eval]'") \
                from None


def preflight(req: SearchRequest) -> Platform:
    """Resolve and check everything that can be checked before loading the model.

    Raises:
        UserInputError: one line naming the fix.
    """
    target = get_target(req.target)
    runtime = get_runtime(req.runtime).name if req.runtime else default_runtime(target)
    measure = measures_kernels(req, target.name, runtime)
    if measure:
        _check_kernel_timing(target, runtime)
    resolve_device(req.execution.device)  # a GPU that is not there: one line, before any work
    check_writable_file(req.out, "plan", "pass --out FILE in a writable folder")
    check_model(req.model, runtime)
    check_text_source(req.text)  # a missing calibration file, before the model loads
    _check_gates(req, measure)
    point = operating_point(req, target)  # config only; "nothing fits" is refused here
    storage, label = _storage(req)  # last: opening an SQLite URL creates its file
    return Platform(target, runtime, measure, storage, label, point)


__all__ = ["KERNEL_TABLES", "Platform", "check_model", "in_memory_only", "measures_kernels",
           "operating_point", "preflight"]
