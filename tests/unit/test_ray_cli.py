"""`--ray` refusals that need no cluster: Ray not installed, nothing listening at the
address, a malformed address. Each is one line naming the fix, before any model loads."""

from __future__ import annotations

import socket
import sys

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


@pytest.mark.parametrize("command", ["profile", "search"])
def test_without_the_extra_ray_names_the_install(command: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    code, line = _one_line([command, "--model", "no-such-model", "--ray", "auto"])
    assert code == 2
    assert "--ray" in line and "pip install 'autoplan[ray]'" in line


@pytest.mark.parametrize("command", ["profile", "search"])
def test_an_unreachable_address_is_one_line_naming_ray(command: str) -> None:
    port = _closed_port()
    code, line = _one_line([command, "--model", "no-such-model", "--ray", f"127.0.0.1:{port}"])
    assert code == 2
    assert line.startswith(f"error: --ray 127.0.0.1:{port}: no Ray cluster reachable")


def test_a_malformed_address_is_one_line() -> None:
    code, line = _one_line(["profile", "--ray", "head-node:port"])
    assert code == 2 and "HOST:PORT" in line
