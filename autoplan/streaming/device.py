"""`--device auto|cpu|cuda[:N]`: where the expensive work (calibration passes, scoring,
evaluation) runs. `auto` takes the first CUDA device when torch sees one (ROCm builds of
torch expose AMD GPUs as `cuda` too), else the CPU. The format simulation is the same code on
every device; only where its tensors live changes.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from autoplan.errors import UserInputError

if TYPE_CHECKING:  # torch is imported where a device is resolved: naming one is free
    import torch

DEVICE_CHOICES = "auto, cpu, cuda or cuda:N"


def parse_device_name(text: str | None) -> tuple[str, int | None]:
    """("auto" | "cpu" | "cuda", GPU index or None) of a `--device` text, without torch.

    Raises:
        UserInputError: not a device name.
    """
    name = (text or "auto").strip().lower()
    if name in ("auto", "cpu"):
        return name, None
    m = re.fullmatch(r"(cuda|rocm|gpu)(?::(\d+))?", name)
    if not m:
        raise UserInputError(f"--device '{text}' is not a device: use {DEVICE_CHOICES}")
    return "cuda", int(m.group(2) or 0)


def _no_gpu_message(text: str | None) -> str:
    return (f"--device {text}: torch sees no CUDA/ROCm GPU on this machine; "
            "use --device cpu (or auto)")


def gpu_may_exist() -> bool:
    """False when this Linux machine certainly has no GPU torch could use, read from the
    files a GPU driver creates (no torch: importing it takes seconds): no NVIDIA GPU under
    /proc/driver/nvidia/gpus and no /dev/nvidia0.., no ROCm /dev/kfd, no WSL /dev/dxg. True
    whenever one may exist, or on another OS: then torch decides."""
    if not sys.platform.startswith("linux"):
        return True
    try:
        gpus = Path("/proc/driver/nvidia/gpus")
        if gpus.is_dir() and any(gpus.iterdir()):
            return True
        if any(Path("/dev").glob("nvidia[0-9]*")):
            return True
        return any(Path(p).exists() for p in ("/dev/kfd", "/dev/dxg"))
    except OSError:  # cannot tell: let torch answer
        return True


def check_device_cheaply(text: str | None) -> None:
    """Refuse, without torch, a device name that is not one, and a GPU on a machine with no
    GPU driver at all (the same line `resolve_device` says); whether a GPU index exists
    where a driver does is torch's to answer, in `resolve_device`.

    Raises:
        UserInputError: not a device name, or a GPU asked of a machine without one.
    """
    kind, _index = parse_device_name(text)
    if kind == "cuda" and not gpu_may_exist():
        raise UserInputError(_no_gpu_message(text))


def resolve_device(text: str | torch.device | None) -> torch.device:
    """The torch device `text` names, checked to exist here.

    Raises:
        UserInputError: an unknown device name, or a GPU that this machine does not have.
    """
    import torch

    if isinstance(text, torch.device):
        return text
    kind, index = parse_device_name(text)
    if kind == "auto":
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if kind == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UserInputError(_no_gpu_message(text))
    count = torch.cuda.device_count()
    if index >= count:
        raise UserInputError(f"--device {text}: this machine has {count} GPU(s) "
                             f"(cuda:0..cuda:{count - 1})")
    return torch.device("cuda", index)


def device_memory(device: torch.device) -> int | None:
    """Bytes of memory the device has (None for the CPU: see `host_memory`)."""
    import torch

    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return None


def host_memory() -> int:
    """Bytes of RAM available to this process now (what auto-selection compares against)."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:  # psutil comes with most installs; fall back to the POSIX count
        import os

        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def is_out_of_memory(exc: BaseException) -> bool:
    """True for a host or GPU allocation failure (torch raises several kinds)."""
    import torch

    if isinstance(exc, (MemoryError, torch.cuda.OutOfMemoryError)):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text
                                              or "can't allocate memory" in text)


__all__ = ["DEVICE_CHOICES", "check_device_cheaply", "device_memory", "gpu_may_exist",
           "host_memory", "is_out_of_memory", "parse_device_name", "resolve_device"]
