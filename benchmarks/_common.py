"""Shared by the benchmark scripts: what machine a figure was measured on."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def machine_info() -> dict:
    """CPU model, cores, torch version and threads, Python, platform."""
    import torch

    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform()}
