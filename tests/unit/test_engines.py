"""Engine venvs: status, the one-line error naming the install command, the override var."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoplan.cli import cli
from autoplan.engines import engine_names, engine_python, engine_status, get_engine
from autoplan.errors import UnknownNameError, UserInputError


@pytest.fixture(autouse=True)
def _empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOPLAN_CACHE", str(tmp_path / "cache"))
    for name in engine_names():
        monkeypatch.delenv(get_engine(name).env_var, raising=False)


def test_missing_engine_names_the_install_command() -> None:
    with pytest.raises(UserInputError, match=r"autoplan engines install vllm"):
        engine_python("vllm")
    assert not engine_status("llama.cpp").installed


def test_unknown_engine_lists_the_known_ones() -> None:
    with pytest.raises(UnknownNameError, match="llama.cpp"):
        get_engine("tgi")


def test_override_variable_points_at_an_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = get_engine("llama.cpp")
    assert spec.env_var == "AUTOPLAN_ENGINE_LLAMA_CPP_PYTHON"
    monkeypatch.setenv(spec.env_var, sys.executable)
    assert engine_python("llama.cpp") == Path(sys.executable)
    monkeypatch.setenv(spec.env_var, "/nonexistent/python")
    with pytest.raises(UserInputError, match="not an executable"):
        engine_python("llama.cpp")


def test_interrupted_install_counts_as_missing() -> None:
    spec = get_engine("vllm")
    (spec.venv_dir / "bin").mkdir(parents=True)
    status = engine_status("vllm")
    assert not status.installed and "interrupted" in status.detail


def test_cli_lists_engines_as_json() -> None:
    result = CliRunner().invoke(cli, ["engines", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert {r["name"] for r in rows} == set(engine_names())
    assert all(not r["installed"] for r in rows)


def test_engines_help_names_the_override_variable() -> None:
    """The variable that points autoplan at an existing engine Python is in the help, in the
    form every engine's name takes."""
    text = " ".join(CliRunner().invoke(cli, ["engines", "--help"]).output.split())
    assert "AUTOPLAN_ENGINE_<NAME>_PYTHON" in text
    assert "AUTOPLAN_ENGINE_LLAMA_CPP_PYTHON" in text
    assert all(get_engine(n).env_var.startswith("AUTOPLAN_ENGINE_") for n in engine_names())
