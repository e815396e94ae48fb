"""A search with KV-cache choices on a tiny Llama: each cache at its own operating point,
the compressed ones measured on long prompts and the long-context check, the best passing
one planned with its deploy command; caches an engine does not serve refused first."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.cost.operating import OperatingRequest
from autoplan.errors import UnsupportedFormatError, UserInputError
from autoplan.formats.kv import KvFormat
from autoplan.plan.io import load_plan
from autoplan.search import SearchRequest, preflight, run_search
from tests.unit._tiny import FAST, WORKLOAD, one_torch_thread, tiny_model_dir  # noqa: F401


def _request(model_dir: Path, out: Path, **kw) -> SearchRequest:  # noqa: ANN003
    args = {"model": str(model_dir), "target": "l40s", "runtime": "vllm",
            "budget": "kl<=0.05", "trials": 100, "out": out, "workload": WORKLOAD,
            "operating": OperatingRequest(8, 64, 16), **FAST}
    return SearchRequest(**(args | kw))


def test_kv_search_plans_the_best_passing_cache(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    plan = run_search(_request(model_dir, out, kv_cache="fp8")).plan
    assert load_plan(out) == plan
    kv = plan.kv_cache
    assert kv is not None and kv.default == "bf16" and not kv.per_layer
    assert [a.format for a in kv.alternatives] == ["bf16", "fp8_e4m3"]
    fp8 = kv.alternatives[1]
    assert fp8.kl_long is not None and fp8.measured_kl is not None and fp8.measured_kl > 0
    assert kv.alternatives[0].kl_long is None  # the runtime's own cache: the original
    if kv.format == "fp8_e4m3":
        assert plan.quality.kl_long is not None and "longctx" in plan.quality.gates
        assert len(kv.scale_digests) == 2  # static per-tensor scales, calibrated per block
        assert kv.bytes_per_token == 2 * 2 * 2 * 16 * 1  # 2 blocks x K,V x 2 heads x 16 x 1 B
        assert "--kv-cache-dtype fp8" in plan.deploy.shell
    assert plan.deploy.settings["batch"] == plan.workload.batch
    assert plan.predicted["baseline"].label == "baseline"


@pytest.mark.parametrize(("runtime", "kv", "needle"), [
    ("vllm", "int8", "serves no int8 KV cache"),
    ("llama.cpp", "q8_0", "head_dim is 16"),
])
def test_a_cache_the_engine_cannot_serve_is_refused_before_any_work(
        model_dir: Path, tmp_path: Path, runtime: str, kv: str, needle: str) -> None:
    target = "xeon-8480" if runtime == "llama.cpp" else "h100-sxm"
    with pytest.raises(UnsupportedFormatError, match=needle):
        preflight(_request(model_dir, tmp_path / "p.json", runtime=runtime, target=target,
                           kv_cache=kv))
    assert not (tmp_path / "p.json").exists()


def test_nvfp4_cache_before_blackwell_names_the_engines_reason(model_dir: Path,
                                                              tmp_path: Path) -> None:
    with pytest.raises(UnsupportedFormatError, match="Blackwell"):
        preflight(_request(model_dir, tmp_path / "p.json", runtime="tensorrt-llm",
                           target="h100-sxm", kv_cache="nvfp4"))


def test_a_per_layer_cache_mix_is_refused_before_any_work(model_dir: Path,
                                                          tmp_path: Path) -> None:
    with pytest.raises(UnsupportedFormatError, match="one KV-cache type for the whole model"):
        preflight(_request(model_dir, tmp_path / "p.json", target="h100-sxm",
                           kv_cache="fp8@0,bf16@1"))
    assert not (tmp_path / "p.json").exists()
    # one format named for every block is that format
    assert preflight(_request(model_dir, tmp_path / "p.json", target="h100-sxm",
                              kv_cache="fp8@0-1")).kv is KvFormat.FP8_E4M3


def test_kv_cache_option_errors() -> None:
    with pytest.raises(UserInputError, match="alone"):
        SearchRequest(kv_cache="auto,fp8")
    with pytest.raises(UserInputError, match="--recover with --kv-cache"):
        from autoplan.recover.settings import RecoverySettings

        SearchRequest(kv_cache="fp8", recovery=RecoverySettings())


def test_show_prints_the_cache_the_alternatives_and_the_deploy_command(
        model_dir: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from autoplan.cli import cli

    out = tmp_path / "plan.json"
    run_search(_request(model_dir, out, kv_cache="fp8", runtime="tensorrt-llm"))
    result = CliRunner().invoke(cli, ["show", str(out)])
    assert result.exit_code == 0, result.output
    text = result.output
    assert "KV cache:" in text and "tried KV fp8_e4m3" in text and "tried KV bf16" in text
    assert "trtllm-serve" in text and "llm_options.yml" in text and "kv_cache_config" in text


def test_no_certificate_when_the_kv_caches_own_kl_exceeds_the_limit() -> None:
    """Every candidate of a KV variant carries the cache's predicted KL; when that alone is
    over the last limit the exact problem has no solution: no certificate, not a crash."""
    from types import SimpleNamespace

    from autoplan.search.stages import certify

    notes = []
    tables = SimpleNamespace(surrogate=lambda picks: 0.03 + 0.01 * sum(picks))
    prep = SimpleNamespace(tables=tables, baseline_picks=(0, 0))
    rounds = SimpleNamespace(calibration=None, limit=0.02, best_searched=None)
    rep = SimpleNamespace(stage=lambda name: None, note=notes.append)
    assert certify(prep, rounds, rep) is None
    assert "no certificate" in notes[0] and "0.03" in notes[0]
