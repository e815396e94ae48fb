"""Operating points the way teams ask for them: a fixed batch, the largest batch that fits
(vendors' "max throughput"), or the largest batch meeting a latency SLO (TTFT and/or TPOT).

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from autoplan.cost.model import CostModel, Decisions
from autoplan.errors import UserInputError
from autoplan.modelspec import ModelSpec
from autoplan.targets import Target
from autoplan.workload import Workload

MAX_BATCH = 65536  # Workload's own upper bound on the batch
Mode = Literal["fixed", "max", "slo"]


@dataclass(frozen=True)
class OperatingRequest:
    """What the user asked for: `--batch N|max`, `--ttft-ms`, `--tpot-ms` and the lengths."""

    batch: int | Literal["max"] | None = None  # None: the command's default batch
    input_len: int = 512
    output_len: int = 128
    ttft_s: float | None = None
    tpot_s: float | None = None
    default_batch: int = 32

    def __post_init__(self) -> None:
        for flag, value in (("ttft-ms", self.ttft_s), ("tpot-ms", self.tpot_s)):
            if value is not None and not 0 < value < math.inf:
                raise UserInputError(f"--{flag} must be a finite number > 0, got "
                                     f"{value * 1e3 if value == value else value}")
        if self.slo and isinstance(self.batch, int):
            raise UserInputError("--ttft-ms/--tpot-ms choose the batch (the largest meeting "
                                 "them): leave --batch out or pass --batch max")
        if isinstance(self.batch, int) and not 1 <= self.batch <= MAX_BATCH:
            raise UserInputError(f"--batch must be from 1 to {MAX_BATCH} or 'max', "
                                 f"got {self.batch}")
        for flag, n in (("input-len", self.input_len), ("output-len", self.output_len)):
            if n < 1:
                raise UserInputError(f"--{flag} must be a positive integer, got {n}")

    @classmethod
    def parse(cls, batch: str | int | None, *, input_len: int, output_len: int,
              ttft_ms: float | None = None, tpot_ms: float | None = None,
              default_batch: int = 32) -> OperatingRequest:
        """From CLI text: `--batch` is an integer or `max`."""
        value: int | Literal["max"] | None
        if batch is None or isinstance(batch, int):
            value = batch
        elif str(batch).strip().lower() == "max":
            value = "max"
        else:
            try:
                value = int(str(batch))
            except ValueError:
                raise UserInputError(f"--batch must be an integer or 'max', "
                                     f"got '{batch}'") from None
        return cls(value, input_len, output_len,
                   None if ttft_ms is None else ttft_ms / 1e3,
                   None if tpot_ms is None else tpot_ms / 1e3, default_batch)

    @property
    def slo(self) -> bool:
        return self.ttft_s is not None or self.tpot_s is not None

    @property
    def mode(self) -> Mode:
        if self.slo:
            return "slo"
        return "max" if self.batch == "max" else "fixed"

    def fixed(self) -> Workload | None:
        """The workload when nothing has to be searched (a fixed batch), else None."""
        if self.mode != "fixed":
            return None
        batch = self.default_batch if self.batch is None else int(self.batch)
        return Workload(batch=batch, input_len=self.input_len, output_len=self.output_len)

    def describe(self) -> str:
        if self.mode == "fixed":
            return f"batch {self.fixed().batch}"  # type: ignore[union-attr]
        if self.mode == "max":
            return "batch max (largest that fits)"
        parts = [f"TTFT <= {self.ttft_s * 1e3:g} ms" if self.ttft_s is not None else "",
                 f"TPOT <= {self.tpot_s * 1e3:g} ms" if self.tpot_s is not None else ""]
        return "largest batch with " + " and ".join(p for p in parts if p)


@dataclass(frozen=True)
class OperatingPoint:
    """A resolved operating point: the workload, how it was found and what bounds it."""

    workload: Workload
    mode: Mode
    bound: str  # "fixed" | "memory" | "ttft" | "tpot" | "batch cap"
    detail: str  # one line, e.g. "largest batch that fits: 4,812 (4,813 needs 72.1 GB > 72.0 GB)"
    ttft_s: float | None = None  # the SLO asked for
    tpot_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "batch": self.workload.batch, "bound": self.bound,
                "detail": self.detail, "ttft_slo_s": self.ttft_s, "tpot_slo_s": self.tpot_s}


class NoOperatingPoint(UserInputError):
    """No batch meets the request (not even batch 1): the message says which limit and by
    how much. `needed_bytes`/`usable_bytes` are set when memory is the reason."""

    def __init__(self, message: str, needed_bytes: float | None = None,
                 usable_bytes: float | None = None) -> None:
        super().__init__(message)
        self.needed_bytes, self.usable_bytes = needed_bytes, usable_bytes


def _largest(ok: Callable[[int], bool], hi: int) -> int:
    """The largest b in 1..hi with ok(b), given ok is monotone (True then False); 0 if none."""
    if not ok(1):
        return 0
    lo = 1  # invariant: ok(lo); every b > hi_bad is not ok
    step = 1
    while lo < hi:  # gallop up so a small answer costs few evaluations
        probe = min(hi, lo + step)
        if not ok(probe):
            hi = probe - 1
            break
        lo, step = probe, step * 2
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo


def _gb(x: float) -> str:
    return f"{x / 1e9:,.2f} GB"


def resolve_operating_point(spec: ModelSpec, target: Target, decisions: Decisions,
                            req: OperatingRequest, *,
                            model_for: Callable[[Workload], CostModel] | None = None,
                            ) -> OperatingPoint:
    """The workload `req` asks for, for these decisions on this target.

    Args:
        model_for: builds the cost model of a workload (default: `CostModel(spec, target,
            workload)`); pass one to use the caller's baseline, price or measured table.

    Raises:
        NoOperatingPoint: nothing fits at batch 1, or batch 1 already misses the SLO.
    """
    build = model_for or (lambda w: CostModel(spec, target, w))

    def at(batch: int) -> CostModel:
        return build(Workload(batch=batch, input_len=req.input_len, output_len=req.output_len))

    fixed = req.fixed()
    if fixed is not None:
        return OperatingPoint(fixed, "fixed", "fixed", f"batch {fixed.batch} (as given)")

    def memory(batch: int):  # noqa: ANN202 - a Memory record
        cm = at(batch)
        return cm.memory(cm.resolve(decisions))

    fits = lambda b: memory(b).fits  # noqa: E731
    cap = _largest(fits, MAX_BATCH)
    if cap == 0:
        m = memory(1)
        raise NoOperatingPoint(
            f"nothing fits on {target.name}: at batch 1 ({req.input_len} in / {req.output_len} "
            f"out) the model needs {_gb(m.total_bytes)} (weights {_gb(m.weights_bytes)}, KV "
            f"cache {_gb(m.kv_cache_bytes)}, workspace {_gb(m.workspace_bytes)}) but "
            f"{_gb(m.capacity_bytes)} is usable: shorten the lengths, compress more, or pick a "
            "target with more memory", m.total_bytes, m.capacity_bytes)
    if req.mode == "max":
        if cap == MAX_BATCH:
            bound, why = "batch cap", f"the batch cap {MAX_BATCH:,} (memory allows more)"
        else:
            over = memory(cap + 1)
            bound, why = "memory", (f"batch {cap + 1:,} needs {_gb(over.total_bytes)} > "
                                    f"{_gb(over.capacity_bytes)} usable")
        return OperatingPoint(at(cap).workload, "max", bound,
                              f"largest batch that fits: {cap:,} ({why})")

    def meets(batch: int) -> bool:
        t = at(batch).step_times(decisions)
        return ((req.ttft_s is None or t.prefill_s <= req.ttft_s)
                and (req.tpot_s is None or t.decode_s <= req.tpot_s))

    best = _largest(meets, cap)
    if best == 0:
        t = at(1).step_times(decisions)
        misses = [f"TTFT {t.prefill_s * 1e3:,.3g} ms > {req.ttft_s * 1e3:g} ms"
                  for _ in [0] if req.ttft_s is not None and t.prefill_s > req.ttft_s]
        misses += [f"TPOT {t.decode_s * 1e3:,.3g} ms > {req.tpot_s * 1e3:g} ms"
                   for _ in [0] if req.tpot_s is not None and t.decode_s > req.tpot_s]
        raise NoOperatingPoint(f"no batch meets the SLO on {target.name}: at batch 1 "
                               f"{' and '.join(misses)} (predicted): relax --ttft-ms/--tpot-ms "
                               "or shorten the lengths")
    if best == cap:
        bound = "memory" if cap < MAX_BATCH else "batch cap"
        why = f"memory allows no more than {cap:,}" if bound == "memory" else "the batch cap"
    else:
        t = at(best + 1).step_times(decisions)
        if req.ttft_s is not None and t.prefill_s > req.ttft_s:
            bound, why = "ttft", f"batch {best + 1:,} has TTFT {t.prefill_s * 1e3:,.4g} ms"
        else:
            bound, why = "tpot", f"batch {best + 1:,} has TPOT {t.decode_s * 1e3:,.4g} ms"
    return OperatingPoint(at(best).workload, "slo", bound,
                          f"{req.describe()}: {best:,} ({why})", req.ttft_s, req.tpot_s)


__all__ = ["MAX_BATCH", "NoOperatingPoint", "OperatingPoint", "OperatingRequest",
           "resolve_operating_point"]
