"""`autoplan profile --dry-run`: the memory plan of both executions, from config.json alone.

Works where the run would not: no weights are read and no GPU is needed (with `--device cuda`
on a machine without one, the plan is made for a GPU of `gpu_memory_gb`), so the shapes of
Llama-3.1-8B or 70B can be planned from their config.
"""

from __future__ import annotations

import torch

from autoplan.modelspec import ModelSpec
from autoplan.streaming import estimate
from autoplan.streaming.device import host_memory

GB = 2**30


def dry_run(spec: ModelSpec, device: str, w: estimate.Workload, *,
            gpu_memory_gb: float | None = None, host_memory_gb: float | None = None) -> dict:
    """Both plans, the one `--execution auto` would take, and whether it fits."""
    name = (device or "auto").lower()
    has_gpu = torch.cuda.is_available()
    dev = "cuda" if name.startswith(("cuda", "rocm", "gpu")) or (name == "auto" and has_gpu) \
        else "cpu"
    if gpu_memory_gb is not None:
        gpu = int(gpu_memory_gb * GB)
    elif dev == "cuda" and has_gpu:
        gpu = int(torch.cuda.get_device_properties(0).total_memory)
    else:
        gpu = 80 * GB if dev == "cuda" else None
    host = int(host_memory_gb * GB) if host_memory_gb is not None else host_memory()
    plans = {ex: estimate.plan(spec, ex, dev, w) for ex in ("memory", "stream")}
    chosen, why = estimate.choose(spec, dev, host, gpu, w)
    fits = {ex: p.host <= host and (dev == "cpu" or p.gpu <= (gpu or 0))
            for ex, p in plans.items()}
    return {"model": spec.name, "device": dev, "params": spec.total_params,
            "weights_on_disk_bytes": estimate.checkpoint_bytes(spec),
            "checkpoint_dtype": spec.dtype + (" with MXFP4 experts" if spec.moe is not None
                                              and spec.moe.source_format == "mxfp4" else ""),
            "calibration_tokens": w.calib_tokens,
            "evaluation_tokens": w.eval_tokens, "host_budget_bytes": host,
            "gpu_memory_bytes": gpu if dev == "cuda" else None,
            "plans": {ex: p.to_json() for ex, p in plans.items()}, "fits": fits,
            "auto_choice": chosen, "why": why}


def render(report: dict) -> list[str]:
    """Human-readable lines of a `dry_run` report."""
    gib = lambda b: f"{b / GB:7.2f} GiB"  # noqa: E731
    dev = report["device"]
    lines = [f"memory plan for {report['model']} ({report['params'] / 1e9:.2f} B params, "
             f"{gib(report['weights_on_disk_bytes']).strip()} of {report['checkpoint_dtype']} "
             f"on disk) on {dev}, {report['calibration_tokens']} calibration + "
             f"{report['evaluation_tokens']} evaluation tokens (estimate, no weights read)"]
    for ex, p in report["plans"].items():
        lines.append(f"  {ex}:")
        for where, parts in (("device", p["device_parts"]), ("host", p["host_parts"])):
            label = "host" if dev == "cpu" else where
            for part, b in parts.items():
                phase = p.get("phases", {}).get(part, "")
                lines.append(f"    {label:6s} {part:42s} {gib(b)}"
                             + (f"   ({phase})" if phase else ""))
        gpu = f", GPU peak {gib(p['device_bytes']).strip()}" if dev != "cpu" else ""
        by_phase = ", ".join(f"{ph} alone {gib(b).strip()}"
                             for ph, b in p.get("host_bytes_by_phase", {}).items())
        lines.append(f"    peak (shared parts + the larger phase): host "
                     f"{gib(p['host_bytes']).strip()}{gpu}"
                     + (f" ({by_phase})" if by_phase else "") + " -> "
                     f"{'fits' if report['fits'][ex] else 'does NOT fit'}")
    budget = f"host budget {gib(report['host_budget_bytes']).strip()}"
    if report["gpu_memory_bytes"]:
        budget += f", GPU {gib(report['gpu_memory_bytes']).strip()}"
    lines.append(f"  {budget}; --execution auto takes '{report['auto_choice']}' "
                 f"({report['why']})")
    return lines


__all__ = ["dry_run", "render"]
