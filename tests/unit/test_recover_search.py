"""--recover in the search, `autoplan recover`, and exports of recovered plans, on the tiny
Llama: a 2:4 plan that fails its budget unrecovered passes once recovered, its weights file
beside the plan reproduces the audit through the ModelOpt exporter (2:4 checked there), a
LoRA recovery exports as a PEFT adapter over its unrecovered base, and bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from autoplan.cli import cli
from autoplan.errors import UserInputError
from autoplan.export import export_plan
from autoplan.export.apply import recovered_weights
from autoplan.export.calibration import plan_calibration
from autoplan.formats import Choice
from autoplan.models import load_model
from autoplan.plan.io import load_plan
from autoplan.recover import RecoveryDiverged, RecoverySettings
from autoplan.recover.weights import file_sha256
from autoplan.search import RecoverOptions, SearchOutcome, SearchRequest, recover_plan, run_search
from autoplan.search.reporter import Reporter
from tests.unit._tiny import FAST, WORKLOAD, one_torch_thread, tiny_model_dir  # noqa: F401

RS = {"steps": 20, "lr": 1e-3, "seq_len": 64, "checkpoint_every": 0}


def _request(model_dir: Path, out: Path, **kw) -> SearchRequest:  # noqa: ANN003
    """min_gain 0: the tiny model's mixes are all predicted within H100's stated speed
    uncertainty of bf16, which the noise rule would keep; these tests recover a mix."""
    return SearchRequest(**({"model": str(model_dir), "target": "h100-sxm",
                             "runtime": "tensorrt-llm", "budget": "kl<=0.05", "trials": 100,
                             "out": out, "workload": WORKLOAD, "min_gain": 0.0, **FAST} | kw))


@pytest.fixture(scope="module")
def recovered(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> SearchOutcome:
    out = tmp_path_factory.mktemp("rec") / "plan.json"
    return run_search(_request(model_dir, out, recovery=RecoverySettings(**RS)))


@pytest.fixture(scope="module")
def plain(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("plain") / "plan.json"
    run_search(_request(model_dir, out))
    return out


def _plan_path(outcome: SearchOutcome) -> Path:
    return Path(outcome.plan.search.storage.removeprefix("journal:")).with_name("plan.json")


def test_search_picks_a_plan_that_passes_only_once_recovered(recovered: SearchOutcome) -> None:
    plan = recovered.plan
    r = plan.recovery
    assert r is not None and r.method == "distill" and r.steps_run == RS["steps"]
    assert plan.quality.budget_met and not r.unrecovered.budget_met
    assert plan.quality.kl < r.unrecovered.kl
    assert any(Choice.parse(c).sparsity.kind == "nm" for c in plan.decisions.values())
    path = _plan_path(recovered)
    weights = path.with_name(r.weights_file)
    assert weights.is_file() and file_sha256(weights) == r.weights_sha256
    assert not path.with_name("plan.json.recovery").exists()  # the work folder is gone
    for name, digests in plan.audit.tensors.items():  # same masks, new weights and scales
        assert digests["mask"] == r.unrecovered_tensors[name]["mask"], name
        assert digests["weight"] != r.unrecovered_tensors[name]["weight"], name
    assert set(plan.quality.slices) == {"numbers", "names", "non-english"}


def test_export_reproduces_the_recovered_audit(recovered: SearchOutcome, model_dir: Path,
                                               tmp_path: Path) -> None:
    path = _plan_path(recovered)
    plan = load_plan(path)
    loaded = load_model(str(model_dir))
    calibration = plan_calibration(plan, loaded)
    out = export_plan(plan, loaded, "modelopt", tmp_path / "trt", calibration=calibration,
                      recovered=recovered_weights(plan, path, None))
    config = json.loads((out / "hf_quant_config.json").read_text())
    nm = {n for n, c in plan.decisions.items() if Choice.parse(c).sparsity.kind == "nm"}
    assert set(config["sparsity"]["layers"]) == nm  # 2:4 still 2:4, checked by the exporter
    with pytest.raises(UserInputError, match="recovered"):
        export_plan(plan, loaded, "modelopt", tmp_path / "x", calibration=calibration)
    assert not (tmp_path / "x").exists()


def test_cli_export_finds_checks_and_refuses_weights(recovered: SearchOutcome,
                                                     tmp_path: Path, model_dir: Path) -> None:
    path = _plan_path(recovered)
    runner = CliRunner()
    ok = runner.invoke(cli, ["export", str(path), "--format", "modelopt", "--out",
                             str(tmp_path / "a"), "--model", str(model_dir)])
    assert ok.exit_code == 0, ok.output
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(path.with_name(recovered.plan.recovery.weights_file).read_bytes()[:-8])
    res = runner.invoke(cli, ["export", str(path), "--format", "modelopt", "--out",
                              str(tmp_path / "b"), "--model", str(model_dir),
                              "--recovered", str(bad)])
    assert res.exit_code == 2 and "sha256" in res.output and "Traceback" not in res.output
    res = runner.invoke(cli, ["export", str(path), "--format", "modelopt", "--out",
                              str(tmp_path / "c"), "--model", str(model_dir),
                              "--lora-adapter", str(tmp_path / "ad")])
    assert res.exit_code == 2 and "--recover lora" in res.output


def test_recover_command_lora_and_adapter_export(plain: Path, model_dir: Path,
                                                 tmp_path: Path) -> None:
    plan = load_plan(plain)
    loaded = load_model(str(model_dir))
    out = tmp_path / "lora.json"
    new = recover_plan(plan, loaded, RecoverOptions(
        RecoverySettings(method="lora", rank=4, **RS), out))
    assert new.recovery.method == "lora" and new.recovery.adapter_kl is not None
    assert new.recovery.unrecovered.kl == pytest.approx(plan.quality.kl, rel=1e-6)
    assert load_plan(out) == new and load_plan(plain) == plan  # the input plan untouched
    rec = recovered_weights(new, out, None)
    base = export_plan(new, loaded, "modelopt", tmp_path / "base",
                       calibration=plan_calibration(new, loaded), recovered=rec,
                       unrecovered=True)
    from autoplan.export.lora_adapter import write_lora_adapter

    adapter = write_lora_adapter(new, loaded, rec, tmp_path / "adapter")
    assert (adapter / "adapter_config.json").is_file() and base.is_dir()
    from peft import PeftModel

    peft_model = PeftModel.from_pretrained(load_model(str(model_dir)).model, str(adapter))
    name = next(iter(rec.adapters))
    layer = peft_model.base_model.model.get_submodule(name)
    assert torch.equal(layer.lora_B["default"].weight, rec.adapters[name]["lora_B"])
    with pytest.raises(UserInputError, match="already recovered"):
        recover_plan(new, loaded, RecoverOptions(RecoverySettings(**RS), tmp_path / "z.json"))


def test_recover_command_that_diverges_writes_nothing(plain: Path, model_dir: Path,
                                                      tmp_path: Path) -> None:
    plan = load_plan(plain)
    before = plain.read_bytes()
    out = tmp_path / "d.json"
    with pytest.raises(RecoveryDiverged, match="diverged at step"):
        recover_plan(plan, load_model(str(model_dir)), RecoverOptions(
            RecoverySettings(**(RS | {"lr": 0.9, "steps": 30})), out))
    assert not out.exists() and not out.with_name("d.recovered.safetensors").exists()
    assert plain.read_bytes() == before


def test_cli_refuses_recovery_it_cannot_run(model_dir: Path, tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["search", "--model", str(model_dir), "--recover", "distill",
                                   "--execution", "stream", "--out", str(tmp_path / "p.json")])
    assert res.exit_code == 2
    assert "--recover needs the model in memory: pass --execution memory" in res.output
    assert "Traceback" not in res.output


def test_show_and_recover_command_on_a_recovered_plan(recovered: SearchOutcome,
                                                      model_dir: Path) -> None:
    path = _plan_path(recovered)
    runner = CliRunner()
    shown = runner.invoke(cli, ["show", str(path)])
    assert shown.exit_code == 0, shown.output
    assert "recovery: distill, 20 steps" in shown.output
    assert "KL per slice (measured): numbers" in shown.output
    again = runner.invoke(cli, ["recover", str(path), "--model", str(model_dir), "--quiet"])
    assert again.exit_code == 2 and "already recovered" in again.output
    assert "Traceback" not in again.output


class _Notes(Reporter):
    def __init__(self) -> None:
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        self.notes.append(text)


def test_a_diverging_pass_in_a_search_is_retried_at_a_quarter_of_its_rate(
        model_dir: Path, tmp_path: Path) -> None:
    # lr 0.9 diverges at both rates: the search notes both passes, keeps going, and its
    # plan is the unrecovered measurement (no recovery record, no weights file)
    notes = _Notes()
    outcome = run_search(_request(model_dir, tmp_path / "p.json", recovery=RecoverySettings(
        **(RS | {"lr": 0.9, "steps": 30}))), reporter=notes)
    diverged = [n for n in notes.notes if "diverged at step" in n]
    assert diverged and len(diverged) % 2 == 0  # every finalist: its rate, then a quarter
    assert "--recover-lr (now 0.9)" in diverged[0] and "(now 0.225)" in diverged[1]
    assert outcome.plan.recovery is None
