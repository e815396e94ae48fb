"""Serving-runtime matrix: which (sparsity, precision) choices a runtime ACCELERATES on a target.

The facts live in autoplan/data/runtimes.toml (validated here, unknown keys rejected). A
question is answered in a fixed order, so every refusal carries the most specific reason:
global deny rules (hardware facts), the runtime's deny rules, the target's own math (from the
catalog), the runtime's accel rules, then "no kernel". Channel pruning is answered as the
dense choice of the same precision because it only shrinks the matrix.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from autoplan.errors import AutoplanError, UnknownNameError
from autoplan.modelspec import part_of
from autoplan.formats import DENSE, Choice, Precision
from autoplan.formats.kv import KvFormat
from autoplan.targets import Target, check_source, load_catalog

Platform = Literal["nvidia-gpu", "amd-gpu", "cpu", "*"]
_SPARSITY_TOKENS = frozenset(
    {"dense", "2:4", "n:m", "block", "block16", "block32", "block64", "unstructured", "*"}
)


@dataclass(frozen=True)
class Support:
    """The answer to "does this runtime accelerate this choice on this target?".

    Attributes:
        ok: True when accelerated kernels exist.
        reason: one line saying why (or why not), naming the fix where there is one.
        source: reference key (autoplan/data/references.toml) or `target:<name>`.
    """

    ok: bool
    reason: str
    source: str

    def __bool__(self) -> bool:
        return self.ok


def _known(values: tuple[str, ...], known: set[str] | frozenset[str], what: str
           ) -> tuple[str, ...]:
    """``values`` when all are ``known``, else the ValueError pydantic reports."""
    bad = sorted(set(values) - known)
    if bad:
        raise ValueError(f"unknown {what} {bad}; use {sorted(known)}")
    return values


class Rule(BaseModel):
    """One row of the matrix: which choices on which hardware, and why."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sparsity: tuple[str, ...] = ("*",)
    precision: tuple[str, ...] = ("*",)
    families: tuple[str, ...] = ("*",)
    platforms: tuple[Platform, ...] = ("*",)
    # parts of the model the rule is about (modelspec part names, e.g. "routed_experts": an
    # engine's fused-MoE kernels); "*" every layer
    parts: tuple[str, ...] = ("*",)
    reason: str = Field(min_length=1)
    source: str = Field(min_length=1)
    # False: the runtime's own kernels run these choices with vector instructions every CPU
    # of the platform has (ggml's AVX2 int8 dot products), so no matrix peak of the target
    # is required; their speed then comes from the measured kernel table.
    needs_peak: bool = True

    @field_validator("sparsity")
    @classmethod
    def _sparsity_tokens(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return _known(v, _SPARSITY_TOKENS, "sparsity tokens")

    @field_validator("precision")
    @classmethod
    def _precisions(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return _known(v, {p.value for p in Precision} | {"*"}, "precisions")

    def matches(self, target: Target, choice: Choice, part: str | None = None) -> bool:
        """True when the rule covers this target and choice (and, for a rule about some
        parts of the model, a layer of one of them)."""
        return (
            _hit(self.sparsity, _sparsity_tokens(choice))
            and _hit(self.precision, {choice.precision.value})
            and _hit(self.families, {target.family})
            and _hit(self.platforms, {target.platform})
            and (self.parts == ("*",) or part in self.parts)
        )


class KvRule(BaseModel):
    """Which KV-cache formats an engine serves on which hardware, and how (runtimes.toml)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    formats: tuple[str, ...]
    families: tuple[str, ...] = ("*",)
    platforms: tuple[Platform, ...] = ("*",)
    flag: str = ""  # the engine's KV-dtype value; "" = the format's own (llama.cpp's GGUF name)
    scales: Literal["checkpoint", "dynamic", "none"] = "none"
    query: str = ""  # the KV format the kernel rounds queries to ("" = none)
    reason: str = Field(min_length=1)
    source: str = Field(min_length=1)

    @field_validator("formats")
    @classmethod
    def _formats(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return _known(v, {k.value for k in KvFormat}, "KV formats")

    @field_validator("query")
    @classmethod
    def _query(cls, v: str) -> str:
        return _known((v,), {k.value for k in KvFormat} | {""}, "query roundings")[0]

    def matches(self, target: Target, fmt: KvFormat) -> bool:
        return (fmt.value in self.formats and _hit(self.families, {target.family})
                and _hit(self.platforms, {target.platform}))


class Runtime(BaseModel):
    """A serving engine at a version, with its deny and accel rules."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    version: str = Field(min_length=1)
    checked: str = Field(min_length=1, description="when the facts were last checked")
    platforms: tuple[Platform, ...]
    default_for: tuple[Platform, ...] = ()
    sources: tuple[str, ...] = Field(min_length=1)
    note: str = ""
    # True when the engine runs q/k/v and gate/up as one GEMM (vLLM, TensorRT-LLM, ORT
    # exports), so those layers must share one format; llama.cpp keeps them as separate
    # GGUF tensors and mul_mats, so each may take its own type.
    fused_projections: bool = True
    deny: tuple[Rule, ...] = ()
    accel: tuple[Rule, ...] = ()
    # KV cache: the cache it uses when not told (None: the model's 16-bit dtype), whether
    # layers may take different cache types, and which formats it serves where.
    kv_default: str | None = None
    kv_per_layer: bool = False
    kv_deny: tuple[KvRule, ...] = ()
    kv: tuple[KvRule, ...] = ()


class Matrix(BaseModel):
    """The whole runtimes.toml file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1]
    deny: tuple[Rule, ...] = ()
    runtime: tuple[Runtime, ...]


def _hit(allowed: tuple[str, ...], values: set[str]) -> bool:
    return "*" in allowed or not values.isdisjoint(allowed)


def _sparsity_tokens(choice: Choice) -> set[str]:
    sp = choice.sparsity
    if sp.kind == "nm":
        return {"2:4"} if (sp.n, sp.m) == (2, 4) else {"n:m"}
    if sp.kind == "block":
        return {"block", f"block{sp.block}"}
    return {sp.kind}


@cache
def load_matrix() -> Matrix:
    """Parse and check autoplan/data/runtimes.toml (sources resolve, families exist).

    Raises:
        AutoplanError: the data file is malformed; the message names the problem.
    """
    text = (resources.files("autoplan") / "data" / "runtimes.toml").read_text()
    try:
        matrix = Matrix.model_validate(tomllib.loads(text))
    except (ValidationError, tomllib.TOMLDecodeError) as exc:
        raise AutoplanError(f"autoplan/data/runtimes.toml is invalid: {exc}") from exc
    # The measured `local` target takes one of these families (backends/cpu/local_target.py).
    local = {"local-amx", "local-avx512", "local-avx2", "local-arm64", "local-generic"}
    families = {t.family for t in load_catalog().values()} | local | {"*"}
    rules = [("(global)", r) for r in matrix.deny]
    for rt in matrix.runtime:
        rules += [(rt.name, r) for r in (*rt.deny, *rt.accel)]
        for key in rt.sources:
            check_source(key, f"runtimes.toml, runtime {rt.name}")
    for rt in matrix.runtime:
        rules += [(f"{rt.name} kv", r) for r in (*rt.kv_deny, *rt.kv)]
        if rt.kv_default is not None:
            KvFormat.parse(rt.kv_default)
    for owner, rule in rules:
        check_source(rule.source, f"runtimes.toml, {owner} rule '{rule.reason[:40]}'")
        unknown = sorted(set(rule.families) - families)
        if unknown:
            raise AutoplanError(f"runtimes.toml, {owner}: unknown families {unknown}")
    return matrix


def runtime_names() -> list[str]:
    """Every runtime name, sorted."""
    return sorted(rt.name for rt in load_matrix().runtime)


def get_runtime(name: str) -> Runtime:
    """The runtime entry for a name (case-insensitive).

    Raises:
        UnknownNameError: no such runtime; lists the known names and the nearest match.
    """
    key = name.strip().lower()
    for rt in load_matrix().runtime:
        if rt.name == key:
            return rt
    raise UnknownNameError("runtime", name, runtime_names())


def default_runtime(target: Target) -> str:
    """The runtime autoplan plans for when the user names none (vLLM on GPUs, ORT on CPUs).

    Raises:
        AutoplanError: no runtime is the default for the target's platform.
    """
    for rt in load_matrix().runtime:
        if target.platform in rt.default_for:
            return rt.name
    raise AutoplanError(f"no default runtime for {target.platform} targets; pass --runtime")


# Runtimes that run inside autoplan's own interpreter, by the package that holds them: on a
# measured target (`local`, this machine) the version that runs is the installed one, which
# is what a plan for it records, not the catalog's (the version its rules were checked at).
_IN_PROCESS_PACKAGES = {"onnxruntime": "onnxruntime"}


def installed_version(runtime: str) -> str | None:
    """The version of an in-process runtime installed here, or None (not one, or absent)."""
    from importlib import metadata

    package = _IN_PROCESS_PACKAGES.get(runtime.strip().lower())
    if package is None:
        return None
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def version_on(target: Target, runtime: str) -> str:
    """The version of `runtime` a plan for `target` runs with: the installed one on a
    measured target (this machine) when autoplan runs it in-process, else the catalog's."""
    installed = installed_version(runtime) if target.measured else None
    return installed or get_runtime(runtime).version


def _hardware_gap(target: Target, choice: Choice) -> str:
    """Why the target itself cannot run the choice fast, or "" when it can."""
    info = choice.precision.info
    # Weight-only formats dequantize and multiply at the activation dtype, which on CPUs
    # without BF16 math is fp32.
    maths = (info.math, "fp32") if info.weight_only else (info.math,)
    if not any(target.peak(m) for m in maths):
        return (
            f"{target.name} has no {info.math} matrix math for {choice.precision.value}; "
            "pick a precision its peaks list (autoplan targets)"
        )
    if choice.sparsity.kind == "nm" and target.sparse_multiplier(info.math) <= 1.0:
        return f"{target.name} has no 2:4 sparse {info.math} math; use dense or channel pruning"
    return ""


def supports(target: Target, runtime: str, choice: Choice, part: str | None = None) -> Support:
    """Whether `runtime` accelerates `choice` on `target`, with the reason and its source.

    Args:
        target: a catalog or measured target.
        runtime: a runtime name (see runtime_names()).
        choice: the layer's (sparsity, precision).
        part: the layer's part of the model (modelspec `part_of`), for rules about some
            parts only (an engine's fused-MoE kernels); None: rules about every layer.

    Returns:
        Support(ok, reason, source); never raises for a known runtime.

    Raises:
        UnknownNameError: the runtime is unknown.
    """
    rt = get_runtime(runtime)
    if target.platform not in rt.platforms:
        return Support(
            False,
            f"{rt.name} does not run on {target.platform} targets (it runs on "
            f"{', '.join(rt.platforms)}); pick another runtime",
            rt.sources[0],
        )
    if choice.sparsity.kind == "channel":
        inner = supports(target, runtime, Choice(DENSE, choice.precision))
        prefix = "channel pruning runs as a smaller dense matrix; "
        return replace(inner, reason=prefix + inner.reason)
    for rule in (*load_matrix().deny, *rt.deny):
        if rule.matches(target, choice, part):
            return Support(False, rule.reason, rule.source)
    for rule in rt.accel:
        if not rule.needs_peak and rule.matches(target, choice):
            return Support(True, f"{rt.name} {rt.version}: {rule.reason}", rule.source)
    gap = _hardware_gap(target, choice)
    if gap:
        return Support(False, gap, f"target:{target.name}")
    for rule in rt.accel:
        if rule.matches(target, choice):
            return Support(True, f"{rt.name} {rt.version}: {rule.reason}", rule.source)
    return Support(
        False,
        f"{rt.name} {rt.version} has no accelerated kernel for {choice} on {target.family}",
        rt.sources[0],
    )


def refusals(target: Target, runtime: str, choices: Mapping[str, Choice]) -> dict[str, list[str]]:
    """The layers `runtime` does not accelerate on `target`, grouped by refusal.

    Returns:
        ``"{choice} ({reason})"`` -> sorted layer names, in the order first met; empty when
        every layer is served.
    """
    out: dict[str, list[str]] = {}
    for name, choice in sorted(choices.items()):
        answer = supports(target, runtime, choice, part_of(name))
        if not answer.ok:
            out.setdefault(f"{choice} ({answer.reason})", []).append(name)
    return out


def refused_layers(target: Target, runtime: str, choices: Mapping[str, Choice],
                   shown: int = 4) -> str | None:
    """One clause for a message when `runtime` does not accelerate some planned layers on
    `target` ("N planned layer(s) on T; K are CHOICE (WHY): NAMES"), else None."""
    refused = refusals(target, runtime, choices)
    if not refused:
        return None
    groups = list(refused.items())
    (why, names), others = groups[0], groups[1:]
    total = sum(len(v) for v in refused.values())
    # the other groups by count and reason (names only for the first: one line)
    more = "".join(f"; {len(n)} are {w}" for w, n in others[:2])
    rest = sum(len(n) for _, n in others[2:])
    more += f"; {rest} more in {len(others) - 2} other format(s)" if rest else ""
    return (f"{total} planned layer(s) on {target.name}; {len(names)} are {why}: "
            f"{listing(names, shown)}{more}")


def format_family(choice: Choice) -> str:
    """The family a choice belongs to, as users name them: its sparsity pattern when pruned
    ("2:4 sparsity", "block sparsity"), else by its math: "FP8", "FP4", "INT8",
    "INT4 weight-only", "INT4/INT5 x INT8 activations" (the CPU block formats), "floats"."""
    if choice.sparsity.kind != "dense":
        kind = choice.sparsity.kind
        return f"{str(choice.sparsity) if kind == 'nm' else kind} sparsity"
    info = choice.precision.info
    if info.weight_only:
        return f"INT{info.value_bits} weight-only"
    if info.math in ("fp8", "fp4"):
        return info.math.upper()
    if info.math == "int8":
        return "INT8" if info.value_bits == 8 else "INT4/INT5 x INT8 activations"
    return "floats"


def summarize_refused(refused: Mapping[str, str]) -> str:
    """A short line for "what was asked for that this runtime cannot accelerate": the count,
    then each family with how many of its formats ("9 formats: 2:4 sparsity (4), W4A4 fp4
    (2), ..."), largest first; "-" when nothing was refused."""
    if not refused:
        return "-"
    families: dict[str, int] = {}
    for text in refused:
        try:
            family = format_family(Choice.parse(text))
        except (AutoplanError, ValueError):
            family = "other"
        families[family] = families.get(family, 0) + 1
    parts = [f"{name} ({n})" for name, n in sorted(families.items(), key=lambda kv: (-kv[1], kv[0]))]
    return f"{len(refused)} format{'s' if len(refused) > 1 else ''}: {', '.join(parts)}"


def listing(names: list[str], shown: int = 4) -> str:
    """Names for a one-line message: the first `shown`, then "and N more"."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def accelerated_choices(target: Target, runtime: str, candidates: Iterable[Choice]) -> list[Choice]:
    """The candidates `runtime` accelerates on `target`, in their given order."""
    return [c for c in candidates if supports(target, runtime, c).ok]


# ---- KV cache --------------------------------------------------------------------------------
@dataclass(frozen=True)
class KvSupport(Support):
    """``Support`` for a KV-cache format, with the engine's rule when it is served."""

    rule: KvRule | None = None

    @property
    def query(self) -> KvFormat | None:
        """The format the engine's attention rounds queries to against this cache, if any."""
        return KvFormat(self.rule.query) if self.rule and self.rule.query else None


def default_kv(target: Target, runtime: str) -> KvFormat:
    """The cache an engine uses when not told: its ``kv_default``, else the model's 16-bit
    dtype (fp32 on a CPU target without BF16 math, as its baseline layers)."""
    rt = get_runtime(runtime)
    if rt.kv_default is not None:
        return KvFormat.parse(rt.kv_default)
    if target.platform == "cpu" and not target.peak("bf16"):
        return KvFormat.FP32
    return KvFormat.BF16


def kv_supports(target: Target, runtime: str, fmt: KvFormat | str) -> KvSupport:
    """Whether ``runtime`` serves a ``fmt`` KV cache on ``target``, why, and its rule.

    Raises:
        UnknownNameError: the runtime or the format is unknown.
    """
    rt = get_runtime(runtime)
    fmt = fmt if isinstance(fmt, KvFormat) else KvFormat.parse(fmt)
    if target.platform not in rt.platforms:
        return KvSupport(False, f"{rt.name} does not run on {target.platform} targets",
                         rt.sources[0])
    for rule in rt.kv_deny:
        if rule.matches(target, fmt):
            return KvSupport(False, rule.reason, rule.source)
    for rule in rt.kv:
        if rule.matches(target, fmt):
            return KvSupport(True, f"{rt.name} {rt.version}: {rule.reason}", rule.source, rule)
    served = [k.value for k in KvFormat if any(r.matches(target, k) for r in rt.kv)]
    return KvSupport(False, f"{rt.name} {rt.version} serves no {fmt.value} KV cache on "
                            f"{target.name} ({target.family}); it serves: "
                            f"{', '.join(served) or 'none'}",
                     rt.sources[0])


def served_kv_formats(target: Target, runtime: str) -> list[KvFormat]:
    """Every KV format ``runtime`` serves on ``target``, in KvFormat order."""
    return [k for k in KvFormat if kv_supports(target, runtime, k).ok]


def check_kv_layers(runtime: str, formats: Mapping[int, KvFormat]) -> None:
    """Refuse a per-layer mix of cache types on an engine that takes one for the model.

    Raises:
        UnsupportedFormatError: the layers differ and the runtime has one KV dtype.
    """
    from autoplan.errors import UnsupportedFormatError

    rt = get_runtime(runtime)
    kinds = sorted({f.value for f in formats.values()})
    if len(kinds) > 1 and not rt.kv_per_layer:
        raise UnsupportedFormatError(
            f"{rt.name} takes one KV-cache type for the whole model (one --kv-cache-dtype / "
            f"-ctk), not a mix per layer ({', '.join(kinds)}): pick one format for every layer")


def kv_of_mix(runtime: str, mix: Mapping[int, KvFormat], n_layers: int,
              own: KvFormat) -> KvFormat:
    """The one format a per-block mix (``--kv-cache fp8@0-15,...``) amounts to, blocks not
    named keeping the runtime's own cache ``own``; a real mix is refused.

    Raises:
        UserInputError: a block the model does not have.
        UnsupportedFormatError: the blocks differ (the engine's reason, `check_kv_layers`;
            autoplan plans one format per model even where an engine would take more).
    """
    from autoplan.errors import UnsupportedFormatError, UserInputError

    beyond = sorted(i for i in mix if i >= n_layers)
    if beyond:
        raise UserInputError(f"--kv-cache names block {beyond[0]}, but the model has "
                             f"blocks 0-{n_layers - 1}")
    full = {i: mix.get(i, own) for i in range(n_layers)}
    check_kv_layers(runtime, full)
    kinds = set(full.values())
    if len(kinds) > 1:
        raise UnsupportedFormatError("autoplan plans one KV-cache format per model: give one")
    return kinds.pop()


__all__ = [
    "KvRule",
    "KvSupport",
    "Matrix",
    "Rule",
    "Runtime",
    "Support",
    "accelerated_choices",
    "check_kv_layers",
    "kv_of_mix",
    "default_kv",
    "default_runtime",
    "format_family",
    "get_runtime",
    "installed_version",
    "kv_supports",
    "listing",
    "load_matrix",
    "refusals",
    "refused_layers",
    "runtime_names",
    "served_kv_formats",
    "summarize_refused",
    "supports",
    "version_on",
]
