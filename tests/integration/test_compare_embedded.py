"""`autoplan compare` and `autoplan report` on the embedded model: an NVIDIA and an AMD
target (vLLM), one profile, verifications shared, plans that meet the budget as measured, a
report with every plot. (The CPU side of compare is covered on the tiny model: verifying
ONNX Runtime's int8-activation formats on the embedded model takes minutes on 2 cores.)
Uses the shared cache (the converted model and profile are reused across runs)."""

from __future__ import annotations

import re

import pytest

from autoplan.compare import CompareRequest, parse_entries, run_compare
from autoplan.models.loader import load_spec
from autoplan.plan.io import load_plan
from autoplan.search import ExecutionSettings, SearchRequest, build_space
from autoplan.targets import get_target
from tests.integration._embedded import needs_embedded

pytestmark = pytest.mark.slow


def _space(target: str):
    return build_space(load_spec("smollm2-135m"), get_target(target), "vllm")


@needs_embedded
def test_compare_and_report_embedded(tmp_path):
    pytest.importorskip("matplotlib", reason="autoplan[report] (matplotlib) not installed")
    from autoplan.report import render_report

    comparison = run_compare(CompareRequest(
        SearchRequest(trials=150, execution=ExecutionSettings(execution="memory")),
        parse_entries("h100,mi300x"), tmp_path))
    assert [r.status for r in comparison.rows] == ["ok", "ok"]
    for row in comparison.rows:
        plan = load_plan(tmp_path / row.plan_file)
        assert plan.quality.budget_met and plan.quality.kl <= 0.05
        assert row.plan["tokens_per_s"] >= row.baseline["tokens_per_s"] * 0.999
    # one profile over the union of both spaces: each layer either searches x the choices
    # some space offers that layer (profile_spaces), so it holds each (layer, choice) they
    # pick. The profile also holds what the shared cache kept from earlier runs, hence >=;
    # that nothing else is scored is tests/unit/test_compare.py's (a fresh cache)
    spaces = [_space(t) for t in ("h100", "mi300x")]
    offered: dict[str, set] = {}
    for sp in spaces:
        for u in sp.units:
            for la in u.layers:
                offered.setdefault(la.name, set()).update(c for c in u.choices
                                                          if c != sp.baseline)
    union = {c for cs in offered.values() for c in cs}
    # every decoder linear is searched (lm_head is protected on GPU spaces), on >= 5 formats
    spec = load_spec("smollm2-135m")
    assert set(offered) == {la.name for la in spec.layers if la.role != "lm_head"}
    assert len(union) >= 5
    assert comparison.profile_entries >= sum(len(cs) for cs in offered.values())
    page = render_report(tmp_path)
    assert re.findall(r'data-plot="([a-z-]+)"', page) == (
        ["compare"] + ["pareto", "choice-map", "cost-breakdown"] * 2)
