"""The bad-input corpus (issue 13 item 1): one line per case, every command.

Each case is a command line that must be refused cleanly:

- exit 2 (a user mistake) or 1 (a runtime failure), raised on purpose: no uncaught exception,
  so no traceback in a real terminal;
- stderr is exactly one non-empty line, starting with ``error:`` and holding the case's
  needle (the flag or the fix it names), and no secret of a storage URL;
- nothing is left behind: the test's folder (also the working directory, where default
  journals and plans would go) holds the same entries after the call as before;
- no model is loaded: the functions that read weights (``load_model``, the content hash,
  the streamed model, the GGUF conversion's tensor read) raise if called, because every
  refusal here can be made from the arguments, a config or file headers;
- ``ARGS`` cases (detectable from the arguments alone) finish in under 5 s of wall time,
  and no case runs past 60 s (a refusal that regressed into waiting fails, never hangs).

Placeholders in the arguments: ``{tmp}`` (this test's folder), ``{tiny}`` (the tiny model
folder), ``{zero}``, ``{truncated}``, ``{garbage}``, ``{header}``, ``{padded}``, ``{bad}``
(copies of it whose safetensors file is damaged each way of ``_safetensors_damage``); plan
files: ``{plan}`` (a CPU plan of the embedded model), ``{gpu_plan}``, ``{gguf_plan}`` (a
llama.cpp one), ``{fmt_plan}`` (a layer in an unknown format), ``{path_plan}`` (its model id
a local path), ``{gptq_plan}`` (its calibration source a local file), ``{noid_plan}`` (a
minimal plan naming no model), ``{newer_plan}``; config-only folders ``{neox}``,
``{dynrope}`` and ``{cfg}`` (a bare config.json), ``{moe}``, ``{notjson}``, ``{gguf_junk}``,
``{rwkv_gguf}`` (a real GGUF of an architecture transformers cannot read), cost tables
``{ct_obj}``, ``{ct_list}``, ``{ct_ok}``, ``{bad_artifact}``; config folders breaking one field's
rule each (``{cfg_*}``, ``{moe_topk}``), the tiny model under a config that lies
(``{lying}``, ``{lying_blocks}``), serving curves (``{curve_*}``). Per test, ``{tmp}/afile`` is
a file, ``{tmp}/adir`` an empty folder and ``{tmp}/mine`` a folder holding the user's own file.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoplan.cli import cli
from tests.unit._safetensors_damage import DAMAGES, damage

ARGS, FILES = True, False  # detectable from the arguments alone (< 5 s), or from files
_LIMIT_S = 5.0
_HANG_S = 60  # any case: past this it is a hang, not a refusal
_SECRETS = ("hunter2", "s3cr")
_RESULTS = Path(__file__).resolve().parents[2] / "benchmarks/results"
_PLAN = _RESULTS / "cpu_plans/int8_kl0.05.json"
_GGUF_PLAN = _RESULTS / "llamacpp_plans_kl0.1_plan.json"  # a llama.cpp plan (q4_0, q4_1, q5_1)
_BAD_URL = "postgresql://user:s3cr@t:pw@host:notaport/db"  # @ and : unquoted: unparsable
_PG = "postgresql://user:hunter2@127.0.0.1:1/optuna"


@dataclass(frozen=True)
class Case:
    command: str  # the command line after `autoplan`, with placeholders
    code: int
    needle: str
    args_only: bool


def C(command: str, code: int, needle: str, args_only: bool):  # noqa: ANN201, N802
    return pytest.param(Case(command, code, needle, args_only), id=command)


_E = "estimate --model llama-3.1-8b --target h100"
_S = "search --model {tiny} --out {tmp}/plan.json --trials 5"
_SN = "search --model {tmp}/nope --out {tmp}/plan.json --trials 5"  # refused before the lookup
_P = "profile --model {tiny}"
_X = "export {plan} --format onnx --model {tiny} --out {tmp}/art"
_XN = "export {plan} --format onnx --model {tmp}/nope"  # refused before the model lookup
_A = "apply {plan} --model {tiny} --out {tmp}/art"
_B = "bench --model {tiny}"
_F = "fleet --plan {plan} --node xeon-8480"
_FQ = _F + " --p99-ms 1000"
_F1 = _FQ + " --qps 1"
_W = "worker --study autoplan-x --wait 0"
_WJ = "worker --storage journal:{tmp}/s.journal"

CASES = [
    # ---- autoplan itself, targets, probe, validate, engines ----
    C("nosuchcommand", 2, "No such command 'nosuchcommand'", ARGS),
    C("--bogus", 2, "No such option '--bogus'", ARGS),
    C("targets --vendor bogus", 2, "--vendor", ARGS),
    C("targets extra", 2, "unexpected extra argument", ARGS),
    C("probe --bogus", 2, "No such option '--bogus'", ARGS),
    C("probe extra", 2, "unexpected extra argument", ARGS),
    C("validate --bogus", 2, "No such option '--bogus'", ARGS),
    C("engines install nosuchengine", 2, "unknown engine 'nosuchengine'", ARGS),
    C("engines install", 2, "Missing argument 'NAME'", ARGS),
    C("engines --bogus", 2, "No such option '--bogus'", ARGS),
    # ---- estimate ----
    C("estimate --model llama-3.1-8b --target h1000", 2, "Did you mean", ARGS),
    C("estimate --model llama-3.1-8b", 2, "Missing option '--target'", ARGS),
    C("estimate --model {tmp}/nope/config.json --target h100", 2, "no model config", ARGS),
    C("estimate --model {notjson} --target h100", 2, "not valid JSON", FILES),
    C("estimate --model {moe} --target h100", 2, "DeepSeek Sparse Attention", FILES),
    C("estimate --model {gguf_junk} --target h100", 2, "estimate takes a config", FILES),
    C("estimate --model {tmp}/adir --target h100", 2, "has no config.json", FILES),
    C(_E + " --precision fp7", 2, "unknown precision", ARGS),
    C(_E + " --sparsity 3:2", 2, "N:M sparsity", ARGS),
    C(_E + " --runtime nosuchruntime", 2, "unknown runtime 'nosuchruntime'", ARGS),
    C(_E + " --batch -4", 2, "--batch", ARGS),
    C(_E + " --input-len 0", 2, "--input-len", ARGS),
    C(_E + " --batch abc", 2, "--batch must be an integer or 'max'", ARGS),
    C("estimate --model llama-3.1-8b --target a100 --precision fp8", 2, "fp8", ARGS),
    C("estimate --model mixtral-8x7b --target h100 --routing {tmp}/none.json", 2, "no such file",
      FILES),
    C("estimate --model mixtral-8x7b --target h100 --routing {notjson}", 2, "not readable JSON",
      FILES),
    C("estimate --model llama-3.1-8b --target h100 --routing {notjson}", 2, "drop --routing",
      ARGS),
    C(_E + " --precision nvfp4", 2, "fp4", ARGS),
    C(_E + " --price-per-hour -1", 2, "--price-per-hour", ARGS),
    C(_E + " --price-per-hour nan", 2, "--price-per-hour", ARGS),
    C(_E + " --price-per-hour inf", 2, "--price-per-hour", ARGS),
    C(_E + " --cost-table {ct_obj}", 2, "no measured rows", FILES),
    C(_E + " --cost-table {ct_list}", 2, "no measured rows", FILES),
    # ---- profile ----
    C(_P + " --calib-blocks 0", 2, "--calib-blocks", ARGS),
    C(_P + " --seq-len 1", 2, "--seq-len", ARGS),
    C(_P + " --seed -1", 2, "--seed", ARGS),
    C(_P + " --seed 4294967296", 2, "--seed", ARGS),
    C(_P + " --execution disk", 2, "--execution", ARGS),
    C(_P + " --device tpu", 2, "--device 'tpu' is not a device", ARGS),
    C(_P + " --device cuda:99", 2, "--device cuda:99", ARGS),
    C(_P + " --target nosuchgpu", 2, "unknown target 'nosuchgpu'", ARGS),
    C(_P + " --runtime nosuchruntime", 2, "unknown runtime 'nosuchruntime'", ARGS),
    C(_P + " --choices fp7", 2, "unknown precision", ARGS),
    C(_P + " --text {tmp}/no-such-text.txt", 2, "no-such-text.txt", ARGS),
    C(_P + " --text {notjson}", 2, "must end in .txt or .jsonl", FILES),
    C(_P + " --dry-run --gpu-memory nan", 2, "--gpu-memory", ARGS),
    C(_P + " --dry-run --host-memory -1", 2, "--host-memory", ARGS),
    C("profile --model {tmp}/nope", 2, "nope", ARGS),
    C("profile --model {cfg}", 2, "config without weights", FILES),
    C("profile --model {zero}", 2, "too short for a header", FILES),
    C("profile --model {truncated}", 2, "truncated", FILES),
    C("profile --model {rwkv_gguf}", 2, "cannot read GGUF", FILES),
    # ---- search ----
    C(_SN + " --seed -1", 2, "--seed must be an integer from 0", ARGS),
    C(_SN + " --seed 4294967296", 2, "--seed must be an integer from 0", ARGS),
    C(_SN + " --budget kl<=inf", 2, "cannot read budget", ARGS),
    C(_SN + " --budget kl<=nan", 2, "cannot read budget", ARGS),
    C(_SN + " --budget kl<=1e999", 2, "no finite limit", ARGS),
    C(_SN + " --budget ppl<=+" + "9" * 400, 2, "no finite limit", ARGS),
    C(_SN + " --budget fast", 2, "cannot read budget", ARGS),
    C(_SN + " --price-per-hour nan", 2, "--price-per-hour", ARGS),
    C(_SN + " --price-per-hour inf", 2, "--price-per-hour", ARGS),
    C(_SN + " --min-gain -0.1", 2, "--min-gain", ARGS),
    C(_SN + " --min-gain nan", 2, "--min-gain", ARGS),
    C(_SN + " --cost-table {ct_obj}", 2, "no measured rows", FILES),
    C(_SN + " --cost-table {ct_list}", 2, "no measured rows", FILES),
    C(_SN + " --trials 0", 2, "--trials", ARGS),
    C(_SN + " --batch 0", 2, "--batch", ARGS),
    C(_SN + " --objective speed", 2, "--objective", ARGS),
    C(_SN + " --choices fp7", 2, "unknown precision", ARGS),
    C(_SN + " --choices ,", 2, "--choices is empty", ARGS),
    C(_SN + " --measure-kernels --cost-table {ct_ok}", 2, "not both", FILES),
    C(_S + " --target nosuchgpu", 2, "unknown target 'nosuchgpu'", ARGS),
    C(_S + " --runtime nosuchruntime", 2, "unknown runtime 'nosuchruntime'", ARGS),
    C(_S + " --measure-kernels --target h100", 2, "--measure-kernels times", ARGS),
    C(_S + " --device cuda:99", 2, "--device cuda:99", ARGS),
    C(_S + " --text {tmp}/no-such-text.txt", 2, "no-such-text.txt", ARGS),
    C(_S + " --text {notjson}", 2, "must end in .txt or .jsonl", FILES),
    C("search --model {tiny} --out {tmp}/afile/plan.json", 2, "is not a folder", ARGS),
    C("search --model {tiny} --out {tmp}/adir", 2, "it is a folder", ARGS),
    C(_S + " --storage journal:{tmp}/afile/s.journal", 2, "cannot write the study", ARGS),
    C(_S + " --storage sqlite:///{tmp}/afile/study.db", 2, "cannot open storage", ARGS),
    C(_S + " --storage nosuchdb://user:hunter2@host/db", 2, "cannot read storage", ARGS),
    C(_S + " --storage " + _PG, 2, "autoplan[postgres]", ARGS),
    C(_S + " --storage " + _PG.replace("ql:", "ql+psycopg2:"), 2, "psycopg2", ARGS),
    C(_S + " --storage " + _BAD_URL, 2, "cannot read storage", ARGS),
    C("search --model {tmp}/nope --out {tmp}/plan.json", 2, "nope", ARGS),
    C("search --model {zero} --out {tmp}/plan.json", 2, "too short for a header", FILES),
    C("search --model {truncated} --out {tmp}/plan.json", 2, "truncated", FILES),
    C("search --model {garbage} --out {tmp}/plan.json", 2, "header claims", FILES),
    C("search --model {header} --out {tmp}/plan.json", 2, "truncated", FILES),
    C("search --model {padded} --out {tmp}/plan.json", 2, "bytes follow", FILES),
    C("search --model {bad} --out {tmp}/plan.json", 2, "invalid shape, data type", FILES),
    C("search --model {cfg} --out {tmp}/plan.json", 2, "config without weights", FILES),
    C("search --model {rwkv_gguf} --out {tmp}/plan.json", 2, "cannot read GGUF", FILES),
    C("search --model {neox} --target local --runtime onnxruntime", 2, "ONNX export", FILES),
    C("search --model {dynrope} --target xeon-8480 --runtime onnxruntime", 2, "ONNX export", FILES),
    # ---- compare ----
    C("compare --model {tiny} --targets h1000 --out {tmp}/cmp", 2, "unknown target 'h1000'", ARGS),
    C("compare --model {tiny} --targets local --trials 0 --out {tmp}/cmp", 2, "--trials", ARGS),
    C("compare --model {tiny} --targets local --seed -1 --out {tmp}/cmp", 2, "--seed", ARGS),
    C("compare --model {tiny} --targets local --out {tmp}/afile/cmp", 2, "not a folder", ARGS),
    C("compare --model {zero} --targets local --out {tmp}/cmp", 2, "too short for a header",
      FILES),
    C("compare --model {tiny}", 2, "Missing option '--targets'", ARGS),
    # ---- report ----
    C("report {tmp}/no-plan.json --out {tmp}/r.html", 2, "no-plan.json", ARGS),
    C("report {notjson} --out {tmp}/r.html", 2, "not valid JSON", FILES),
    C("report {plan} --out {tmp}/afile/r.html", 2, "not a folder", ARGS),
    C("report {fmt_plan} --out {tmp}/r.html", 2, "dense+fp7", FILES),
    # ---- show ----
    C("show {fmt_plan}", 2, "dense+fp7", FILES),
    C("show {fmt_plan} --json", 2, "dense+fp7", FILES),
    C("show {fmt_plan} --layers", 2, "dense+fp7", FILES),
    C("show {tmp}/no-plan.json", 2, "no plan file", ARGS),
    C("show {notjson}", 2, "not valid JSON", FILES),
    C("show {newer_plan}", 2, "upgrade autoplan", FILES),
    C("show {tmp}/adir", 2, "adir", ARGS),
    # ---- apply ----
    C("apply {plan} --model {tmp}/nope --out {tmp}/afile/art", 2, "not a folder", ARGS),
    C("apply {plan} --model {tiny} --out {tmp}/mine", 2, "not an autoplan export", FILES),
    C("apply {plan} --model {zero} --out {tmp}/art", 2, "too short for a header", FILES),
    C("apply {plan} --model {garbage} --out {tmp}/art", 2, "header claims", FILES),
    C("apply {plan} --model {padded} --out {tmp}/art", 2, "bytes follow", FILES),
    C("apply {plan} --model {rwkv_gguf} --out {tmp}/art", 2, "cannot read GGUF", FILES),
    C("apply {path_plan} --out {tmp}/art", 2, "pass --model", FILES),
    C("apply {gptq_plan} --model {tiny} --out {tmp}/art", 2, "pass --calibration", FILES),
    C("apply {fmt_plan} --model {tiny} --out {tmp}/art", 2, "dense+fp7", FILES),
    C("apply {tmp}/no-plan.json --model {tiny} --out {tmp}/art", 2, "no plan file", ARGS),
    C("apply {plan} --model {tiny}", 2, "Missing option '--out'", ARGS),
    C(_A + " --calib-batch 0", 2, "--calib-batch", ARGS),
    C(_A + " --seed 4294967296", 2, "--seed must be an integer from 0", ARGS),
    # ---- export ----
    C(_XN + " --out {tmp}/afile/art", 2, "not a folder", ARGS),
    C(_XN.replace("onnx", "bogus") + " --out {tmp}/art", 2, "unknown export format", ARGS),
    C("export {plan} --format onnx --model {tiny} --out {tmp}/mine", 2, "not an autoplan", FILES),
    C("export {plan} --format onnx --model {truncated} --out {tmp}/art", 2, "truncated", FILES),
    C("export {path_plan} --format onnx --out {tmp}/art", 2, "pass --model", FILES),
    C("export {gguf_plan} --format gguf --model {tiny} --out {tmp}/art", 2, "from a GGUF", FILES),
    C(_X.replace("onnx", "compressed-tensors"), 2, "cannot serve", FILES),
    C(_X.replace("{plan}", "{fmt_plan}"), 2, "dense+fp7", FILES),
    C(_X.replace("{plan}", "{gptq_plan}"), 2, "pass --calibration", FILES),
    C(_X + " --calibration {tmp}/no.txt", 2, "--calibration", ARGS),
    C(_X + " --seq-len 1", 2, "--seq-len", ARGS),
    C(_X + " --seed -1", 2, "--seed", ARGS),
    C(_X + " --n-calib 0", 2, "--n-calib", ARGS),
    # ---- bench ----
    C(_B + " --threads -1", 2, "--threads", ARGS),
    C(_B + " --requests 0", 2, "--requests", ARGS),
    C(_B + " --concurrency 0", 2, "--concurrency", ARGS),
    C(_B + " --input-len 0", 2, "--input-len", ARGS),
    C(_B + " --output-len -1", 2, "--output-len", ARGS),
    C(_B + " --plan {plan} --artifact {tmp}/adir", 2, "not both", ARGS),
    C(_B + " --plan {gpu_plan}", 2, "--target local", FILES),
    C(_B + " --plan {gptq_plan}", 2, "pass --calibration", FILES),
    C(_B + " --plan {tmp}/no-plan.json", 2, "no plan file", ARGS),
    C(_B + " --artifact {tmp}/no-artifact", 2, "no-artifact", ARGS),
    C(_B + " --artifact {tmp}/adir", 2, "is not a CPU artifact", FILES),
    C(_B + " --artifact {tmp}/afile", 2, "is not a CPU artifact", FILES),
    C(_B + " --artifact {bad_artifact}", 2, "is not an autoplan CPU manifest", FILES),
    C("recover {tmp}/nope.json", 2, "no plan file", ARGS),
    C("recover {plan} --recover-steps 0", 2, "--recover-steps", ARGS),
    C("recover {plan} --recover-lr nan", 2, "--recover-lr", ARGS),
    C("recover {plan} --method lora --recover-rank 0", 2, "--recover-rank", ARGS),
    C("recover {plan} --method bogus", 2, "'--method'", ARGS),
    C("recover {plan} --recover-text {tmp}/nope.txt", 2, "--recover-text", ARGS),
    C("recover {plan} --out {tmp}/afile/x.json", 2, "is not a folder", ARGS),
    C("recover {plan} --recover-seq-len 0", 2, "--recover-seq-len", ARGS),
    C("recover {plan} --lm-eval-limit 0", 2, "--lm-eval-limit", ARGS),
    C("bench --model {zero}", 2, "too short for a header", FILES),
    C("bench", 2, "Missing option '--model'", ARGS),
    # ---- fleet ----
    C(_FQ + " --qps nan", 2, "--qps", ARGS),
    C(_FQ + " --qps inf", 2, "--qps", ARGS),
    C(_FQ + " --qps 0", 2, "--qps", ARGS),
    C(_FQ + " --qps abc", 2, "--qps", ARGS),
    C(_F + " --qps 1 --p99-ms nan", 2, "--p99-ms", ARGS),
    C(_F1 + " --max-replicas -1", 2, "--max-replicas", ARGS),
    C(_F1 + " --batch 0", 2, "--batch", ARGS),
    C(_F1.replace("xeon-8480", "nosuchnode"), 2, "unknown target 'nosuchnode'", ARGS),
    C(_F1.replace("{plan}", "{tmp}/no-plan.json"), 2, "no plan file", ARGS),
    C(_F1.replace("{plan}", "{noid_plan}"), 2, "pass --model", FILES),
    C(_F1.replace("{plan}", "{fmt_plan}"), 2, "dense+fp7", FILES),
    C(_F1.replace("{plan}", "{newer_plan}"), 2, "upgrade autoplan", FILES),
    C(_F1.replace("{plan}", "{deep}"), 2, "JSON nested too deeply", FILES),
    C(_F1 + " --measured {deep}", 2, "nested too deeply to read", FILES),
    C("estimate --model llama-3.1-8b --target h100 --cost-table {deep}", 2,
      "nested too deeply to read", FILES),
    C(_F + " --qps 1", 2, "Missing option '--p99-ms'", ARGS),
    # ---- worker ----
    C(_W + " --storage nosuchdb://user:hunter2@host/db", 2, "cannot read storage", ARGS),
    C(_W + " --storage journal:{tmp}/afile/s.journal", 2, "cannot write the study", ARGS),
    C(_W + " --storage " + _PG, 2, "autoplan[postgres]", ARGS),
    C(_W + " --storage " + _BAD_URL, 2, "cannot read storage", ARGS),
    C(_W + " --storage journal:{tmp}/none/s.journal", 2, "no search named autoplan-x", ARGS),
    C(_W + " --storage journal:{tmp}/s.journal --device tpu", 2, "--device 'tpu'", ARGS),
    C(_WJ + " --study x --wait -1", 2, "--wait", ARGS),
    C(_WJ + " --study x --wait nan", 2, "--wait", ARGS),
    C(_WJ, 2, "Missing option '--study'", ARGS),
    # ---- issue 29: configs that lie, the baseline that does not fit, unwritable folders,
    # plans and curves from elsewhere ----
    C("estimate --model {cfg_heads0} --target h100", 2, "num_attention_heads must be", FILES),
    C("profile --model {cfg_heads0} --dry-run", 2, "num_attention_heads must be", FILES),
    C("estimate --model {cfg_kv3} --target h100", 2, "not a multiple of num_key_value_heads",
      FILES),
    C("estimate --model {cfg_split} --target h100", 2, "not divisible by num_attention_heads",
      FILES),
    C("profile --model {cfg_vocab} --dry-run", 2, "vocab_size must be an integer", FILES),
    C("estimate --model {cfg_float} --target h100", 2, "hidden_size must be an integer", FILES),
    C("estimate --model {cfg_rope} --target h100", 2, "rope_theta must be", FILES),
    C("profile --model {cfg_headdim} --dry-run", 2, "rotary dimension", FILES),
    C("estimate --model {cfg_layers} --target h100", 2, "num_hidden_layers must be", FILES),
    C("estimate --model {cfg_missing} --target h100", 2, "lacks required key 'vocab_size'",
      FILES),
    C("estimate --model {moe_topk} --target h100", 2, "num_experts_per_tok", FILES),
    C("search --model {lying} --out {tmp}/plan.json", 2, "[vocab_size, hidden_size]", FILES),
    C("profile --model {lying_blocks}", 2, "the checkpoint has no", FILES),
    C("bench --model {lying}", 2, "[vocab_size, hidden_size]", FILES),
    C("estimate --model llama-3.1-70b --target h100 --precision fp8 --batch max "
      "--input-len 400000", 2, "nothing fits on h100-sxm", ARGS),
    C("search --model {tiny} --out /proc/nope/plan.json", 2, "cannot write the plan", ARGS),
    C(_S + " --storage journal:/proc/nope/s.journal", 2, "cannot write the study journal",
      ARGS),
    C("recover {plan} --out /proc/nope/x.json", 2, "cannot write the plan", ARGS),
    C(_F1.replace("{plan}", "{gpu_plan}"), 2, "cannot run 211 planned layer(s)", FILES),
    C(_F1 + " --measured {curve_vllm}", 2, "curve is vllm's", FILES),
    C(_F1.replace("{plan}", "{gguf_plan}").replace("xeon-8480", "local")
      + " --measured {curve_foreign}", 2, "measured on another machine", FILES),
    C(_F1.replace("{plan}", "{gguf_plan}").replace("xeon-8480", "local")
      + " --measured {curve_nomachine}", 2, "does not record the machine", FILES),
    C(_F1.replace("{plan}", "{gguf_plan}") + " --measured {curve_here}", 2,
      "not --node xeon-8480", FILES),
    C("estimate --model llama-3.1-8b --target h100 --tpot-ms 0.001", 2,
      "no batch meets the SLO", ARGS),
    C("compare --model {tiny} --targets h100,nope --out {tmp}/cmp", 2, "unknown target 'nope'",
      ARGS),
]


# ---- inputs -----------------------------------------------------------------------------
_TINY_CFG = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
             "vocab_size": 256}


def _config_folder(root: Path, name: str, config: dict) -> str:
    (root / name).mkdir()
    (root / name / "config.json").write_text(json.dumps(config))
    return str(root / name)


def _damaged_copy(tiny: Path, folder: Path, kind: str) -> str:
    folder.mkdir()
    for f in tiny.iterdir():
        data = f.read_bytes()
        (folder / f.name).write_bytes(damage(data, kind) if f.suffix == ".safetensors" else data)
    return str(folder)


def _gguf(path: Path, arch: str) -> str:
    """A real (tiny) GGUF file of architecture ``arch`` (one for which transformers has no
    GGUF reader, so autoplan cannot convert it)."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(16)
    w.add_feed_forward_length(32)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_key_length(8)
    w.add_value_length(8)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("llama")
    w.add_token_list([b"<pad>", b"a", b"b"])
    w.add_token_scores([0.0, 0.0, 0.0])
    w.add_token_types([1, 1, 1])
    w.add_tensor("token_embd.weight", np.zeros((3, 16), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> dict[str, str]:
    """The inputs every case may name, built once (none is written by a case)."""
    from tests.unit._tiny import shared_dirs

    tiny, cache = shared_dirs(tmp_path_factory)
    return build_inputs(tmp_path_factory.mktemp("corpus-inputs"), tiny, cache)


def build_inputs(root: Path, tiny: Path, cache: Path) -> dict[str, str]:
    """Every placeholder's file in `root` (benchmarks/cli_latency.py builds them too)."""
    plan = json.loads(_PLAN.read_text())
    plans = {"plan": plan,
             "gpu_plan": {**plan, "target": {**plan["target"], "name": "h100-sxm"},
                          "runtime": {"name": "vllm", "version": "test"},
                          "decisions": dict.fromkeys(plan["decisions"], "dense+fp8_e4m3")},
             "fmt_plan": {**plan, "decisions": {**plan["decisions"],
                                                min(plan["decisions"]): "dense+fp7"}},
             "path_plan": {**plan, "model": {**plan["model"], "id": str(tiny)}},
             "noid_plan": {"decisions": plan["decisions"]},
             "newer_plan": {**plan, "schema_version": 99},
             "gguf_plan": json.loads(_GGUF_PLAN.read_text()),
             # GPTQ weights depend on the calibration text, which names a local file
             "gptq_plan": {**plan, "compression": {**plan["compression"], "quant_method": "gptq"},
                           "audit": {**plan["audit"],
                                     "calibration_source": str(tiny / "config.json")}}}
    paths = {"tiny": str(tiny), "cache": str(cache)}
    for name, doc in plans.items():
        (root / f"{name}.json").write_text(json.dumps(doc))
        paths[name] = str(root / f"{name}.json")
    for kind in DAMAGES:  # {zero}, {truncated}, {garbage}, {header}, {padded}, {bad}
        paths[kind.split("-")[0]] = _damaged_copy(tiny, root / kind, kind)
    # plannable, but not by autoplan's ONNX export: an architecture it does not build, and
    # RoPE whose frequencies depend on the longest sequence seen so far
    paths["neox"] = _config_folder(root, "neox", {"model_type": "gpt_neox", **_TINY_CFG})
    paths["dynrope"] = _config_folder(root, "dynrope", {
        "model_type": "llama", "rope_scaling": {"rope_type": "dynamic", "factor": 2.0},
        **_TINY_CFG})
    paths["cfg"] = _config_folder(root, "cfg", {"model_type": "llama", **_TINY_CFG}) \
        + "/config.json"
    moe = {"model_type": "deepseek_v32", "n_routed_experts": 8, "kv_lora_rank": 16, **_TINY_CFG}
    for name, text in (("moe.json", json.dumps(moe)), ("notjson.json", "{not json"),
                       ("deep.json", "[" * 100_000 + "]" * 100_000),
                       ("ct_obj.json", '{"foo": 1}'), ("ct_list.json", "[]"),
                       ("ct_ok.json", json.dumps({"rows": [
                           {"m": 1, "n": 2, "k": 3, "choice": "dense+fp8",
                            "median_us": 4.0}]}))):
        (root / name).write_text(text)
        paths[name.removesuffix(".json")] = str(root / name)
    (root / "model.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 64)
    paths["gguf_junk"] = str(root / "model.gguf")
    paths["rwkv_gguf"] = _gguf(root / "rwkv-tiny.gguf", "rwkv6")
    (root / "bad-artifact").mkdir()
    (root / "bad-artifact" / "manifest.json").write_text("{not json")
    paths["bad_artifact"] = str(root / "bad-artifact")
    llama = {"model_type": "llama", **_TINY_CFG}
    for name, change in (("cfg_heads0", {"num_attention_heads": 0}),
                         ("cfg_kv3", {"num_key_value_heads": 3}),
                         ("cfg_split", {"hidden_size": 66, "head_dim": None}),
                         ("cfg_vocab", {"vocab_size": 2**40}),
                         ("cfg_float", {"hidden_size": 64.5}),
                         ("cfg_rope", {"rope_theta": -1.0}),
                         ("cfg_headdim", {"head_dim": 15}),
                         ("cfg_layers", {"num_hidden_layers": -2}),
                         ("cfg_missing", {"vocab_size": None})):
        cfg = {k: v for k, v in {**llama, **change}.items() if v is not None}
        paths[name] = _config_folder(root, name, cfg)
    paths["moe_topk"] = _config_folder(root, "moe_topk", {
        **_TINY_CFG, "model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 0,
        "moe_intermediate_size": 32})
    # the tiny model's weights under a config that lies (vocab; blocks)
    for name, change in (("lying", {"vocab_size": 300}), ("lying_blocks", {"num_hidden_layers": 3})):
        folder = root / name
        folder.mkdir()
        for f in tiny.iterdir():
            (folder / f.name).write_bytes(f.read_bytes())
        cfg = json.loads((tiny / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**cfg, **change}))
        paths[name] = str(folder)
    # capacity curves: vLLM's (this machine), another machine's, none recorded, llama.cpp's here
    from autoplan.fleet_measured import this_machine

    point = {"request_rate": 1.0, "request_throughput": 1.0, "ttft_p99_ms": 100.0,
             "tpot_p99_ms": 10.0}
    curves = {"curve_vllm": {"sides": {"baseline": {"points": [point]},
                                       "plan": {"points": [point]}}},
              "curve_foreign": {"serving": {"original": {"points": [point]},
                                            "plan": {"points": [point]}},
                                "machine": {"cpu": "Another CPU", "cores": 999}},
              "curve_nomachine": {"serving": {"original": {"points": [point]},
                                              "plan": {"points": [point]}}},
              "curve_here": {"serving": {"original": {"points": [point]},
                                         "plan": {"points": [point]}}}}
    for name, doc in curves.items():
        doc = {"workload": {"input_len": 512, "output_len": 128}, **doc}
        if name in ("curve_vllm", "curve_here"):
            doc["machine"] = this_machine()
        (root / f"{name}.json").write_text(json.dumps(doc))
        paths[name] = str(root / f"{name}.json")
    return paths


class _ModelLoaded(Exception):  # noqa: N818 - not an autoplan error: the CLI must not catch it
    pass


@pytest.fixture()
def no_model_loads(monkeypatch) -> list[str]:
    """Make every function that reads a model's weights raise (and record its name)."""
    import autoplan.models
    import autoplan.models.gguf_convert
    import autoplan.models.loader
    import autoplan.streaming.runner
    import autoplan.streaming.skeleton

    calls: list[str] = []

    def refuse(name: str):  # noqa: ANN202
        def never(*_a, **_k):  # noqa: ANN202
            calls.append(name)
            raise _ModelLoaded(f"{name} was called: the refusal came after loading the model")
        return never

    for module, attr in ((autoplan.models, "load_model"), (autoplan.models.loader, "load_model"),
                         (autoplan.streaming.runner, "load_model"),
                         (autoplan.models.loader, "weights_hash"),
                         (autoplan.streaming.skeleton, "StreamedModel"),
                         (autoplan.models.gguf_convert, "_convert_into")):
        monkeypatch.setattr(module, attr, refuse(f"{module.__name__}.{attr}"))
    return calls


@contextlib.contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    """Raise TimeoutError in the command after ``seconds`` (CliRunner records it as the
    result's exception, so the case fails)."""
    def expire(*_a) -> None:  # noqa: ANN002
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_early_and_leaves_nothing(case, shared, no_model_loads, tmp_path,
                                                        monkeypatch):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("the user's own file")
    monkeypatch.chdir(tmp_path)  # default journals and plans land here
    monkeypatch.setenv("AUTOPLAN_CACHE", shared["cache"])
    # whatever this venv has: the storage cases see the drivers missing
    monkeypatch.setitem(sys.modules, "psycopg", None)
    monkeypatch.setitem(sys.modules, "psycopg2", None)
    args = [a.format(tmp=tmp_path, **shared) for a in shlex.split(case.command)]
    before = _tree(tmp_path)

    t0 = time.perf_counter()
    with _deadline(_HANG_S):  # a refusal that regresses into waiting fails, never hangs
        result = CliRunner().invoke(cli, args)
    wall = time.perf_counter() - t0

    assert not no_model_loads, f"{no_model_loads}: refused only after loading the model"
    assert result.exit_code == case.code, result.output
    assert isinstance(result.exception, SystemExit), (
        f"uncaught {type(result.exception).__name__}: {result.exception}")
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("error:"), lines[0]
    assert case.needle in lines[0], lines[0]
    for secret in _SECRETS:
        assert secret not in result.output
    assert _tree(tmp_path) == before, "the refusal left files behind"
    if case.args_only:
        assert wall < _LIMIT_S, f"{wall:.1f} s for a mistake the arguments show"


def test_the_corpus_covers_every_command():
    from autoplan.cli import cli as group

    commands = {shlex.split(c.values[0].command)[0] for c in CASES}
    assert set(group.commands) <= commands, set(group.commands) - commands
    assert len(CASES) >= 60
