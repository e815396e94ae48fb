"""benchmarks/serve_bench.py's sweep with fake servers and a fake `vllm bench serve`: both
sides up at once on distinct local ports, every rate driven on each side in alternating
order, every server stopped afterwards; a server that cannot start says how to rebuild the
engine."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from autoplan.engines import serving, vllm_engine
from autoplan.engines.serving import RatePoint
from autoplan.errors import AutoplanError
from tests.unit.test_serving import FAKE_SERVER, _gone

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import serve_bench  # noqa: E402


@pytest.fixture
def fakes(tmp_path, monkeypatch):
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    started, driven = [], []

    def serve_command(folder, port, **_kw):  # noqa: ANN001, ANN202
        pidfile = tmp_path / f"child{len(started)}.pid"
        started.append((Path(folder).name, port, pidfile))
        delay = "60" if Path(folder).name == "broken" else "0.1"
        return [sys.executable, str(script), str(port), str(pidfile), delay]

    def bench_serve(base_url, model, tokenizer, rates, **_kw):  # noqa: ANN001, ANN202
        driven.append((model, rates[0]))
        return [RatePoint(rates[0], 4, 1.0, rates[0], 10.0, 5.0, 9.0, 2.0, 3.0, 4.0)]

    monkeypatch.setattr(vllm_engine, "serve_command", serve_command)
    monkeypatch.setattr(serving, "bench_serve", bench_serve)
    return started, driven


def _args(**kw) -> argparse.Namespace:
    base = dict(port=0, dtype="bfloat16", max_num_seqs=4, input_len=8, output_len=4,
                num_prompts=4, seed=0)
    return argparse.Namespace(**{**base, **kw})


def test_sides_are_served_at_once_interleaved_and_stopped(fakes, tmp_path):
    started, driven = fakes
    out = serve_bench._sweep({"baseline": tmp_path / "a", "plan": tmp_path / "b"}, _args(),
                             [1.0, 2.0, 4.0], None)
    assert len({port for _, port, _ in started}) == 2  # two servers, two ports
    assert driven == [("baseline", 1.0), ("plan", 1.0), ("plan", 2.0), ("baseline", 2.0),
                      ("baseline", 4.0), ("plan", 4.0)]
    assert [p["request_rate"] for p in out["plan"]["points"]] == [1.0, 2.0, 4.0]
    assert len(out["baseline"]["load_avg_1m"]) == 3
    for *_, pidfile in started:  # the servers' own children are gone too
        assert _gone(int(pidfile.read_text()))


def test_a_server_that_never_starts_names_the_rebuild(fakes, tmp_path, monkeypatch):
    started, _ = fakes
    real = serving.ServerProcess

    def quick(*a, **kw):  # noqa: ANN002, ANN003, ANN202
        return real(*a, **{**kw, "timeout_s": 1.5, "grace_s": 2})

    monkeypatch.setattr(serving, "ServerProcess", quick)
    with pytest.raises(AutoplanError) as err:
        serve_bench._sweep({"baseline": tmp_path / "a", "plan": tmp_path / "broken"}, _args(),
                           [1.0], None)
    assert "`autoplan engines install vllm --force`" in str(err.value)
    for *_, pidfile in started:  # the baseline, already up, was stopped as well
        assert _gone(int(pidfile.read_text()))


@pytest.mark.parametrize("script", ["serve_bench", "vllm_formats"])
def test_a_missing_engine_is_one_line_naming_the_install(script, monkeypatch, capsys, tmp_path):
    import importlib

    monkeypatch.setenv("AUTOPLAN_ENGINE_VLLM_PYTHON", str(tmp_path / "no-python"))
    module = importlib.import_module(f"benchmarks.{script}")
    argv = ["--plan-dir", str(tmp_path)] if script == "serve_bench" else []
    assert module.main([*argv, "--out", str(tmp_path / "out.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err
    assert "`autoplan engines install vllm`" in err
    assert not (tmp_path / "out.json").exists()
