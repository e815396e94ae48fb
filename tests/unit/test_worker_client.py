"""The peer-engine worker client of benchmarks/ (llama.cpp, OpenVINO), against a fake worker
that speaks the same JSON-lines protocol (the real engines live in their own venvs)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from _worker_client import WorkerGenerator, worker_side  # noqa: E402
from openvino_side import export_args  # noqa: E402

from autoplan.errors import AutoplanError, UserInputError  # noqa: E402

_FAKE = textwrap.dedent('''
    import json, sys
    if sys.argv[1] == "die":
        sys.exit(3)
    print(json.dumps({"ready": sys.argv[1] != "unready", "echo": sys.argv[1:]}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if "ids" not in req:
            print(json.dumps({"error": "no ids in " + line.strip()}), flush=True)
            continue
        n = req["n"]
        print(json.dumps({"tokens": [req["ids"][0][-1] + i for i in range(n)], "ttft_s": 0.5,
                          "step_s": [0.25] * (n - 1), "peak_rss_bytes": 1000 * n}), flush=True)
''')


@pytest.fixture
def fake(tmp_path: Path) -> Path:
    script = tmp_path / "fake_worker.py"
    script.write_text(_FAKE)
    return script


def test_generate_round_trip_and_side(fake):
    gen = WorkerGenerator("fake", [sys.executable, str(fake), "ok"], "hint")
    assert gen.hello["echo"] == ["ok"]
    res = gen.generate(np.array([[5, 6, 7]], np.int64), 4)
    assert res.tokens.tolist() == [[7, 8, 9, 10]] and res.prompt_len == 3
    assert res.ttft_s == 0.5 and res.tpot_s == 0.25 and gen.peak_rss_bytes == 4000
    side = worker_side("peer", "fake", gen, 123)
    assert (side.name, side.runtime, side.weight_bytes) == ("peer", "fake", 123)
    with pytest.raises(UserInputError, match="batch 1 only"):
        gen.generate(np.zeros((2, 3), np.int64), 2)
    with pytest.raises(AutoplanError, match="no ids"):
        gen.request({"other": 1})
    gen.close()
    assert gen.proc.returncode == 0


@pytest.mark.parametrize("mode", ["die", "unready"])
def test_a_worker_that_does_not_start_is_one_line_with_the_hint(fake, mode):
    with pytest.raises(UserInputError, match="run it by hand") as info:
        WorkerGenerator("fake", [sys.executable, str(fake), mode], "run it by hand")
    assert "\n" not in str(info.value)


def test_openvino_formats():
    assert export_args("int8", 32) == ["--weight-format", "int8"]
    assert export_args("int4", 64)[-2:] == ["--group-size", "64"]
    with pytest.raises(UserInputError, match="int8 or int4"):
        export_args("fp4", 32)
