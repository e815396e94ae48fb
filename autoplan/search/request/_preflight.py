"""Checks a search runs before any work: everything that would otherwise fail only after
minutes of loading, profiling and kernel timing, or after the whole search (the plan file).

`preflight` resolves the platform (target, runtime, whether this machine's kernels are
timed), checks that the plan and the study can be written and opened, and that the model
can be loaded and, for ONNX Runtime, exported: each refusal is one line naming the fix.
"""

from __future__ import annotations

from dataclasses import dataclass

from optuna.storages import BaseStorage

from autoplan.backends.kernel_timers import KernelTimer
from autoplan.backends.registry import MEASURE_KERNELS_FIX, backend_names, get_backend
from autoplan.backends.registry import resolve_target as get_target
from autoplan.cost.operating import NoOperatingPoint, OperatingPoint, resolve_operating_point
from autoplan.errors import UnsupportedFormatError, UserInputError
from autoplan.formats.kv import KvFormat, kv_spec
from autoplan.quality.text import check_text_source
from autoplan.runtimes import (
    default_kv,
    default_runtime,
    get_runtime,
    kv_of_mix,
    kv_supports,
    supports,
)
from autoplan.search.jobs import check_storage, default_storage_url, redact
from autoplan.search.request._request import KV_AUTO, SearchRequest
from autoplan.search.writable import check_writable_file
from autoplan.streaming.device import resolve_device
from autoplan.targets import Target
from autoplan.workload import Workload

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
    kv: KvFormat | None = None  # the KV cache searched here (None: the runtime's own)
    kv_default: KvFormat | None = None  # the runtime's own cache: the reference
    unfit: UnfitBaseline | None = None  # the uncompressed model does not fit the target

    @property
    def kv_compressed(self) -> bool:
        """The cache differs from the runtime's own (it is simulated, and measured on long
        prompts too)."""
        return self.kv is not None and self.kv != self.kv_default


@dataclass(frozen=True)
class UnfitBaseline:
    """The uncompressed model does not fit the target (at batch 1, or at the fixed batch):
    the search plans with the formats no larger than `reference`, the largest whose uniform
    recipe (protected layers at the baseline) fits, at the batch where that recipe fits."""

    baseline: str
    needed_bytes: float
    usable_bytes: float
    reference: str

    def describe(self, target: str) -> str:
        return (f"the uncompressed model ({self.baseline}) does not fit on {target}: it needs "
                f"{self.needed_bytes / 1e9:,.2f} GB, {self.usable_bytes / 1e9:,.2f} GB is "
                f"usable; planning with formats no larger than {self.reference}, whose "
                "uniform recipe fits")


def kernel_timer(target: str, runtime: str) -> KernelTimer | None:
    """How `runtime`'s kernels are timed on `target`: asked of the backend that measures
    that target on this machine (the CPU backend's `local`); None elsewhere."""
    import autoplan.engines  # noqa: F401 - the llama.cpp engine registers ggml's timer

    for name in backend_names():
        backend = get_backend(name)
        if target in backend.measured_targets():
            return backend.kernel_timer(runtime)
    return None


def measures_kernels(req: SearchRequest, target: str, runtime: str) -> bool:
    """Whether this machine's kernels are timed: as asked, else exactly when planning for it."""
    if req.measure_kernels is not None:
        return req.measure_kernels
    return req.cost_table is None and kernel_timer(target, runtime) is not None


def _check_kernel_timing(target: Target, runtime: str) -> None:
    if kernel_timer(target.name, runtime) is None:
        raise UserInputError(MEASURE_KERNELS_FIX)
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


def operating_point(req: SearchRequest, target: Target, runtime: str | None = None,
                    kv: KvFormat | None = None
                    ) -> tuple[OperatingPoint | None, UnfitBaseline | None]:
    """The request's `--batch max` / SLO operating point on this target (None when the batch
    is fixed), from the model's config alone, for the uncompressed baseline of the target's
    search space with the KV cache `kv`, so every plan with that cache fits there too.

    When the baseline does not fit at all (at batch 1, or at the fixed batch), the point is
    resolved for the largest format the runtime accelerates whose uniform recipe fits
    (`UnfitBaseline` says which): the baseline never blocks the formats that fit.

    Raises:
        NoOperatingPoint: not even the smallest format fits, or nothing meets the SLO.
    """
    from autoplan.cost.model import CostModel
    from autoplan.cost.operating import NoOperatingPoint
    from autoplan.formats import Choice
    from autoplan.models.loader import load_spec
    from autoplan.search.optimize import load_space_file

    fixed = req.operating is None or req.operating.mode == "fixed"
    spec = load_spec(req.model)
    sf = load_space_file(target.platform)
    baseline = Choice.parse(sf.baseline)
    measured = req.cost_table.document if req.cost_table else None

    def model_for(w: Workload) -> CostModel:
        return CostModel(spec, target, w, price_per_hour=req.price_per_hour,
                         measured=measured, baseline=baseline, kv=kv)

    def resolve(decisions: dict | None) -> OperatingPoint | None:
        if fixed:  # a fixed batch: does it fit there?
            cm = model_for(req.workload)
            mem = cm.memory(cm.resolve(decisions))
            if not mem.fits:
                raise NoOperatingPoint(f"at batch {req.workload.batch} it needs "
                                       f"{mem.total_bytes / 1e9:,.2f} GB",
                                       mem.total_bytes, mem.capacity_bytes)
            return None
        return resolve_operating_point(spec, target, decisions, req.operating,
                                       model_for=model_for)

    try:
        return resolve(None), None
    except NoOperatingPoint as exc:
        if exc.needed_bytes is None:  # memory is fine; the SLO is what no batch meets
            raise
        unfit = exc
    pool = [Choice.parse(c) for c in sf.candidates] if req.choices is None else list(req.choices)
    fitting = [c for c in pool if c != baseline and c.sparsity.kind == "dense"
               and supports(target, runtime or default_runtime(target), c).ok]
    fitting.sort(key=lambda c: -_weight_bits(c))
    smallest: NoOperatingPoint | None = None
    for choice in fitting:
        decisions = {la.name: baseline if la.role in sf.protect_roles else choice
                     for la in spec.layers}
        try:
            point = resolve(decisions)
        except NoOperatingPoint as exc:
            if exc.needed_bytes is None:
                raise
            smallest = exc
            continue
        return point, UnfitBaseline(str(baseline), unfit.needed_bytes, unfit.usable_bytes,
                                    str(choice))
    if smallest is None:
        raise unfit
    at = f"batch {req.workload.batch}" if fixed else "batch 1"
    raise NoOperatingPoint(
        f"nothing fits on {target.name} at {at}: the uncompressed model needs "
        f"{unfit.needed_bytes / 1e9:,.2f} GB and even {fitting[-1]} everywhere "
        f"{smallest.needed_bytes / 1e9:,.2f} GB, {unfit.usable_bytes / 1e9:,.2f} GB is "
        "usable: shorten the lengths, lower --batch, or pick a target with more memory",
        unfit.needed_bytes, unfit.usable_bytes)


def kv_options(req: SearchRequest, target: Target, runtime: str) -> list[KvFormat]:
    """The KV caches to search, the runtime's own first: none else without --kv-cache;
    with `auto` every quantized format it serves on the target that the model's head_dim
    allows; listed formats each checked.

    Raises:
        UnsupportedFormatError: a listed format the engine does not serve there (its reason),
            or one the model's head_dim cannot hold.
    """
    own = default_kv(target, runtime)
    if req.kv_cache is None:
        return [own]
    from autoplan.models.loader import load_spec

    spec = load_spec(req.model)
    head_dim = spec.head_dim
    kv_cache = req.kv_cache
    if req.kv_mix is not None:  # a per-block mix: refused unless it is one format
        kv_cache = (kv_of_mix(runtime, req.kv_mix, spec.n_layers, own),)
    if kv_cache == (KV_AUTO,):
        return [own] + [k for k in KvFormat if kv_spec(k).quantized and k != own
                        and kv_supports(target, runtime, k).ok
                        and not kv_spec(k).shape_problem(head_dim)]
    out = [own]
    for k in kv_cache:  # type: ignore[union-attr]
        answer = kv_supports(target, runtime, k)
        if not answer.ok:
            raise UnsupportedFormatError(f"--kv-cache {k.value}: {answer.reason}")
        problem = kv_spec(k).shape_problem(head_dim)
        if problem:
            raise UnsupportedFormatError(f"--kv-cache {k.value}: {problem}; pick another")
        if k not in out:
            out.append(k)
    return out


def _weight_bits(choice) -> float:  # noqa: ANN001 - a Choice
    """Stored bits per weight of a dense format (values and scales)."""
    info = choice.precision.info
    return info.value_bits + info.scale_bits


def fits_reference(choice, reference: str) -> bool:  # noqa: ANN001 - a Choice
    """Whether `choice` stores a weight in no more bits than `reference` (pruned formats
    store fewer values, counted by their density)."""
    from autoplan.formats import Choice

    return _weight_bits(choice) * choice.sparsity.density <= _weight_bits(
        Choice.parse(reference)) + 1e-9


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
            else "--recover" if req.recovery is not None
            else f"--kv-cache (its long-context check, {req.kv_gate})"
            if req.kv_cache is not None else None)


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
    kvs = kv_options(req, target, runtime)  # a cache the engine does not serve: refused here
    kv = kvs[-1] if len(kvs) <= 2 and req.kv_cache not in (None, (KV_AUTO,)) else kvs[0]
    # config only: "nothing fits" is refused here; a baseline that does not fit is not
    point, unfit = operating_point(req, target, runtime, kv)
    storage, label = _storage(req)  # last: opening an SQLite URL creates its file
    return Platform(target, runtime, measure, storage, label, point, kv=kv, kv_default=kvs[0],
                    unfit=unfit)


__all__ = ["ONNX_RUNTIME", "Platform", "UnfitBaseline", "check_model", "fits_reference",
           "in_memory_only", "kernel_timer", "kv_options", "measures_kernels", "operating_point",
           "preflight"]
