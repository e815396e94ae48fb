"""User mistakes give exit code 2 and one line on stderr, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoplan.cli import cli

_BASE = ["estimate", "--model", "llama-3.1-8b", "--target", "h100"]


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _cases(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    moe = {"model_type": "deepseek_v32", "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 2, "num_attention_heads": 4, "n_routed_experts": 8,
           "kv_lora_rank": 16, "vocab_size": 100}
    return {
        "unknown target": (["estimate", "--model", "llama-3.1-8b", "--target", "h1000"],
                           "Did you mean"),
        "missing file": (["estimate", "--model", str(tmp_path / "nope" / "config.json"),
                          "--target", "h100"], "no model config"),
        "non-JSON config": (["estimate", "--model", _write(tmp_path, "bad.json", "{not json"),
                             "--target", "h100"], "not valid JSON"),
        "MoE config": (["estimate", "--model", _write(tmp_path, "moe.json", json.dumps(moe)),
                        "--target", "h100"], "DeepSeek Sparse Attention"),
        "bad precision": ([*_BASE, "--precision", "fp7"], "unknown precision"),
        "bad sparsity": ([*_BASE, "--sparsity", "3:2"], "N:M sparsity"),
        "negative batch": ([*_BASE, "--batch", "-4"], "--batch"),
        "fp8 on a100": (["estimate", "--model", "llama-3.1-8b", "--target", "a100",
                         "--precision", "fp8"], "fp8"),
        "fp4 on h100": ([*_BASE, "--precision", "nvfp4"], "fp4"),
        "negative price": ([*_BASE, "--price-per-hour", "-1"], "--price-per-hour"),
    }


@pytest.mark.parametrize("case", ["unknown target", "missing file", "non-JSON config",
                                  "MoE config", "bad precision", "bad sparsity",
                                  "negative batch", "fp8 on a100", "fp4 on h100",
                                  "negative price"])
def test_user_mistake_exits_2_with_one_line(case: str, tmp_path: Path) -> None:
    args, needle = _cases(tmp_path)[case]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert not isinstance(result.exception, (TypeError, ValueError, KeyError))
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("error:") and needle in lines[0]


def test_unknown_target_lists_known_names() -> None:
    result = CliRunner().invoke(cli, ["estimate", "--model", "llama-3.1-8b", "--target", "h1000"])
    assert "Known:" in result.stderr and "h100-sxm" in result.stderr


def test_estimate_prints_predicted_and_json() -> None:
    result = CliRunner().invoke(cli, [*_BASE, "--precision", "fp8", "--batch", "8"])
    assert result.exit_code == 0, result.output
    assert "PREDICTED" in result.stdout
    result = CliRunner().invoke(cli, [*_BASE, "--precision", "fp8", "--json", "--breakdown"])
    doc = json.loads(result.stdout)
    assert doc["predicted"] is True and doc["speedup"]["decode_tokens_per_s"] > 1
    assert len(doc["candidate"]["layers"]) == 32 * 7 + 1


def test_validate_command_json() -> None:
    result = CliRunner().invoke(cli, ["validate", "--json"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["mape"] < 0.25
