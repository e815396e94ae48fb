"""Slices, the long-context check and lm-eval tasks as quality gates, on the tiny Llama: the
original scores itself exactly, a damaged copy scores worse, budgets parse and read them,
and a task whose data is not here offline is one line naming it."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from autoplan.errors import UserInputError
from autoplan.quality.evaluator import QualityEvaluator, original_quality
from autoplan.quality.longctx import LongContextGate, build_cases, default_lengths
from autoplan.quality.slices import SLICES, build_slices
from autoplan.search import QualityBudget
from autoplan.search.verify import SLICE_NAMES, parse_budgets
from tests.unit._tiny import one_torch_thread, tiny_llama  # noqa: F401
from tests.unit.tiny_llama import tiny_tokenizer

TASKS = Path(__file__).resolve().parents[1] / "data" / "lmeval"


@pytest.fixture(scope="module")
def models():  # noqa: ANN201
    model = tiny_llama()
    damaged = copy.deepcopy(model)
    with torch.no_grad():
        for layer in damaged.model.layers:
            layer.mlp.down_proj.weight.mul_(torch.rand_like(layer.mlp.down_proj.weight) > 0.5)
    return model, damaged, tiny_tokenizer()


def test_slices_have_positions_and_score_the_original_zero(models) -> None:  # noqa: ANN001
    model, damaged, tok = models
    slices = build_slices(tok, seq_len=64, n_blocks=2)
    assert [s.name for s in slices.slices] == list(SLICES) == list(SLICE_NAMES)
    assert all(s.positions > 5 for s in slices.slices)
    assert build_slices(tok, seq_len=64, n_blocks=2).content_hash == slices.content_hash
    ev = QualityEvaluator(model, torch.randint(2, 256, (1, 32)), slices=slices)
    same = ev.evaluate(copy.deepcopy(model))
    assert same.slices == {name: 0.0 for name in SLICES}
    worse = ev.evaluate(damaged)
    assert all(v > 1e-3 for v in worse.slices.values())
    b = QualityBudget.parse("kl:names<=0.001")
    assert b.passes(same) and not b.passes(worse)


def test_longctx_cases_and_gate(models) -> None:  # noqa: ANN001
    model, damaged, tok = models
    assert default_lengths(8192) == (1024, 2048, 4096, 8192)
    assert default_lengths(8192, 4096) == (512, 1024, 2048, 4096)
    cases = build_cases(tok, (256,), seed=3)
    assert len(cases) == 3 and all(len(c.prompt_ids) + len(c.key_ids) == 256 for c in cases)
    assert cases == build_cases(tok, (256,), seed=3)  # seeded
    gate = LongContextGate(tok, model)  # the tiny model's context is 256
    ev = QualityEvaluator(model, torch.randint(2, 256, (1, 32)), gates=[gate])
    same = ev.evaluate(copy.deepcopy(model)).gates["longctx"]
    assert same.delta == 0.0 and 0 < same.reference <= 100
    worse = ev.evaluate(damaged)
    assert worse.gates["longctx"].score != same.score
    budget = QualityBudget.parse("longctx>=-0")
    assert budget.badness(worse) == -worse.gates["longctx"].delta


def test_lmeval_local_task_on_the_model_in_memory(models) -> None:  # noqa: ANN001
    pytest.importorskip("lm_eval")
    from autoplan.quality.lmeval import LmEvalGate

    model, damaged, tok = models
    gate = LmEvalGate("autoplan_tiny_mc", tok, include_path=TASKS)
    score, detail = gate.score(model)
    assert 0 <= score <= 100 and set(detail) == {"acc"}
    assert score == pytest.approx(100 * _acc_by_hand(model, tok))
    ev = QualityEvaluator(model, torch.randint(2, 256, (1, 32)), gates=[gate])
    assert ev.evaluate(copy.deepcopy(model)).gates["lm-eval:autoplan_tiny_mc"].delta == 0.0


def _acc_by_hand(model, tok) -> float:  # noqa: ANN001
    """The task's accuracy computed directly: the choice with the highest summed
    log-likelihood after the question (lm-eval's multiple_choice `acc`)."""
    import json

    rows = [json.loads(line) for line in (TASKS / "autoplan_tiny_mc.jsonl").read_text()
            .splitlines()]
    right = 0
    for row in rows:
        ctx = tok(row["question"])["input_ids"]
        scores = []
        for choice in row["choices"]:
            whole = tok(row["question"] + " " + choice)["input_ids"]
            cont = whole[len(ctx):]
            with torch.no_grad():
                lp = torch.log_softmax(model(input_ids=torch.tensor([whole])).logits[0].float(), -1)
            scores.append(sum(float(lp[len(ctx) - 1 + i, t]) for i, t in enumerate(cont)))
        right += int(max(range(len(scores)), key=scores.__getitem__) == row["answer"])
    return right / len(rows)


def test_lmeval_missing_data_is_one_line(models, tmp_path: Path) -> None:  # noqa: ANN001
    pytest.importorskip("lm_eval")
    from autoplan.quality.lmeval import LmEvalGate

    _, _, tok = models
    (tmp_path / "needs_hub.yaml").write_text(
        "task: autoplan_needs_hub\ndataset_path: autoplan-test/not-on-this-machine\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: '{{q}}'\n"
        "doc_to_choice: '{{c}}'\ndoc_to_target: 0\nmetric_list:\n  - metric: acc\n")
    with pytest.raises(UserInputError) as err:
        LmEvalGate("autoplan_needs_hub", tok, include_path=tmp_path)
    msg = str(err.value)
    assert "\n" not in msg and "autoplan_needs_hub" in msg and "offline" in msg
    with pytest.raises(UserInputError, match="not found"):
        LmEvalGate("autoplan_tiny_mc", tok, include_path=tmp_path / "missing")


def test_budget_texts() -> None:
    budgets = parse_budgets(("kl<=0.05", "lm-eval:arc_easy>=-1.5", "longctx:4096>=-5",
                             "kl:numbers<=0.2"))
    assert [b.metric for b in budgets] == ["kl", "gate", "gate", "slice"]
    assert budgets[1].name == "lm-eval:arc_easy" and budgets[1].limit == 1.5
    assert budgets[2].max_len == 4096 and budgets[3].name == "numbers"
    for bad in ("kl:prices<=0.1", "longctx>=5", "lm-eval:x>=2"):
        with pytest.raises(UserInputError):
            QualityBudget.parse(bad)


def test_original_quality_is_what_a_pass_over_the_original_measures(models) -> None:  # noqa: ANN001
    # the verifier records the uncompressed candidate without a pass: it must be the same
    # result, field for field (KL and slices exactly 0, perplexity and gates the reference's)
    model, _damaged, tok = models
    gate = LongContextGate(tok, model)
    ev = QualityEvaluator(model, torch.randint(2, 256, (2, 32)), batch_size=1,
                          slices=build_slices(tok, seq_len=64, n_blocks=2), gates=[gate])
    measured = ev.evaluate(copy.deepcopy(model))
    known = original_quality(ev)
    assert known.kl == measured.kl == 0.0 and known.slices == measured.slices
    assert known.ppl == measured.ppl and known.ppl_ref == measured.ppl_ref
    assert known.gates == measured.gates and known.n_tokens == measured.n_tokens
    assert original_quality(ev, slices=False).slices == {}
