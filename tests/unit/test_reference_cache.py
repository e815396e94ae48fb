"""The original's reference log-probs are computed once per model, tokens and arithmetic,
then read back from disk (a resumed search does not recompute them)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autoplan.quality import metrics
from autoplan.quality.text import load_text_dataset
from autoplan.streaming import ExecutionSettings, open_model
from autoplan.streaming import evaluate as streamed
from tests.unit._tiny import one_torch_thread, save_tiny_folder  # noqa: F401
from tests.unit.tiny_llama import tiny_tokenizer


@pytest.mark.parametrize("execution", ["memory", "stream"])
def test_reference_is_computed_once_then_read_back(tmp_path: Path, execution: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    runner = open_model(str(save_tiny_folder(tmp_path / "m")), ExecutionSettings(
        device="cpu", execution=execution))
    data = load_text_dataset(None, tokenizer=tiny_tokenizer(), seq_len=32, n_calib=2, n_eval=3)
    cache = tmp_path / "refs"
    first = runner.evaluator(data.eval, cache_dir=cache).reference
    (stored,) = cache.iterdir()

    def fail(*_a, **_k):  # noqa: ANN002, ANN003, ANN202
        pytest.fail("the reference was recomputed")

    monkeypatch.setattr(metrics, "reference_pass", fail)
    monkeypatch.setattr(streamed.StreamedEvaluator, "_run", lambda *a, **k: fail())
    again = runner.evaluator(data.eval, cache_dir=cache).reference
    assert torch.equal(again.logprobs, first.logprobs) and again.nll == first.nll
    assert torch.equal(again.tokens, first.tokens)
    monkeypatch.undo()
    # other tokens: another key, computed afresh
    other = load_text_dataset(None, tokenizer=tiny_tokenizer(), seq_len=32, n_calib=2, n_eval=2)
    runner.evaluator(other.eval, cache_dir=cache)
    assert len(list(cache.iterdir())) == 2
    # a damaged file is recomputed, not trusted
    stored.write_bytes(b"garbage")
    fixed = runner.evaluator(data.eval, cache_dir=cache).reference
    assert torch.equal(fixed.logprobs, first.logprobs)


def test_reference_is_written_without_a_copy_of_the_log_probs(tmp_path: Path) -> None:
    """Writing the cache streams each tensor from its own memory: no bytes object of the
    whole file is built (for a 262k vocabulary that was 2 x 0.75 GiB at the search's peak),
    and the file reads back with safetensors as the tensors it was given."""
    import tracemalloc

    from safetensors.torch import load_file

    from autoplan.quality.reference_cache import cached_reference

    tokens = torch.arange(2 * 64).reshape(2, 64)
    logprobs = torch.randn(2, 64, 8192).to(torch.float16)  # 2 MiB
    ref = metrics.ReferenceLogprobs(tokens, logprobs, 1.25)
    tracemalloc.start()
    try:
        cached_reference(tmp_path, "k", tokens, lambda: ref)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < logprobs.numel() * 2 / 4, f"{peak} bytes traced writing the cache"
    got = load_file(tmp_path / "reference-k.safetensors")
    assert torch.equal(got["logprobs"], logprobs) and torch.equal(got["tokens"], tokens)
    assert float(got["nll"]) == 1.25
    again = cached_reference(tmp_path, "k", tokens, lambda: pytest.fail("recomputed"))
    assert torch.equal(again.logprobs, logprobs) and again.nll == 1.25
