"""Shared by the peers benchmark (benchmarks/peers.py): each peer's own venv under the autoplan
cache, subprocess runs that fail as one line, and `autoplan` CLI calls whose command is kept.

A peer pins its own torch/transformers, so it never shares autoplan's environment: its venv is
`$AUTOPLAN_CACHE/peers/NAME/` (outside the repository), built once with the CPU torch first.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from autoplan.models._cache import cache_root

MARKER = "autoplan-peer.json"  # written last: a venv without it is an unfinished install


class PeerError(RuntimeError):
    """A peer could not be installed or run; the message is one line, the peer's own words."""


def peers_dir() -> Path:
    return cache_root() / "peers"


@dataclass(frozen=True)
class PeerVenv:
    """One peer's venv: pip steps installed in order, then an import that proves it works."""

    name: str
    steps: tuple[tuple[str, ...], ...]
    check: str

    @property
    def folder(self) -> Path:
        return peers_dir() / self.name

    @property
    def python(self) -> Path:
        return self.folder / "bin" / "python"

    def ensure(self, log=print) -> Path:  # noqa: ANN001 - a print-like callable
        """The venv's interpreter, built first if it is not there, and its pip steps run
        again when they changed since it was built (pip installs only what is missing).

        Raises:
            PeerError: a pip step or the import check failed (its last line).
        """
        marker = self.folder / MARKER
        steps = [list(step) for step in self.steps]
        try:
            built = json.loads(marker.read_text())
        except (OSError, ValueError):
            built = None
        if built is not None and built.get("steps") == steps:
            return self.python
        t0 = time.perf_counter()
        if built is None or not self.python.is_file():
            run([sys.executable, "-m", "venv", "--clear", str(self.folder)],
                f"venv for {self.name}")
        for step in self.steps:
            log(f"[{self.name}] pip install {' '.join(step)}")
            run([str(self.python), "-m", "pip", "install", "-q", *step],
                f"pip install {' '.join(step)}")
        run([str(self.python), "-c", f"import {self.check}"], f"import {self.check}")
        packages = [s.split("[")[0].split("=")[0].split("<")[0].split(">")[0]
                    for step in self.steps for s in step if not s.startswith("-")]
        marker.write_text(json.dumps({"versions": versions(self.python, packages), "steps": steps,
                                      "install_s": round(time.perf_counter() - t0)}))
        return self.python

    def versions(self) -> dict[str, str]:
        try:
            return json.loads((self.folder / MARKER).read_text())["versions"]
        except (OSError, ValueError, KeyError):
            return {}


def versions(python: Path, packages: list[str]) -> dict[str, str]:
    """Installed versions of ``packages`` in another interpreter."""
    code = ("import importlib.metadata as m, json, sys\nout = {}\nfor p in sys.argv[1:]:\n"
            "    try: out[p] = m.version(p)\n    except m.PackageNotFoundError: pass\n"
            "print(json.dumps(out))")
    proc = subprocess.run([str(python), "-c", code, *packages], capture_output=True, text=True,
                          check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else {}


def last_line(text: str, width: int = 300) -> str:
    """The last meaningful line of a tool's output (tracebacks end with the error)."""
    lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
    return (lines[-1] if lines else "no output")[:width]


def run(cmd: list[str], what: str, *, timeout: float | None = None, cwd: Path | None = None,
        env: dict | None = None, log: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``cmd``; a non-zero exit or a timeout raises PeerError naming ``what`` and the last
    line the tool printed. With ``log``, its whole output is kept there."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=timeout,
                              cwd=cwd, env=env)
    except subprocess.TimeoutExpired as exc:
        raise PeerError(f"{what}: timed out after {timeout:.0f} s") from exc
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"$ {shlex.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
    if proc.returncode:
        raise PeerError(f"{what} failed (exit {proc.returncode}): "
                        f"{last_line(proc.stderr or proc.stdout)}")
    return proc


# the name a section module imports it under: a section's own entry point is `run(args, log)`,
# which would shadow this one at module level
run_tool = run


def autoplan(args: list[str], what: str, **kw) -> tuple[str, subprocess.CompletedProcess]:
    """Run the `autoplan` CLI as a user would; returns the command as typed and the result."""
    proc = run([sys.executable, "-m", "autoplan.cli", *args], what, **kw)
    return "autoplan " + shlex.join(args), proc


def error_row(section: str, peer: str, exc: BaseException, command: str = "") -> dict:
    """The one table line of a peer that could not be installed or run."""
    return {"section": section, "peer": peer, "side": "peer", "name": peer,
            "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:400],
            "command": command}


__all__ = ["PeerError", "PeerVenv", "autoplan", "error_row", "last_line", "peers_dir", "run",
           "run_tool", "versions"]
