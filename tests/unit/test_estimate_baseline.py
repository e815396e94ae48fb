"""`estimate`'s baseline is the uncompressed format the runtime serves on the target."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from autoplan.cli import cli


@pytest.mark.parametrize("runtime, precision, baseline", [
    ("onnxruntime", "int8a8_g128", "dense+fp32"),  # ORT has no fast BF16 CPU kernel
    ("onnxruntime", None, "dense+fp32"),  # nothing asked: the runtime's own format
    ("llama.cpp", "q8_0", "dense+bf16"),  # GGUF BF16 on a CPU with BF16 math (AMX)
    ("vllm", "int8", "dense+bf16"),
])
def test_the_baseline_is_a_format_the_runtime_serves(runtime: str, precision: str | None,
                                                     baseline: str) -> None:
    args = ["estimate", "--model", "smollm2-135m", "--target", "xeon-8480", "--runtime",
            runtime, "--json", *(["--precision", precision] if precision else [])]
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["baseline"]["baseline"] == baseline
    assert doc["choice"] == (f"dense+{precision}" if precision else baseline)
