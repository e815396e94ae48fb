"""CPU and GPU give the same profile and KL (streamed execution, tiny Llama).

Tolerance, stated: both run fp32 (TF32 off, torch's default), so differences come from
summation order and from round-to-nearest ties that flip under it; every score agrees within
2 % relative and their median within 0.1 %; KL within 1 %.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autoplan.compress import CompressionSettings
from autoplan.formats import Choice
from autoplan.modelspec import ModelSpec
from autoplan.quality.text import load_text_dataset
from autoplan.search import build_space
from autoplan.streaming.evaluate import StreamedEvaluator
from autoplan.streaming.profile import build_profile_streamed
from autoplan.streaming.skeleton import StreamedModel
from autoplan.targets import get_target
from tests.unit._tiny import save_tiny_folder
from tests.unit.tiny_llama import tiny_tokenizer

pytestmark = pytest.mark.gpu


def _profile(folder: Path, device: str, cache: Path):  # noqa: ANN202
    sm = StreamedModel(folder, device=torch.device(device))
    data = load_text_dataset(None, tokenizer=tiny_tokenizer(), seq_len=64, n_calib=4, n_eval=2,
                             seed=0)
    calib = list(data.calib.split(2))
    space = build_space(ModelSpec.from_path(folder), get_target("h100-sxm"), "tensorrt-llm")
    layers = [la.name for u in space.units for la in u.layers]
    choices = [c for c in space.all_choices if c != space.baseline]
    prof = build_profile_streamed(sm, layers, choices, calib, model_hash="t", calib_hash="c",
                                  settings=CompressionSettings(), cache_dir=cache)
    sev = StreamedEvaluator(sm, data.eval, calib_batches=calib)
    int4 = Choice.parse("dense+int4_g64")
    q, _ = sev.evaluate_decisions({n: int4 for n in layers}, CompressionSettings(),
                                  baseline=space.baseline, needs_stats=True)
    return prof, q.kl


def test_cpu_and_gpu_profiles_agree(tmp_path: Path) -> None:
    folder = save_tiny_folder(tmp_path / "model")
    cpu, kl_cpu = _profile(folder, "cpu", tmp_path / "c")
    gpu, kl_gpu = _profile(folder, "cuda", tmp_path / "g")
    rel = []
    for layer, scores in cpu.scores.items():
        for key, a in scores.items():
            b = gpu.scores[layer][key]
            rel.append(abs(a - b) / max(abs(a), abs(b), 1e-12))
    rel.sort()
    assert rel[-1] <= 0.02, rel[-5:]
    assert rel[len(rel) // 2] <= 1e-3
    assert abs(kl_cpu - kl_gpu) <= 0.01 * kl_cpu
