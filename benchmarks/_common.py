"""Shared by the benchmark scripts: what machine a figure was measured on."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def machine_info() -> dict:
    """CPU model, cores, torch version and threads, Python, platform (the CPU and cores as
    `autoplan fleet --measured` compares them with its node)."""
    import torch

    from autoplan.fleet_measured import this_machine

    return {**this_machine(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform()}


def one_line(err: BaseException) -> str:
    """An exception as one line for a results file: its type and first line, <= 300 chars."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:300]


def cpu_flags(wanted: tuple[str, ...] = ("avx2", "avx512f", "avx512bw", "avx512_vnni",
                                          "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8",
                                          "amx_bf16", "amx_fp16")) -> dict[str, bool]:
    """The ISA flags engine kernels dispatch on, from /proc/cpuinfo (empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    line = next((x for x in text.splitlines() if x.startswith("flags")), "")
    have = set(line.split(":", 1)[-1].split())
    return {flag: flag in have for flag in wanted}


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


def portable(obj):  # noqa: ANN001, ANN201 - any JSON value
    """`obj` with this machine's absolute paths made portable, so results JSON can be committed:
    the autoplan cache -> $AUTOPLAN_CACHE, site-packages -> <site-packages>, the repository ->
    '.', the home folder -> '~', any other absolute path under /work, /tmp or /opt -> its name."""
    import re
    import sysconfig

    repo = str(Path(__file__).resolve().parents[1])
    cache = os.environ.get("AUTOPLAN_CACHE") or str(Path.home() / ".cache" / "autoplan")
    subs = [(str(Path(cache).expanduser()), "$AUTOPLAN_CACHE"),
            (sysconfig.get_paths()["purelib"], "<site-packages>"), (repo, "."),
            (str(Path.home()), "~")]
    other = re.compile(r"/(?:work|tmp|opt|root|home)(?:/[^\s\"':]*)?/([^/\s\"':]+)")

    def fix(text: str) -> str:
        for old, new in subs:
            text = text.replace(old, new)
        return other.sub(r"<path>/\1", text)

    if isinstance(obj, str):
        return fix(obj)
    if isinstance(obj, dict):
        return {fix(k) if isinstance(k, str) else k: portable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [portable(v) for v in obj]
    return obj


def write_result(path, doc) -> None:  # noqa: ANN001
    """Write a benchmark result atomically, with machine paths made portable."""
    from autoplan.plan.io import write_json_atomic

    write_json_atomic(path, portable(doc))
