"""Bad input to `autoplan export` / `autoplan apply` (issue 13): one line, exit 2, before the
model is loaded, nothing written -- and a plan file never makes autoplan open a path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoplan.cli import cli
from autoplan.errors import UserInputError
from autoplan.export.calibration import plan_calibration
from autoplan.plan import save_plan
from tests.unit._safetensors_damage import DAMAGES, damage
from tests.unit.test_export_common import layer_names, make_plan, tiny_loaded

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("inputs")
    loaded = tiny_loaded(tmp)
    plan = make_plan(loaded, {n: "dense+int8a8_g128" for n in layer_names(loaded)},
                     target="xeon-8480", runtime="onnxruntime")
    path = tmp / "plan.json"
    save_plan(plan, path)
    return loaded, plan, path


def _one_line_exit_2(result) -> str:  # noqa: ANN001
    assert result.exit_code == 2, result.output
    # progress lines aside (rich wraps a long "loading PATH ..." line at 80 columns when
    # the output is not a terminal), exactly one error line, and no traceback
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    return errors[0]


@pytest.mark.parametrize("command", [["export", "--format", "onnx"], ["apply"]])
def test_out_under_a_file_fails_before_loading(command, setup, tmp_path) -> None:
    _, _, plan = setup
    (tmp_path / "afile").write_text("x")
    out = tmp_path / "afile" / "art"
    result = CliRunner().invoke(cli, [*command, str(plan), "--model", "no-such-model",
                                      "--out", str(out)])
    assert "not a folder" in _one_line_exit_2(result)  # not "no-such-model": checked first


@pytest.mark.parametrize("kind", sorted(DAMAGES))
@pytest.mark.parametrize("command", [["export", "--format", "onnx"], ["apply"]])
def test_an_unreadable_safetensors_is_one_line(command, kind, setup, tmp_path) -> None:
    """The same damages, the same check (and message) as search's."""
    loaded, _, plan = setup
    folder = tmp_path / "broken"
    shutil.copytree(loaded.path, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(damage(weights.read_bytes(), kind))
    result = CliRunner().invoke(cli, [*command, str(plan), "--model", str(folder),
                                      "--out", str(tmp_path / "out")])
    line = _one_line_exit_2(result)
    assert "model.safetensors" in line and "not a valid safetensors file" in line
    assert DAMAGES[kind] in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", [["export", "--format", "onnx"], ["apply"]])
def test_a_plans_model_id_is_not_opened_as_a_path(command, setup, tmp_path) -> None:
    loaded, plan, _ = setup
    doc = plan.model_dump(mode="json")
    doc["model"]["id"] = str(loaded.path)  # a path someone else's plan points at
    path = tmp_path / "other.json"
    path.write_text(json.dumps(doc))
    result = CliRunner().invoke(cli, [*command, str(path), "--out", str(tmp_path / "out")])
    assert "pass --model" in _one_line_exit_2(result)


def test_a_plans_calibration_file_is_not_opened(setup, tmp_path) -> None:
    loaded, plan, _ = setup
    secret = tmp_path / "secret.txt"
    secret.write_text("not for autoplan " * 200)
    gptq = plan.model_copy(update={
        "compression": plan.compression.model_copy(update={"quant_method": "gptq"}),
        "audit": plan.audit.model_copy(update={"calibration_source": str(secret)})})
    with pytest.raises(UserInputError, match="pass --calibration"):
        plan_calibration(gptq, loaded)


def test_targets_lists_local_as_measured() -> None:
    result = CliRunner().invoke(cli, ["targets", "--json"])
    assert result.exit_code == 0, result.output
    local = [t for t in json.loads(result.output) if t["name"] == "local"]
    assert len(local) == 1 and local[0]["measured"] and local[0]["vendor"] == "cpu-local"
    table = CliRunner().invoke(cli, ["targets", "--vendor", "cpu-local"]).output
    assert "local" in table and "measured" in table


def test_apply_says_when_the_plan_was_searched_for_another_runtime(setup, tmp_path) -> None:
    """A vLLM plan for a CPU target: apply writes ONNX for ONNX Runtime and says so (the
    plan's predicted speed is vLLM's); a plan for ONNX Runtime gets no note."""
    from autoplan.export.apply import apply_format, runtime_note
    from autoplan.plan.io import read_plan

    loaded, plan, path = setup
    assert runtime_note(read_plan(path), "onnx") is None
    other = tmp_path / "vllm.json"
    save_plan(plan.model_copy(update={"runtime": plan.runtime.model_copy(
        update={"name": "vllm"})}), other)
    vllm = read_plan(other)
    fmt = apply_format(vllm)
    note = runtime_note(vllm, fmt)
    assert fmt == "onnx" and "searched for vllm" in note and "onnxruntime" in note
    assert "--format compressed-tensors" in note
    res = CliRunner().invoke(cli, ["apply", str(other), "--model", str(loaded.path), "--out",
                                   str(tmp_path / "art")])  # this folder has no tokenizer
    assert res.stderr.index("note: the plan was searched for vllm") < res.stderr.index(
        "loading"), res.output
