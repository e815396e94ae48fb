"""The shared exporter conformance suite: every registered export format, and a fake one
written here, must refuse a plan its runtime cannot serve before writing anything, write
atomically (a failure midway leaves the previous export untouched and no temp files), and
put the plan and its audit beside the checkpoint (the promise in export/__init__.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from autoplan.errors import AutoplanError, UnsupportedFormatError
from autoplan.export import exporter_names, get_exporter
from autoplan.export._prepare import prepare
from autoplan.atomic import atomic_dir
from autoplan.export._write import AUDIT_FILE, PLAN_FILE, is_export, write_sidecars
from tests.unit.test_export_common import BASELINE, layer_names, make_plan, tiny_loaded

pytest.importorskip("transformers")


class FakeExporter:
    """The smallest exporter that keeps the contract: weights as safetensors, plus sidecars."""

    name = "fake-safetensors"
    runtimes = ("vllm",)

    def write(self, prep, out_dir):  # noqa: ANN001, ANN201
        from safetensors.torch import save_file

        with atomic_dir(out_dir, is_ours=is_export) as tmp:
            save_file({n: s.weight.contiguous() for n, s in prep.sims.items()},
                      str(tmp / "model.safetensors"))
            write_sidecars(tmp, prep.plan, self.name, prep.runtime,
                           {n: str(c) for n, c in prep.choices.items()})
        return Path(out_dir)


@dataclass(frozen=True)
class Case:
    """A plan each format serves, one its runtime refuses, and where to write."""

    target: str
    runtime: str
    good: Callable[[str], str]  # layer name -> choice text
    bad: Callable[[str], str]
    out: str = "out"
    gguf_source: bool = False


def _head(head: str, body: str) -> Callable[[str], str]:
    return lambda n: head if n == "lm_head" else body


CASES = {
    "compressed-tensors": Case("h100-sxm", "vllm", _head(BASELINE, "dense+fp8_e4m3"),
                               _head(BASELINE, "2:4+fp8_e4m3")),
    "modelopt": Case("h100-sxm", "tensorrt-llm", _head(BASELINE, "2:4+fp8_e4m3"),
                     _head(BASELINE, "dense+int4_g32")),
    "onnx": Case("xeon-8480", "onnxruntime", _head("dense+fp32", "dense+int8a8_g128"),
                 _head("dense+fp32", "dense+nvfp4")),
    "gguf": Case("xeon-8480", "llama.cpp", _head("dense+q8_0", "dense+q4_1"),
                 _head("dense+q8_0", "dense+int4_g32"), out="m.gguf", gguf_source=True),
    FakeExporter.name: Case("h100-sxm", "vllm", _head(BASELINE, "dense+fp8_e4m3"),
                            _head(BASELINE, "2:4+fp8_e4m3")),
}


@pytest.fixture(params=[*exporter_names(), FakeExporter.name])
def fmt(request) -> str:
    return request.param


def _exporter(fmt: str):  # noqa: ANN202
    return FakeExporter() if fmt == FakeExporter.name else get_exporter(fmt)


def _loaded(case: Case, tmp_path: Path):  # noqa: ANN202
    if case.gguf_source:
        pytest.importorskip("gguf")
        from tests.unit.test_export_gguf import _tiny_gguf_model

        return _tiny_gguf_model(tmp_path / "model")
    return tiny_loaded(tmp_path / "model")


def _export(fmt: str, case: Case, loaded, rule, out: Path) -> Path:  # noqa: ANN001
    exporter = _exporter(fmt)
    plan = make_plan(loaded, {n: rule(n) for n in layer_names(loaded)}, target=case.target,
                     runtime=case.runtime)
    prep = prepare(plan, loaded, exporter.name, exporter.runtimes)
    return exporter.write(prep, out), plan


def _sidecars(out: Path) -> tuple[Path, Path]:
    if out.is_file():
        from autoplan.export.gguf import sidecar_paths

        return sidecar_paths(out)
    return out / PLAN_FILE, out / AUDIT_FILE


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_every_registered_exporter_has_a_case() -> None:
    assert set(exporter_names()) <= set(CASES)


def test_refuses_a_plan_its_runtime_cannot_serve_before_writing(fmt, tmp_path) -> None:
    case = CASES[fmt]
    loaded = _loaded(case, tmp_path)
    (tmp_path / "exports").mkdir()
    out = tmp_path / "exports" / case.out
    with pytest.raises(UnsupportedFormatError) as err:
        _export(fmt, case, loaded, case.bad, out)
    assert "\n" not in str(err.value)
    assert list((tmp_path / "exports").iterdir()) == []


def test_writes_the_plan_and_its_audit_beside_the_checkpoint(fmt, tmp_path) -> None:
    case = CASES[fmt]
    loaded = _loaded(case, tmp_path)
    out, plan = _export(fmt, case, loaded, case.good, tmp_path / case.out)
    plan_file, audit_file = _sidecars(out)
    assert json.loads(plan_file.read_text()) == plan.model_dump(mode="json")
    audit = json.loads(audit_file.read_text())
    assert audit["format"] == _exporter(fmt).name and audit["runtime"] == case.runtime
    assert audit["model"]["content_hash"] == plan.model.content_hash
    assert _leftovers(tmp_path) == []


def test_a_failure_midway_keeps_the_previous_export_and_leaves_no_temp_files(
        fmt, tmp_path, monkeypatch) -> None:
    case = CASES[fmt]
    loaded = _loaded(case, tmp_path)
    (tmp_path / "exports").mkdir()
    out, _ = _export(fmt, case, loaded, case.good, tmp_path / "exports" / case.out)
    plan_file, _ = _sidecars(out)
    before = {p.name: p.read_bytes() for p in (tmp_path / "exports").rglob("*") if p.is_file()}

    def disk_full(*_a, **_k):  # noqa: ANN002, ANN003, ANN202 - fails after weights are written
        raise OSError("disk full")

    monkeypatch.setattr(Path, "write_text", disk_full)
    with pytest.raises((OSError, AutoplanError)):
        _export(fmt, case, loaded, case.good, out)
    monkeypatch.undo()
    after = {p.name: p.read_bytes() for p in (tmp_path / "exports").rglob("*") if p.is_file()}
    assert after == before
    assert _leftovers(tmp_path / "exports") == []
