"""Streamed (block-by-block) execution of the tiny Qwen3, Gemma 2, Gemma 3 and Phi-3 models
equals their in-memory forward: each block gets its own mask and rotary table (Gemma 3's
local and global layers, Gemma 2's alternating window), and Gemma 2's final soft-cap is
applied to the logits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autoplan.streaming.skeleton import StreamedModel
from tests.unit._tiny import one_torch_thread, streamed_logits  # noqa: F401
from tests.unit._tiny_archs import ARCHS, VOCAB, save_tiny_arch, tiny_arch_model

CPU = torch.device("cpu")


@pytest.mark.parametrize("arch", ARCHS)
def test_streamed_logits_equal_the_in_memory_forward(arch, tmp_path: Path) -> None:
    folder = save_tiny_arch(tmp_path / arch, arch)
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = tiny_arch_model(arch)(ids).logits
    sm = StreamedModel(folder, device=CPU)
    torch.testing.assert_close(streamed_logits(sm, ids), want, atol=1e-6, rtol=0)
    if arch in ("gemma2", "gemma3_text"):  # block 0's arguments for every block: wrong
        wrong = streamed_logits(sm, ids, block0_args=True)
        assert (wrong - want).abs().max() > 1e-2
