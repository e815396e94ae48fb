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


def seed_all(seed: int) -> None:
    """Seed Python's, NumPy's and torch's generators."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def start_run(seed: int, argv: list[str] | None) -> tuple[dict, str]:
    """Seed every RNG, then print and return the machine info and the reproducing command."""
    import shlex
    import sys

    seed_all(seed)
    info = machine_info()
    command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv or sys.argv[1:])])
    print(f"machine: {info['cpu']}, {info['cores']} cores, torch {info['torch']} "
          f"({info['torch_threads']} threads), python {info['python']}")
    print(f"command: {command}")
    return info, command
