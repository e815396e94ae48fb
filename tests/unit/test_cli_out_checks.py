"""`export` and `report` refuse, with one line and exit 2, an --out they could not write
(checked by the probe search's --out gets, before the model loads or the report renders),
and `report --model` a model that is not the plan's (by content hash, as export does; a bare
config by the shape and routing the plan records), before anything is drawn."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from autoplan.cli import cli

_RESULTS = Path(__file__).resolve().parents[2] / "benchmarks/results"
_PLAN = _RESULTS / "cpu_plans/int8_kl0.05.json"  # a CPU plan of smollm2-135m
_GGUF_PLAN = _RESULTS / "llamacpp_plans_kl0.1_plan.json"  # a llama.cpp plan
_PROC = pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="no /proc here")
_ROOT = os.name == "posix" and os.geteuid() == 0


class _Reached(Exception):  # not an autoplan error: the CLI must not catch it
    pass


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.unit._tiny import shared_dirs

    return shared_dirs(tmp_path_factory)[0]


@pytest.fixture()
def work(tmp_path: Path, tiny: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Placeholders: {tmp} (this test's folder, where nothing may be left), {tiny}, {plan},
    {gguf_plan}; {tmp}/afile is a file. Hashes are cached outside {tmp}."""
    cache = tmp_path / "cache"
    run = tmp_path / "run"
    for folder in (cache, run):
        folder.mkdir()
    (run / "afile").write_text("x")
    monkeypatch.setenv("AUTOPLAN_CACHE", str(cache))
    monkeypatch.chdir(run)
    return {"tmp": str(run), "tiny": str(tiny), "plan": str(_PLAN), "gguf_plan": str(_GGUF_PLAN)}


@pytest.fixture()
def loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make loading a model (or converting a GGUF) raise, recording that it was reached."""
    import autoplan.models
    import autoplan.models.gguf_convert
    import autoplan.models.loader

    calls: list[str] = []

    def never(*_a: object, **_k: object) -> None:
        calls.append("load")
        raise _Reached("the model was loaded before the refusal")

    for module, attr in ((autoplan.models, "load_model"), (autoplan.models.loader, "load_model"),
                         (autoplan.models.gguf_convert, "_convert_into")):
        monkeypatch.setattr(module, attr, never)
    return calls


@pytest.fixture()
def draws(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make rendering a report raise: a refusal must come before it."""
    import autoplan.report.build

    def never(*_a: object, **_k: object) -> None:
        raise _Reached("the report was rendered before the refusal")

    monkeypatch.setattr(autoplan.report.build.figures, "pareto_front", never)
    monkeypatch.setattr(autoplan.report.build.figures, "compare_bars", never)


def _tree(root: str) -> list[str]:
    return sorted(str(p) for p in Path(root).rglob("*"))


def _invoke(command: str, work: dict[str, str]) -> Result:
    return CliRunner().invoke(cli, [a.format(**work) for a in command.split()])


def _refused(command: str, needles: tuple[str, ...], work: dict[str, str]) -> str:
    """Exit 2, exactly one 'error:' line holding every needle, no traceback, nothing left."""
    before = _tree(work["tmp"])
    result = _invoke(command, work)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("error:"), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert _tree(work["tmp"]) == before, "the refusal left files behind"
    return lines[0]


# ---- --out: refused before the model loads (export) or the report renders -------------------

_X = "export {plan} --format onnx --model {tiny}"
_XG = "export {gguf_plan} --format gguf --model {tiny}"


@_PROC
@pytest.mark.parametrize(("command", "needles"), [
    (_XG + " --out /proc/nope.gguf", ("/proc/nope.gguf", "writable")),  # a FILE.gguf export
    (_X + " --out /proc/nope", ("/proc/nope", "writable")),  # a folder export
    (_X + " --out /proc/nope/deeper/art", ("/proc/nope/deeper/art", "writable")),
    (_X + " --out {tmp}/art --lora-adapter /proc/adapter", ("/proc/adapter", "writable")),
    ("report {plan} --out /proc/r.html", ("/proc/r.html", "writable")),
    ("report {plan} --out /proc/nope/deeper/r.html", ("/proc/nope/deeper/r.html", "writable")),
])
def test_out_where_nothing_can_be_created_is_refused_first(command, needles, work, loads, draws):
    """/proc: os.access says yes to root there, yet no file can be created (the commands
    failed with a traceback, export only after loading and compressing the model)."""
    _refused(command, needles, work)
    assert not loads


@pytest.mark.parametrize("command", [_X + " --out {tmp}/afile/art",
                                     "report {plan} --out {tmp}/afile/r.html"])
def test_out_below_a_file_is_refused_first(command, work, loads, draws):
    _refused(command, ("afile", "not a folder"), work)
    assert not loads


@pytest.mark.skipif(_ROOT, reason="root writes into read-only folders")
@pytest.mark.parametrize("command", [_X + " --out {tmp}/ro/art", _X + " --out {tmp}/ro/new/art",
                                     "report {plan} --out {tmp}/ro/r.html"])
def test_out_in_a_read_only_folder_is_refused_first(command, work, loads, draws):
    (Path(work["tmp"]) / "ro").mkdir(mode=0o555)
    _refused(command, ("ro", "writable"), work)
    assert not loads


def test_missing_folders_in_a_writable_one_pass_the_check(work, loads):
    """The writers create missing folders: the check lets such an --out through (the
    export goes on to load the model) and creates nothing."""
    before = _tree(work["tmp"])
    result = _invoke(_X + " --out {tmp}/new/deeper/art", work)
    assert loads and isinstance(result.exception, _Reached), result.output
    assert _tree(work["tmp"]) == before


# ---- report --model: the plan's model or a refusal ------------------------------------------


def _plan_file(work: dict[str, str], name: str, **model: object) -> str:
    """The CPU plan with its model reference changed (and a `routing` when given)."""
    doc = json.loads(_PLAN.read_text())
    routing = model.pop("routing", None)
    doc["model"] = {**doc["model"], **model}
    if routing is not None:
        doc["routing"] = routing
    path = Path(work["tmp"]).parent / f"{name}.json"  # beside {tmp}: the check is on {tmp}
    path.write_text(json.dumps(doc))
    return str(path)


def test_report_refuses_a_model_with_other_weights(work, draws):
    """The plan is smollm2-135m's; the tiny model's content hash differs (the report drew
    the tiny model's breakdown for it)."""
    _refused("report {plan} --model {tiny} --out {tmp}/r.html", (
        "--model", "content hash", "smollm2-135m (6106c381544d)", "pass the plan's model"), work)


def test_report_refuses_a_model_for_any_plan_of_a_compare_folder(work, draws):
    folder = Path(work["tmp"]).parent / "cmp"
    folder.mkdir()
    (folder / "p.json").write_text(_PLAN.read_text())
    (folder / "compare.json").write_text(json.dumps({
        "model": "smollm2-135m", "budget": "kl<=0.05", "objective": "throughput",
        "rows": [{"status": "ok", "plan_file": "p.json"}]}))
    _refused(f"report {folder} --model {{tiny}} --out {{tmp}}/r.html", ("content hash",), work)


def test_report_takes_the_plans_own_model(work):
    pytest.importorskip("matplotlib", reason="autoplan[report] (matplotlib) not installed")
    from autoplan.models.hashing import weights_hash

    plan = _plan_file(work, "mine", content_hash=weights_hash(work["tiny"]), id="tiny")
    result = _invoke(f"report {plan} --model {{tiny}} --out {{tmp}}/r.html", work)
    assert result.exit_code == 0, result.output
    assert (Path(work["tmp"]) / "r.html").is_file()


_MOE = {"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 256, "num_local_experts": 4, "num_experts_per_tok": 2}


def _config(work: dict[str, str], name: str, **change: object) -> str:
    path = Path(work["tmp"]).parent / f"{name}.json"
    path.write_text(json.dumps({k: v for k, v in {**_MOE, **change}.items() if v is not None}))
    return str(path)


def _moe_plan(work: dict[str, str]) -> str:
    """A plan of the MoE config above: its shape, and routing shares summing to top-2."""
    from autoplan.models.loader import load_spec

    spec = load_spec(_config(work, "moe-ref"))
    return _plan_file(work, "moe-plan", id="moe", model_type="mixtral", n_layers=2,
                      params=spec.total_params,
                      routing={"source": "profile",
                               "shares": {"0": [0.9, 0.5, 0.4, 0.2], "1": [0.5] * 4}})


def test_report_refuses_a_config_routing_other_experts_per_token(work, draws):
    """A bare config has no weights to hash: the plan's shape and routing tell a top-4
    model's config from the top-2 plan's."""
    plan, top4 = _moe_plan(work), _config(work, "top4", num_experts_per_tok=4)
    _refused(f"report {plan} --model {top4} --out {{tmp}}/r.html",
             ("4 experts per token", "2 experts per token", "pass the plan's model"), work)
    dense = _config(work, "dense", model_type="llama", num_local_experts=None,
                    num_experts_per_tok=None)
    _refused(f"report {plan} --model {dense} --out {{tmp}}/r.html", ("is a llama",), work)


def test_report_takes_a_config_of_the_plans_shape(work):
    pytest.importorskip("matplotlib", reason="autoplan[report] (matplotlib) not installed")
    plan = _moe_plan(work)
    result = _invoke(f"report {plan} --model {_config(work, 'same')} --out {{tmp}}/r.html", work)
    assert result.exit_code == 0, result.output
