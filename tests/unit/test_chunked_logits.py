"""Logits in chunks of positions (autoplan/models/head.py): every place quality is measured
gives what the whole-batch logits give, for every architecture, while the head runs on a
few positions at a time -- the reference and compared log-probs, the profile's Fisher
gradients and sampled labels, the recovery loss and its gradients, and the positions a
slice, suite or long-context check reads."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from autoplan.models.head import block_logits, chunk_rows, selected_logits, split_lm
from autoplan.quality.metrics import compare_pass, kl_sum, nll_sum, reference_pass
from autoplan.recover.train import distill, distillation_loss
from autoplan.sensitivity.capture import capture
from tests.unit._tiny import one_torch_thread, tiny_config, tiny_llama  # noqa: F401
from tests.unit._tiny_archs import ARCHS, VOCAB, tiny_arch_model


def _tokens(n: int = 3, seq: int = 37, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, seq), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", [*ARCHS, "llama"])
def test_chunks_are_the_models_own_logits(arch):
    """Gemma 2's final soft-cap included: the head is the model's, chunk by chunk."""
    model = tiny_llama() if arch == "llama" else tiny_arch_model(arch)
    assert split_lm(model) is not None
    batch = _tokens()
    with torch.no_grad():
        full = model(input_ids=batch, use_cache=False).logits.float()
        got = torch.zeros_like(full)
        for b, start, logits in block_logits(model, batch, chunk=5):
            assert logits.shape[0] <= 5
            got[b, start:start + logits.shape[0]] = logits
        pick = torch.rand(batch.shape, generator=torch.Generator().manual_seed(2)) < 0.3
        picked = selected_logits(model, batch, pick, chunk=4)
    torch.testing.assert_close(got, full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(picked, full[pick], rtol=1e-5, atol=1e-5)


def test_reference_and_compare_equal_the_whole_batch_formulas(monkeypatch):
    import autoplan.quality.metrics as metrics

    model, other = tiny_llama(0), tiny_llama(1)
    tokens = _tokens(5, 33)
    monkeypatch.setattr(metrics, "chunk_rows", lambda vocab: 7)  # many chunks, a ragged last
    ref = reference_pass(model, tokens, batch_size=2)
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=tokens).logits.float(), -1)
        lq = torch.log_softmax(other(input_ids=tokens).logits.float(), -1)
    assert ref.logprobs.dtype == torch.float16
    torch.testing.assert_close(ref.logprobs.float(), lp.half().float(), rtol=0, atol=2e-3)
    assert ref.nll == pytest.approx(nll_sum(lp, tokens) / (5 * 32), rel=1e-6)
    nll, kl = compare_pass(other, ref, batch_size=3)
    assert nll == pytest.approx(nll_sum(lq, tokens) / (5 * 32), rel=1e-6)
    assert kl == pytest.approx(kl_sum(ref.logprobs, lq) / tokens.numel(), rel=1e-5)
    assert compare_pass(model, ref)[1] == 0.0  # identical model: exactly 0


def test_chunk_size_follows_the_vocabulary():
    assert chunk_rows(262144) == 64 and chunk_rows(49152) == 341
    assert chunk_rows(10**9) == 16 and chunk_rows(256) == 1024
    assert 262144 * chunk_rows(262144) * 4 <= 64 * 2**20


def test_fisher_captures_and_labels_equal_the_whole_batch_pass(monkeypatch):
    """Labels drawn chunk by chunk from one generator are the whole batch's draws, so the
    captured output gradients are the same (lm_head included)."""
    import importlib

    cap = importlib.import_module("autoplan.sensitivity.capture")  # the package shadows it
    model = tiny_llama(0)
    names = ["model.layers.1.mlp.down_proj", "lm_head"]
    batches = [_tokens(2, 29, seed=s) for s in (3, 4)]
    monkeypatch.setattr(cap, "chunk_rows", lambda vocab: 9)
    chunked = capture(model, names, batches, seed=5)
    monkeypatch.setattr(cap, "split_lm", lambda m: None)  # the whole-batch logits
    whole = capture(model, names, batches, seed=5)
    for n in names:
        torch.testing.assert_close(chunked.grads[n], whole.grads[n], rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(chunked.inputs[n], whole.inputs[n])


def test_recovery_loss_and_gradients_equal_the_whole_batch_loss():
    teacher, student = tiny_llama(0), tiny_llama(1)
    for p in student.parameters():
        p.requires_grad_(False)
    trained = student.model.layers[0].mlp.down_proj.weight
    trained.requires_grad_(True)
    head = student.lm_head.weight
    head.requires_grad_(True)
    batch = _tokens(2, 40)
    value = distill(teacher, student, batch, backward=True)
    got = (trained.grad.clone(), head.grad.clone())
    trained.grad = head.grad = None
    with torch.no_grad():
        target = teacher(input_ids=batch).logits
    loss = distillation_loss(target, student(input_ids=batch).logits)
    loss.backward()
    assert value == pytest.approx(float(loss.detach()), rel=1e-5)
    torch.testing.assert_close(got[0], trained.grad, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(got[1], head.grad, rtol=1e-4, atol=1e-7)
    with torch.no_grad():
        assert distill(teacher, student, batch, backward=False) == pytest.approx(value, rel=1e-6)


def test_a_callable_without_a_head_is_sliced():
    """ONNX Runtime sessions (and other callables) return whole logits: sliced, same values."""
    model = tiny_llama(0)

    class Wrapped:
        def __call__(self, input_ids, use_cache=False):  # noqa: ANN001, ANN204
            return model(input_ids=input_ids, use_cache=use_cache)

    batch = _tokens(2, 20)
    got = list(block_logits(Wrapped(), batch, chunk=8))
    assert [(b, s) for b, s, _ in got] == [(0, 0), (0, 8), (0, 16), (1, 0), (1, 8), (1, 16)]
    with torch.no_grad():
        full = model(input_ids=batch).logits
    torch.testing.assert_close(got[4][2], full[1, 8:16].float())
    assert math.isfinite(float(F.log_softmax(got[0][2].detach(), -1).sum()))
