"""`--ray` refusals that need no cluster: Ray not installed, nothing listening at the
address, a malformed address. Each is one line naming the fix, before any model loads."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoplan.cli import cli


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once it is closed


def _one_line(args: list[str]) -> tuple[int, str]:
    res = CliRunner().invoke(cli, args)
    lines = res.output.strip().splitlines()
    assert len(lines) == 1, res.output
    return res.exit_code, lines[0]


def _unloadable_model(folder: Path) -> str:
    """A model folder that exists (profile checks that before --ray) but that nothing could
    load: the refusal must be --ray's, before any load is tried."""
    (folder / "config.json").write_text("{}")
    return str(folder)


@pytest.mark.parametrize("command", ["profile", "search"])
def test_without_the_extra_ray_names_the_install(command: str, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    code, line = _one_line([command, "--model", _unloadable_model(tmp_path), "--ray", "auto"])
    assert code == 2
    assert "--ray" in line and "pip install 'autoplan[ray]'" in line


@pytest.mark.parametrize("command", ["profile", "search"])
def test_an_unreachable_address_is_one_line_naming_ray(command: str, tmp_path: Path) -> None:
    port = _closed_port()
    code, line = _one_line([command, "--model", _unloadable_model(tmp_path), "--ray", f"127.0.0.1:{port}"])
    assert code == 2
    assert line.startswith(f"error: --ray 127.0.0.1:{port}: no Ray cluster reachable")


def test_a_malformed_address_is_one_line() -> None:
    code, line = _one_line(["profile", "--ray", "head-node:port"])
    assert code == 2 and "HOST:PORT" in line


def test_the_amdsmi_shim_folder_is_removed_when_the_process_exits(tmp_path) -> None:
    # Where the amdsmi wheel is installed without ROCm (CI's `test` extra), import_ray puts a
    # shim package in a temp folder on PYTHONPATH; it must not outlive the process.
    code = ("import os, tempfile; tempfile.tempdir = os.environ['SHIM_TMP']\n"
            "from autoplan.sensitivity.ray_executor import _shim_broken_amdsmi\n"
            "_shim_broken_amdsmi()\n"
            "print(os.environ.get('PYTHONPATH', ''))\n")
    env = {**os.environ, "SHIM_TMP": str(tmp_path), "PYTHONPATH": ""}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout
    made = [p for p in out.strip().split(os.pathsep) if p.startswith(str(tmp_path))]
    if not made:
        pytest.skip("amdsmi imports cleanly or is absent here: no shim is made")
    assert not any(Path(p).exists() for p in made)
    assert list(tmp_path.iterdir()) == []
