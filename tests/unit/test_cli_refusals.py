"""Bad input found failing (issue 13 item 1): each is refused with one line on stderr and exit
2, no traceback, nothing written, before any expensive work."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoplan.cli import cli
from autoplan.cost.measured import load_cost_table
from autoplan.errors import UserInputError
from autoplan.search.jobs import check_storage, open_storage, redact
from tests.unit._safetensors_damage import DAMAGES, damage

_ESTIMATE = ["estimate", "--model", "llama-3.1-8b", "--target", "h100"]
_PLAN = Path(__file__).resolve().parents[2] / "benchmarks/results/cpu_plans/int8_kl0.05.json"


def _refused(args: list[str], needle: str, cwd: Path) -> None:
    """Exit 2, exactly one 'error:' line naming ``needle``, and no file left in ``cwd``."""
    before = sorted(cwd.rglob("*"))
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("error:") and needle in lines[0], lines[0]
    assert sorted(cwd.rglob("*")) == before


def _file(tmp_path: Path, name: str, text: str) -> str:
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
def test_estimate_price_per_hour_must_be_finite(value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _refused([*_ESTIMATE, "--price-per-hour", value], "--price-per-hour", tmp_path)


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_search_price_per_hour_refused_before_loading(value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # a model that does not exist: the price must be refused before the model is looked up
    _refused(["search", "--model", str(tmp_path / "nope"), "--price-per-hour", value,
              "--out", str(tmp_path / "plan.json")], "--price-per-hour", tmp_path)


@pytest.mark.parametrize("flag", ["--threads", "--requests", "--concurrency", "--input-len",
                                  "--output-len"])
def test_bench_counts_must_be_positive(flag, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _refused(["bench", "--model", str(tmp_path / "nope"), flag, "-1"], flag, tmp_path)


_BAD_TABLES = {
    "object without rows": ('{"foo": 1}', "no measured rows"),
    "empty list": ("[]", "no measured rows"),
    "list of rows": ('[{"m": 1, "n": 1, "k": 1, "choice": "dense+fp8", "median_us": 1}]',
                     "no measured rows"),
    "empty rows": ('{"rows": []}', "no measured rows"),
    "rows not a list": ('{"rows": {"m": 1}}', "must be a list"),
    "row missing fields": ('{"rows": [{"m": 32, "n": 64}]}', "row 0 is malformed"),
    "row not an object": ('{"rows": [7]}', "row 0 is malformed"),
    "nan time": (('{"rows": [{"m": 1, "n": 1, "k": 1, "choice": "dense+fp8", '
                  '"median_us": NaN}]}'), "non-finite"),
    "unknown choice": (('{"rows": [{"m": 1, "n": 1, "k": 1, "choice": "dense+fp7", '
                        '"median_us": 3}]}'), "row 0 is malformed"),
}


@pytest.mark.parametrize("case", sorted(_BAD_TABLES))
def test_malformed_cost_table_is_refused(case, tmp_path, monkeypatch):
    text, needle = _BAD_TABLES[case]
    table = _file(tmp_path, "table.json", text)
    monkeypatch.chdir(tmp_path)
    _refused([*_ESTIMATE, "--cost-table", table], needle, tmp_path)
    with pytest.raises(UserInputError, match="table.json"):
        load_cost_table(table)


def test_search_refuses_a_malformed_cost_table_before_loading(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    table = _file(tmp_path, "table.json", '{"foo": 1}')
    _refused(["search", "--model", str(tmp_path / "nope"), "--cost-table", table,
              "--out", str(tmp_path / "plan.json")], "no measured rows", tmp_path)


def test_a_valid_cost_table_still_loads(tmp_path):
    row = {"m": 1, "n": 2, "k": 3, "choice": "dense+fp8", "median_us": 4.0}
    doc = load_cost_table(_file(tmp_path, "t.json", json.dumps({"rows": [row]})))
    assert doc["rows"] == [row]


@pytest.mark.parametrize("fmt", ["dense+fp7", "2:4+int13", "bogus"])
def test_show_refuses_a_plan_with_an_unknown_format(fmt, tmp_path, monkeypatch):
    plan = json.loads(_PLAN.read_text())
    plan["decisions"][min(plan["decisions"])] = fmt
    path = _file(tmp_path, "plan.json", json.dumps(plan))
    monkeypatch.chdir(tmp_path)
    for extra in ([], ["--json"], ["--layers"]):
        _refused(["show", path, *extra], fmt, tmp_path)


def test_show_still_renders_a_good_plan():
    result = CliRunner().invoke(cli, ["show", str(_PLAN)])
    assert result.exit_code == 0, result.output


def test_estimate_on_a_gguf_names_what_estimate_takes(tmp_path, monkeypatch):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 64)
    monkeypatch.chdir(tmp_path)
    _refused(["estimate", "--model", str(gguf), "--target", "h100"],
             "estimate takes a config (config.json), an HF folder or an alias", tmp_path)


# ---- storage URLs ---------------------------------------------------------------------------

_SECRET = "s3cr@t:pw"


@pytest.mark.parametrize(("url", "pieces"), [
    # an unquoted @ and : in the password: SQLAlchemy cannot parse these
    (f"postgresql://user:{_SECRET}@db.example:5432/optuna", ("s3cr", "t:pw", _SECRET)),
    (f"postgresql://user:{_SECRET}@host:notaport/db", ("s3cr", "t:pw", _SECRET)),
    (f"postgres ql://user:{_SECRET}@host/db", ("s3cr", "t:pw", _SECRET)),
    ("weird://user:hunter2", ("hunter2",)),  # no @: user:password or host:port, hidden
    (f"postgresql://user@host/db?password={_SECRET}&sslmode=require", ("s3cr", "t:pw")),
    ("postgresql://user:s3cr%40t%3Apw@host/db", ("s3cr", "%40t")),  # parsable
])
def test_redact_never_shows_any_part_of_the_password(url, pieces):
    shown = redact(url)
    for piece in pieces:
        assert piece not in shown, shown


def test_unparsable_storage_url_is_one_line_without_the_password():
    with pytest.raises(UserInputError) as info:
        check_storage(f"postgresql://user:{_SECRET}@host:notaport/db")
    assert "s3cr" not in str(info.value) and "\n" not in str(info.value)


def test_postgres_without_its_driver_names_the_extra(monkeypatch):
    # None in sys.modules makes `import psycopg` fail whether or not it is installed here
    monkeypatch.setitem(sys.modules, "psycopg", None)
    url = "postgresql://user:hunter2@localhost:5432/optuna"
    for call in (check_storage, open_storage):
        with pytest.raises(UserInputError, match=r"autoplan\[postgres\]") as info:
            call(url)
        assert "psycopg" in str(info.value) and "hunter2" not in str(info.value)


def test_unknown_database_and_bad_scheme_are_refused():
    with pytest.raises(UserInputError, match="cannot read storage"):
        check_storage("nosuchdb://user@host/db")
    with pytest.raises(UserInputError, match="journal:PATH"):
        check_storage("not-a-url")


def test_journal_check_creates_nothing_and_refuses_a_file_as_folder(tmp_path):
    journal = tmp_path / "new" / "study.journal"
    check_storage(f"journal:{journal}")
    assert not (tmp_path / "new").exists()
    (tmp_path / "afile").write_text("")
    with pytest.raises(UserInputError, match="cannot write the study journal"):
        check_storage(f"journal:{tmp_path / 'afile' / 'study.journal'}")


def test_sqlite_storage_opens(tmp_path):
    check_storage(f"sqlite:///{tmp_path / 'study.db'}")
    assert (tmp_path / "study.db").is_file()


@pytest.mark.parametrize("url", [
    f"postgresql://user:{_SECRET}@host:notaport/db", "nosuchdb://user@host/db", "not-a-url",
    "postgresql+psycopg2://user:hunter2@127.0.0.1:1/optuna",
    "postgresql://user:hunter2@127.0.0.1:1/optuna",  # no server: refused when opened
    "sqlite:///{tmp}/afile/study.db", "journal:{tmp}/afile/study.journal",
])
def test_the_early_storage_check_says_what_opening_it_says(url, tmp_path, monkeypatch):
    """The CLI's check before the search stack (no Optuna) refuses with check_storage's own
    line, and leaves nothing behind."""
    from autoplan.search.storage_url import check_storage_early

    monkeypatch.setitem(sys.modules, "psycopg2", None)
    (tmp_path / "afile").write_text("")
    url = url.format(tmp=tmp_path)
    with pytest.raises(UserInputError) as early:
        check_storage_early(url)
    with pytest.raises(UserInputError) as opened:
        check_storage(url)
    assert str(early.value) == str(opened.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_the_early_storage_check_creates_no_sqlite_file(tmp_path):
    from autoplan.search.storage_url import check_storage_early

    check_storage_early(f"sqlite:///{tmp_path / 'study.db'}")
    check_storage_early(f"journal:{tmp_path / 'new' / 's.journal'}")
    assert list(tmp_path.iterdir()) == []


def test_a_worker_not_waiting_for_a_missing_journal_is_answered_at_once(tmp_path):
    from autoplan.search.run import run_worker
    from autoplan.search.storage_url import check_worker_journal

    url = f"journal:{tmp_path / 'none' / 's.journal'}"
    with pytest.raises(UserInputError) as early:
        check_worker_journal(url, "autoplan-x", 0)
    with pytest.raises(UserInputError) as waited:
        run_worker(url, "autoplan-x", wait_s=0)
    assert str(early.value) == str(waited.value)
    check_worker_journal(url, "autoplan-x", 5)  # told to wait: run_worker waits
    (tmp_path / "none").mkdir()
    (tmp_path / "none" / "s.journal").write_text("")
    check_worker_journal(url, "autoplan-x", 0)  # a journal: run_worker reads it


# ---- search: refused before any work (issue 13 item 1; autoplan/search/preflight.py) --------


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from tests.unit._tiny import save_tiny_folder

    return save_tiny_folder(tmp_path_factory.mktemp("refusals-tiny"))


def _search(model: Path | str, out: Path, *extra: str) -> list[str]:
    return ["search", "--model", str(model), "--out", str(out), "--trials", "5", *extra]


@pytest.mark.parametrize(("extra", "needle"), [
    (["--seed", "-1"], "--seed must be an integer from 0"),
    (["--seed", "4294967296"], "--seed must be an integer from 0"),
    (["--budget", "kl<=inf"], "cannot read budget"),
    (["--budget", "kl<=nan"], "cannot read budget"),
    (["--budget", "kl<=1e999"], "no finite limit"),
    (["--budget", "ppl<=+" + "9" * 400], "no finite limit"),
])
def test_search_arguments_refused_before_the_model_is_looked_up(extra, needle, tmp_path,
                                                                  monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default journal would be created beside --out
    _refused(_search(tmp_path / "nope", tmp_path / "plan.json", *extra), needle, tmp_path)


def test_search_out_must_be_writable_before_the_search(tiny_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("")
    (tmp_path / "adir").mkdir()
    _refused(_search(tiny_model, tmp_path / "afile" / "plan.json"), "is not a folder", tmp_path)
    _refused(_search(tiny_model, tmp_path / "adir"), "it is a folder", tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_search_out_in_a_read_only_folder(tiny_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ro").mkdir(mode=0o555)
    _refused(_search(tiny_model, tmp_path / "ro" / "plan.json"), "is not writable", tmp_path)


@pytest.mark.parametrize(("storage", "needle"), [
    ("postgresql://user:hunter2@127.0.0.1:1/optuna", "autoplan[postgres]"),  # driver missing
    ("postgresql+psycopg2://user:hunter2@127.0.0.1:1/optuna", "psycopg2"),
    ("nosuchdb://user:hunter2@host/db", "cannot read storage"),
    ("sqlite:///{tmp}/afile/study.db", "cannot open storage"),
    ("journal:{tmp}/afile/study.journal", "cannot write the study journal"),
])
def test_search_storage_is_validated_and_opened_first(storage, needle, tiny_model, tmp_path,
                                                      monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "psycopg", None)  # not installed, whatever this venv has
    monkeypatch.setitem(sys.modules, "psycopg2", None)
    (tmp_path / "afile").write_text("")
    url = storage.format(tmp=tmp_path)
    _refused(_search(tiny_model, tmp_path / "plan.json", "--storage", url), needle, tmp_path)
    result = CliRunner().invoke(cli, _search(tiny_model, tmp_path / "p.json", "--storage", url))
    assert "hunter2" not in result.output


def _broken_copy(tiny_model: Path, folder: Path, weights: bytes) -> Path:
    folder.mkdir()
    for f in tiny_model.iterdir():
        if f.suffix != ".safetensors":
            (folder / f.name).write_bytes(f.read_bytes())
    (folder / "model.safetensors").write_bytes(weights)
    return folder


@pytest.mark.parametrize("kind", sorted(DAMAGES))
def test_search_refuses_broken_safetensors_before_loading(kind, tiny_model, tmp_path,
                                                          monkeypatch):
    weights = damage((tiny_model / "model.safetensors").read_bytes(), kind)
    model = _broken_copy(tiny_model, tmp_path / "model", weights)
    monkeypatch.chdir(tmp_path)
    _refused(_search(model, tmp_path / "plan.json"), "not a valid safetensors file", tmp_path)


_TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256}
# (config.json, what the refusal says): architectures the ONNX export does not build, and
# configs of supported ones it cannot reproduce exactly
_NOT_EXPORTED = {
    "gpt_neox": ({"model_type": "gpt_neox", **_TINY}, "supports model_type llama, mistral"),
    "gemma3": ({"model_type": "gemma3", "text_config": {"model_type": "gemma3_text", **_TINY}},
               "not 'gemma3'"),  # the image-text wrapper; gemma3_text is exported
    "llama-dynamic-rope": ({"model_type": "llama", **_TINY, "rope_scaling": {
        "type": "dynamic", "factor": 2.0}}, "'dynamic' RoPE"),
    "embeddinggemma": ({"model_type": "gemma3_text", **_TINY,
                        "use_bidirectional_attention": True}, "bidirectional"),
}


@pytest.mark.parametrize("arch", sorted(_NOT_EXPORTED))
@pytest.mark.parametrize("platform", [["--target", "local", "--runtime", "onnxruntime"],
                                      ["--target", "xeon-8480", "--runtime", "onnxruntime",
                                       "--no-measure-kernels"]])
def test_cpu_search_refuses_an_architecture_the_onnx_export_lacks(arch, platform, tmp_path,
                                                                  monkeypatch):
    """Refused from config.json alone: before loading, profiling or timing kernels, and
    never a plan `autoplan apply` cannot use (the folder holds no weights at all)."""
    model = tmp_path / arch
    model.mkdir()
    config, why = _NOT_EXPORTED[arch]
    (model / "config.json").write_text(json.dumps(config))
    monkeypatch.chdir(tmp_path)
    _refused(_search(model, tmp_path / "plan.json", *platform), why, tmp_path)


@pytest.mark.parametrize("kind", sorted(DAMAGES))
def test_one_safetensors_check_names_each_damage_in_a_file_or_a_folder(kind, tiny_model,
                                                                       tmp_path):
    """The one check search, export and apply call: a whole file and its folder pass; each
    damage is one line naming the file and what is wrong, whether given the file or the
    folder."""
    from autoplan.models.check import check_safetensors

    whole = tiny_model / "model.safetensors"
    check_safetensors(whole)
    check_safetensors(tiny_model)
    check_safetensors(tmp_path / "no-such-folder")  # the resolver reports missing models
    folder = _broken_copy(tiny_model, tmp_path / "model", damage(whole.read_bytes(), kind))
    for target in (folder, folder / "model.safetensors"):
        with pytest.raises(UserInputError, match=DAMAGES[kind]) as err:
            check_safetensors(target)
        assert "model.safetensors" in str(err.value) and "\n" not in str(err.value)




def test_choice_options_are_their_text_enums():
    """Every click.Choice vocabulary is one TextEnum: the CLI lists its values and the library
    refuses anything else with the same one line."""
    from autoplan.cli.profile import command as profile
    from autoplan.cli.search import command as search
    from autoplan.cost.report import Objective
    from autoplan.streaming.runner import Execution, ExecutionSettings

    def choices(command, flag):  # noqa: ANN001, ANN202
        (param,) = [p for p in command.params if flag in p.opts]
        return list(param.type.choices)

    assert choices(search, "--objective") == Objective.values()
    assert choices(search, "--execution") == choices(profile, "--execution") == Execution.values()
    assert ExecutionSettings(execution="STREAM").execution is Execution.STREAM
    with pytest.raises(UserInputError, match="unknown --execution 'disk': use one of auto, "
                       "memory, stream"):
        ExecutionSettings(execution="disk")
    with pytest.raises(UserInputError, match="unknown objective 'speed': use one of throughput"):
        Objective.parse("speed")


@pytest.mark.parametrize("command", [["search", "--target", "h100"], ["profile"],
                                     ["compare", "--targets", "h100"]])
def test_a_bundled_config_name_where_weights_are_needed_says_so(command, tmp_path, monkeypatch):
    """A bundled config has no weights: the one line says which commands take it."""
    monkeypatch.chdir(tmp_path)
    _refused([command[0], "--model", "mixtral-8x7b", *command[1:]],
             "'mixtral-8x7b' is a bundled config, without weights", tmp_path)


def test_profile_dry_run_takes_a_bundled_config_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["profile", "--model", "Qwen3-30B-A3B", "--dry-run",
                                      "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["model"] == "qwen3-30b-a3b"
    oss = CliRunner().invoke(cli, ["profile", "--model", "gpt-oss-20b", "--dry-run", "--device",
                                   "cpu", "--json"])
    doc = json.loads(oss.stdout)  # its bytes count the experts at MXFP4's 4.25 bits: say so
    assert doc["checkpoint_dtype"] == "bfloat16 with MXFP4 experts"
    assert doc["weights_on_disk_bytes"] < 0.7 * doc["params"] * 2
