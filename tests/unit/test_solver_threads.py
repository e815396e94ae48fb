"""SparseGPT/GPTQ plans reproduce on any shell's thread count: the solvers are pinned to
the count the plan records (autoplan/numerics.py).

The Cholesky factorization the solvers share rounds differently on 1 and 2 torch threads
even for a 128-input layer, so the tiny model shows the effect the embedded model showed
(an export refused after a search run with OMP_NUM_THREADS=1).
"""

from __future__ import annotations

import pytest
import torch

from autoplan.compress import CompressionSettings, audit_digests, collect_stats, compressed_copy
from autoplan.errors import UserInputError
from autoplan.export._prepare import prepare
from autoplan.formats import Choice
from autoplan.numerics import pinned_threads, signature
from autoplan.search import SearchRequest
from tests.unit.test_export_common import BASELINE, layer_names, make_plan, tiny_loaded

SPARSE = "2:4+bf16"


def _calibration() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return list(torch.randint(0, 128, (4, 32), generator=g).split(2))


def _plan_on(loaded, threads: int, quant: str = "rtn"):  # noqa: ANN001, ANN202
    """A 2:4 SparseGPT plan whose audit was computed on ``threads`` torch threads."""
    decisions = {n: (BASELINE if n == "lm_head" else SPARSE) for n in layer_names(loaded)}
    calib = _calibration()
    with pinned_threads(threads):
        stats = collect_stats(loaded.model, decisions, calib)
        settings = CompressionSettings("sparsegpt", quant, solver_threads=threads)
        _, sims = compressed_copy(loaded.model, {n: Choice.parse(c) for n, c in decisions.items()},
                                  stats, settings)
    plan = make_plan(loaded, decisions, runtime="tensorrt-llm", prune="sparsegpt", quant=quant,
                     stats=stats)
    audit = plan.audit.model_copy(update={"tensors": audit_digests(sims),
                                          "solver_threads": threads,
                                          "solver_numerics": signature()})
    return plan.model_copy(update={"audit": audit}), calib


def test_the_solver_bits_depend_on_the_thread_count(tmp_path) -> None:  # noqa: ANN001
    # the premise: without pinning, 1 and 2 threads give different SparseGPT weights
    loaded = tiny_loaded(tmp_path)
    one, _ = _plan_on(loaded, 1)
    two, _ = _plan_on(loaded, 2)
    assert one.audit.tensors != two.audit.tensors


@pytest.mark.parametrize("quant", ["rtn", "gptq"])
def test_a_plan_solved_on_one_thread_exports_from_a_two_thread_shell(tmp_path, quant) -> None:  # noqa: ANN001
    loaded = tiny_loaded(tmp_path)
    plan, calib = _plan_on(loaded, 1, quant)
    with pinned_threads(2):
        prepared = prepare(plan, loaded, "modelopt", ("tensorrt-llm",), calibration=calib)
        assert torch.get_num_threads() == 2  # the pin is for the solver only, then restored
    assert audit_digests(prepared.sims) == plan.audit.tensors


def test_a_plan_without_its_thread_count_is_refused_with_the_cause(tmp_path) -> None:  # noqa: ANN001
    loaded = tiny_loaded(tmp_path)
    plan, calib = _plan_on(loaded, 1)
    foreign = plan.audit.model_copy(update={"solver_threads": 2,
                                            "solver_numerics": "torch 0.0, cpu VSX"})
    with pytest.raises(UserInputError, match="solved with torch 0.0, cpu VSX.*re-run the search"):
        prepare(plan.model_copy(update={"audit": foreign}), loaded, "modelopt",
                ("tensorrt-llm",), calibration=calib)
    same_machine = plan.audit.model_copy(update={"solver_threads": 2})
    with pytest.raises(UserInputError, match="calibration data"):
        prepare(plan.model_copy(update={"audit": same_machine}), loaded, "modelopt",
                ("tensorrt-llm",), calibration=calib)


def test_a_search_request_fixes_the_thread_count_at_its_start() -> None:
    with pinned_threads(1):
        req = SearchRequest(settings=CompressionSettings("sparsegpt", "rtn"))
    assert req.settings.solver_threads == 1
    with pinned_threads(2):  # a request made elsewhere keeps its count
        again = SearchRequest(settings=req.settings)
    assert again.settings.solver_threads == 1
    with pytest.raises(UserInputError, match="at least 1"):
        CompressionSettings(solver_threads=0)
