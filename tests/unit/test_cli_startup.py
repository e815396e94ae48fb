"""The CLI answers `--help` and argument errors without importing the stack: commands are
imported when they run (autoplan/cli/__init__.py), packages export lazily (autoplan/lazy.py),
and each command checks its arguments before importing torch, transformers or Optuna.
How fast that is, is measured by benchmarks/cli_latency.py, not here."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

from autoplan.cli import COMMANDS, cli

HEAVY = ("torch", "transformers", "optuna", "onnx", "onnxruntime", "scipy", "numpy")
_PROBE = """
import json, sys
from autoplan.cli import cli
try:
    cli.main(args=sys.argv[1:], prog_name="autoplan", standalone_mode=True)
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "loaded": sorted(m for m in %r if m in sys.modules)}))
""" % (HEAVY,)


def _run(*args: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True,
                          text=True, check=False, timeout=120)
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("args", [
    ("--help",), ("search", "--help"), ("nosuchcommand",),
    ("search", "--target", "nope"), ("show", "missing.json"),
    ("estimate", "--model", "llama-3.1-8b", "--target", "h100", "--precision", "fp7"),
    ("compare", "--targets", "h1000"), ("bench", "--model", "x", "--threads", "-1"),
    ("fleet", "--plan", "p.json", "--node", "h100", "--qps", "nan", "--p99-ms", "1"),
    ("profile", "--model", "x", "--seed", "-1"), ("profile", "--model", "x", "--seq-len", "1"),
    ("profile", "--model", "x", "--device", "tpu"), ("profile", "--target", "nosuchgpu"),
    ("search", "--choices", "fp7"), ("search", "--choices", ","),
    ("search", "--min-gain", "nan"), ("search", "--price-per-hour", "inf"),
    ("search", "--runtime", "nosuchruntime"), ("profile", "--model", "no/such/model"),
    ("profile", "--choices", "fp7"), ("profile", "--text", "no-such-text.txt"),
    ("search", "--text", "no-such-text.txt"), ("search", "--measure-kernels", "--target", "h100"),
    ("search", "--storage", "journal:/proc/nope/s.journal"),
    ("worker", "--study", "x", "--storage", "journal:/proc/nope/s.journal"),
    ("worker", "--study", "x", "--storage", "journal:s.journal", "--device", "tpu"),
    ("recover", "no-such-plan.json"), ("bench", "--model", "x", "--plan", "no-such-plan.json"),
], ids=lambda a: " ".join(a))
def test_help_and_argument_errors_import_no_heavy_library(args):
    got = _run(*args)
    assert got["code"] in (0, 2), got
    assert got["loaded"] == [], f"{' '.join(args)} imported {got['loaded']}"


# The argument-only cases of tests/unit/test_bad_input_corpus.py whose check once came after
# the stack loaded (torch, Optuna, SQLAlchemy, the export package: 2-5 s): each is answered
# from the arguments, a file's existence or a light parse. {tiny} is the tiny model folder,
# {plan} a committed CPU plan, {tmp} the test's own folder (also the working directory).
_PLAN = Path(__file__).resolve().parents[2] / "benchmarks/results/cpu_plans/int8_kl0.05.json"
_S = "search --model {tiny} --out {tmp}/plan.json --trials 5"
CORPUS = [
    "estimate --model llama-3.1-8b --target a100 --precision fp8",
    "estimate --model llama-3.1-8b --target h100 --precision nvfp4",
    ("estimate --model llama-3.1-70b --target h100 --precision fp8 --batch max "
     "--input-len 400000"),
    "estimate --model llama-3.1-8b --target h100 --tpot-ms 0.001",
    "profile --model {tiny} --device cuda:99",
    _S + " --device cuda:99",
    _S + " --storage sqlite:///{tmp}/afile/study.db",
    _S + " --storage nosuchdb://user:hunter2@host/db",
    _S + " --storage postgresql://user:hunter2@127.0.0.1:1/optuna",
    _S + " --storage postgresql+psycopg2://user:hunter2@127.0.0.1:1/optuna",
    _S + " --storage postgresql://user:s3cr@t:pw@host:notaport/db",
    "worker --study autoplan-x --wait 0 --storage nosuchdb://user:hunter2@host/db",
    "worker --study autoplan-x --wait 0 --storage postgresql://user:hunter2@127.0.0.1:1/optuna",
    "worker --study autoplan-x --wait 0 --storage postgresql://user:s3cr@t:pw@host:notaport/db",
    "worker --study autoplan-x --wait 0 --storage journal:{tmp}/none/s.journal",
    "apply {plan} --model {tmp}/nope --out {tmp}/afile/art",
    "apply {tmp}/no-plan.json --model {tiny} --out {tmp}/art",
    "export {plan} --format bogus --model {tmp}/nope --out {tmp}/art",
    "export {plan} --format onnx --model {tiny} --out {tmp}/art --calibration {tmp}/no.txt",
    "bench --model {tiny} --artifact {tmp}/no-artifact",
    "search --model {tmp}/nope --out {tmp}/plan.json",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    from tests.unit._tiny import shared_dirs

    return str(shared_dirs(tmp_path_factory)[0])


@pytest.mark.parametrize("command", CORPUS)
def test_the_corpus_argument_errors_import_no_heavy_library(command, tiny, tmp_path,
                                                            monkeypatch):
    if "cuda" in command:
        from autoplan.streaming.device import gpu_may_exist

        if gpu_may_exist():
            pytest.skip("a GPU driver is here: whether cuda:99 exists is torch's answer")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    got = _run(*[a.format(tmp=tmp_path, tiny=tiny, plan=_PLAN) for a in shlex.split(command)])
    assert got["code"] == 2, got
    assert got["loaded"] == [], f"{command} imported {got['loaded']}"


def test_the_command_list_is_each_commands_own_help():
    """`autoplan --help` lists COMMANDS without importing the commands: each line must be
    the command's own first sentence."""
    assert set(COMMANDS) == set(cli.list_commands(click.Context(cli)))
    for name, text in COMMANDS.items():
        command = cli.get_command(click.Context(cli), name)
        first = click.Command(None, help=command.help).get_short_help_str(500)
        assert first == click.Command(None, help=text).get_short_help_str(500), name


def test_the_torch_free_format_facts_are_the_built_in_specs():
    """`Precision.info` answers from autoplan/formats/info.py without building the specs
    (torch); every built-in spec must carry exactly that entry, and the table's bits must
    match what the torch side stores (GGUF block sizes, ONNX MatMulNBits bits and blocks)."""
    from autoplan.formats import Precision, format_spec, registered_formats
    from autoplan.formats.gguf_blocks import GGUF, BlockFormat
    from autoplan.formats.info import BUILTIN_INFO

    builtin = {s.name for s in registered_formats()
               if s.weight.__module__ == "autoplan.formats.builtin"}
    assert set(BUILTIN_INFO) == builtin
    for name, info in BUILTIN_INFO.items():
        spec = format_spec(name)
        assert spec.info == info and Precision(name).info == info, name
        block = spec.other.get(GGUF)
        if isinstance(block, BlockFormat):  # bytes per block of 32 -> bits per weight
            assert block.bits == info.value_bits and block.type_size * 8 / 32 == pytest.approx(
                info.weight_bits), name
        if getattr(spec.onnx, "op", None) == "MatMulNBits":
            assert spec.onnx.bits == info.value_bits, name
            assert info.group in (0, spec.onnx.block), name


def test_the_clis_export_format_names_are_the_registrys():
    from autoplan.cli._export_options import EXPORT_FORMATS
    from autoplan.export import exporter_names

    assert sorted(EXPORT_FORMATS) == exporter_names()


def test_the_kv_registrys_torch_free_constants_agree_with_the_numerics():
    from autoplan.formats import elements, gguf_blocks, kv

    assert kv.GGUF_BLOCK == gguf_blocks.BLOCK and kv.E4M3_MAX == elements.E4M3_MAX
