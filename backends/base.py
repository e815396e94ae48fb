"""The backend interface and registry.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from autoplan.backends.kernel_timers import KernelTimer, registered_timer
from autoplan.errors import UnsupportedFormatError
from autoplan.formats import Choice, format_spec
from autoplan.registry import Registry
from autoplan.targets import Target

# (m tokens, n out features, k in features, choice): one GEMM a microbenchmark times.
Row = tuple[int, int, int, Choice]
# A kernel requirement: "" when met, else one line saying what is missing.
Requirement = Callable[[Choice], str]


@dataclass(frozen=True)
class ProbeResult:
    """What a probe found: `available` with details, or the reason it is unavailable."""

    backend: str
    available: bool
    reason: str = ""
    devices: tuple[dict[str, Any], ...] = ()
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "available": self.available,
            "reason": self.reason,
            "devices": list(self.devices),
            "details": self.details,
        }


def sparsity_token(choice: Choice) -> str:
    """The FormatSpec.kernels key of a choice's sparsity: dense, 2:4, n:m, block, ..."""
    sp = choice.sparsity
    if sp.kind == "nm":
        return "2:4" if (sp.n, sp.m) == (2, 4) else "n:m"
    return sp.kind


def named_by_format(kernel: str) -> Requirement:
    """Requirement: the choice's FormatSpec names ``kernel`` for its sparsity pattern."""

    def check(choice: Choice) -> str:
        named = format_spec(choice.precision).kernels.get(sparsity_token(choice))
        return "" if named == kernel else f"{choice} is not run by {kernel}"

    return check


@dataclass(frozen=True)
class KernelEntry:
    """One kernel a backend can launch, with what it requires of a choice and the machine."""

    name: str
    requires: tuple[Requirement, ...]

    def why_not(self, choice: Choice) -> str:
        """"" when every requirement holds for ``choice``, else the first unmet one."""
        for requirement in self.requires:
            reason = requirement(choice)
            if reason:
                return reason
        return ""


class Backend(ABC):
    """A vendor adapter; subclasses fill in the class attributes and ``probe``."""

    name: ClassVar[str]
    platforms: ClassVar[tuple[str, ...]]  # target platforms it drives ("nvidia-gpu", ...)
    exporters: ClassVar[tuple[str, ...]]  # export formats its runtimes load, preferred first
    kernels: ClassVar[tuple[KernelEntry, ...]] = ()  # ordered: the first that fits runs

    @property
    def default_format(self) -> str:
        """The export format ``autoplan apply`` writes for this backend's targets."""
        return self.exporters[0]

    @abstractmethod
    def probe(self) -> ProbeResult:
        """Find this backend's hardware; never raises."""

    def measured_targets(self) -> Mapping[str, Callable[[], Target]]:
        """Targets this backend measures itself (name -> factory); none by default."""
        return {}

    def drives(self, target: Target) -> bool:
        """Whether this backend runs ``target``'s hardware."""
        return target.platform in self.platforms

    def select_kernel(self, choice: Choice) -> KernelEntry:
        """The first kernel, in order, whose requirements all hold for ``choice``.

        Raises:
            UnsupportedFormatError: none fits; the message gives each kernel's reason.
        """
        reasons = []
        for kernel in self.kernels:
            why = kernel.why_not(choice)
            if not why:
                return kernel
            reasons.append(f"{kernel.name}: {why}")
        raise UnsupportedFormatError(
            f"the {self.name} backend has no kernel for {choice} "
            f"({'; '.join(reasons) or 'it lists no kernels'})")

    def kernel_timer(self, runtime: str) -> KernelTimer | None:
        """How this backend times ``runtime``'s kernels on this machine for a search
        (``--measure-kernels``), or None when it does not."""
        return registered_timer(self.name, runtime)


_BACKENDS: Registry[type[Backend]] = Registry("backend")


def register_backend(name: str) -> Callable[[type[Backend]], type[Backend]]:
    """Class decorator: register a backend under a unique name."""

    def deco(cls: type[Backend]) -> type[Backend]:
        return _BACKENDS.register(name, cls)

    return deco


def registered_backends() -> dict[str, type[Backend]]:
    """Every backend registered so far (name -> class); ``load_backends`` loads the vendors."""
    return dict(_BACKENDS.entries)


def get_registered(name: str) -> Backend:
    """A registered backend by name.

    Raises:
        UnknownNameError: no such backend; lists the registered ones.
    """
    return _BACKENDS.get(name)()


__all__ = ["Backend", "KernelEntry", "ProbeResult", "Requirement", "Row", "get_registered",
           "named_by_format", "register_backend", "registered_backends", "sparsity_token"]
