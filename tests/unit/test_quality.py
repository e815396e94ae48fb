"""Quality metrics on a tiny in-process Llama: KL, perplexity, data split, sources, suite."""

from __future__ import annotations

import copy
import json
import math
import warnings

import pytest
import torch

from autoplan.errors import UserInputError
from autoplan.models import get_linear
from autoplan.quality import (
    QualityEvaluator,
    is_eval_document,
    load_suite,
    load_text_dataset,
)
from autoplan.quality.metrics import kl_slack
from tests.unit.tiny_llama import tiny_model, tiny_tokenizer


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def data(tok):
    return load_text_dataset(tokenizer=tok, seq_len=32, n_calib=4, n_eval=3, seed=0)


def _perturbed(model, scale=0.5):
    m = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    w = get_linear(m, "model.layers.0.mlp.up_proj").weight
    w.data.add_(torch.randn(w.shape, generator=g) * scale * w.std())
    return m


def test_kl_zero_for_same_model_positive_for_perturbed(model, data):
    ev = QualityEvaluator(model, data.eval)
    assert any(p.requires_grad for p in model.parameters())
    with warnings.catch_warnings():  # no autograd graph for a trainable model's pass
        warnings.simplefilter("error")
        same = ev.evaluate(model)
    assert same.kl == 0.0 and same.ppl == same.ppl_ref
    assert same.n_tokens == 3 * 32
    other = ev.evaluate(_perturbed(model, scale=3.0))
    assert other.kl > 1e-5 and other.ppl != other.ppl_ref


def test_ppl_matches_manual(model, data):
    tokens = data.eval
    with torch.no_grad():
        logits = model(input_ids=tokens).logits
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                            tokens[:, 1:].reshape(-1))
    ev = QualityEvaluator(model, tokens, batch_size=2)
    assert ev.ppl_ref == pytest.approx(math.exp(float(nll)), rel=1e-5)


def test_kl_matches_manual_fp32(model, data):
    other = _perturbed(model)
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=data.eval).logits, -1)
        lq = torch.log_softmax(other(input_ids=data.eval).logits, -1)
    exact = float((lp.exp() * (lp - lq)).sum(-1).mean())
    got = QualityEvaluator(model, data.eval).evaluate(other).kl
    assert got == pytest.approx(exact, rel=1e-2, abs=1e-5)  # fp16 storage of log-probs


def test_bounded_pass_stops_only_when_the_budget_is_certainly_exceeded(model, tok):
    tokens = load_text_dataset(tokenizer=tok, seq_len=32, n_calib=1, n_eval=6, seed=0).eval
    ev = QualityEvaluator(model, tokens, batch_size=4)
    bad = copy.deepcopy(model)
    with torch.no_grad():  # an output layer 30x sharper and reordered: a KL far over budgets
        bad.lm_head.weight.copy_(30 * bad.lm_head.weight.flip(0))
    full = ev.evaluate(bad)
    assert not full.stopped_early and full.kl > 0.1
    # the same figures whatever the grouping of blocks into passes (per-block sums, fsum)
    other = QualityEvaluator(model, tokens, batch_size=1).evaluate(bad)
    assert other.kl == full.kl and other.ppl == full.ppl
    # a limit well under the KL: stopped after the first block (a sixth of the tokens),
    # with a lower bound above the limit and below the full KL
    limit = full.kl / 12
    early = ev.evaluate(bad, kl_limit=limit)
    assert early.stopped_early and limit < early.kl <= full.kl
    assert early.slices == {} and early.suite_score is None
    # a limit over the KL never stops: the full pass's result, bit for bit
    late = ev.evaluate(bad, kl_limit=full.kl * 1.01)
    assert not late.stopped_early and late.kl == full.kl and late.ppl == full.ppl
    # the slack the bound allows per position is the most a kl_sum term falls below 0:
    # on a model that is not the original, no block's mean gets near it from below
    slack = kl_slack(ev.reference.logprobs.shape[-1])
    near = _perturbed(model, scale=1e-3)
    for i in range(6):
        assert QualityEvaluator(model, tokens[i:i + 1]).evaluate(near).kl > -slack / 10


def test_split_deterministic(tok, data):
    again = load_text_dataset(tokenizer=tok, seq_len=32, n_calib=4, n_eval=3, seed=0)
    assert torch.equal(again.eval, data.eval) and again.content_hash == data.content_hash
    other = load_text_dataset(tokenizer=tok, seq_len=32, n_calib=4, n_eval=3, seed=1)
    assert other.content_hash != data.content_hash
    assert data.calib.shape == (4, 32) and data.eval.shape == (3, 32)
    from pydoc_data.topics import topics

    held_out = [k for k in topics if is_eval_document(k)]
    assert 0 < len(held_out) < len(topics) / 2
    assert is_eval_document("x") == is_eval_document("x")


def test_text_and_jsonl_sources(tok, tmp_path):
    paragraphs = [f"Paragraph {i}: " + "the quick brown fox jumps. " * 8 for i in range(60)]
    txt = tmp_path / "t.txt"
    txt.write_text("\n\n".join(paragraphs))
    a = load_text_dataset(txt, tokenizer=tok, seq_len=16, n_calib=2, n_eval=2)
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text("\n".join(json.dumps({"text": p}) for p in paragraphs))
    b = load_text_dataset(jsonl, tokenizer=tok, seq_len=16, n_calib=2, n_eval=2)
    assert torch.equal(a.eval, b.eval) and a.content_hash == b.content_hash
    assert a.source == str(txt)


def test_source_errors(tok, tmp_path):
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"text": "ok"}\n{"txt": "no"}\n')
    with pytest.raises(UserInputError, match=":2"):
        load_text_dataset(bad, tokenizer=tok)
    with pytest.raises(UserInputError, match=".txt or .jsonl"):
        load_text_dataset(tmp_path / "x.csv", tokenizer=tok) if (tmp_path / "x.csv").write_text("a") else None
    short = tmp_path / "s.txt"
    short.write_text("tiny")
    with pytest.raises(UserInputError, match="supply more text"):
        load_text_dataset(short, tokenizer=tok, seq_len=16, n_calib=1, n_eval=0)


def _suite_file(tmp_path):
    path = tmp_path / "suite.jsonl"
    rows = [{"prompt": "Name a colour:", "reference": "blue"},
            {"prompt": "2 + 2 =", "reference": "4", "id": 7}]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def test_suite_scoring(model, tok, data, tmp_path):
    suite = load_suite(_suite_file(tmp_path), tok)
    assert len(suite.items) == 2 and suite.items[1].reference_ids == tuple(tok(" 4")["input_ids"])
    ev = QualityEvaluator(model, data.eval, suite=suite, max_new_tokens=5)
    ref = ev.suite_reference
    assert ref.score.agreement == 100.0 and 0 < ref.score.score <= 100
    assert all(1 <= len(g) <= 5 for g in ref.greedy)
    same = ev.evaluate(model)
    assert same.suite_score == pytest.approx(same.suite_score_ref) and same.suite_delta == pytest.approx(0)
    other = ev.evaluate(_perturbed(model, scale=3.0))
    assert other.suite_score != same.suite_score
    assert 0 <= other.suite_agreement <= 100
    assert set(other.to_dict()) >= {"ppl", "kl", "suite_score", "suite_delta"}


def test_suite_errors(tok, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x"}\n')
    with pytest.raises(UserInputError, match="reference"):
        load_suite(bad, tok)
    with pytest.raises(UserInputError, match="not found"):
        load_suite(tmp_path / "none.jsonl", tok)


def test_example_suite_is_valid(tok):
    suite = load_suite("examples/suite_example.jsonl", tok)
    assert len(suite.items) == 20
