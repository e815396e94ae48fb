"""Sensitivity profile on a tiny Llama: score sanity, the on-disk cache, resume after an
interruption, and the additive surrogate against measured KL."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from autoplan.compress import CompressionSettings, collect_stats, compressed_copy
from autoplan.formats import Choice
from autoplan.quality.evaluator import QualityEvaluator
from autoplan.quality.text import load_text_dataset
from autoplan.search import build_space
from autoplan.sensitivity import build_profile, cache_path, profile as profile_mod
from autoplan.targets import get_target
from tests.unit._tiny import one_torch_thread, tiny_llama, tiny_spec  # noqa: F401
from tests.unit.tiny_llama import tiny_tokenizer

SETTINGS = CompressionSettings()
FP8, INT8 = Choice.parse("dense+fp8_e4m3"), Choice.parse("dense+int8")
SPARSE = Choice.parse("2:4+bf16")


class Setup:
    def __init__(self, cache: Path) -> None:
        self.model = tiny_llama()
        data = load_text_dataset(None, tokenizer=tiny_tokenizer(), seq_len=64, n_calib=4,
                                 n_eval=4, seed=0)
        self.data = data
        self.calib = list(data.calib.split(2))
        # tensorrt-llm on h100: dense fp8/int8/int4 and 2:4 in one space
        self.space = build_space(tiny_spec(), get_target("h100-sxm"), "tensorrt-llm")
        self.layers = [la.name for u in self.space.units for la in u.layers]
        self.choices = [c for c in self.space.all_choices if c != self.space.baseline]
        self.cache = cache
        self.profile = self.build(self.layers, self.choices)

    def build(self, layers, choices, cache=None, **kw):  # noqa: ANN001, ANN003, ANN201
        return build_profile(self.model, layers, choices, self.calib, model_hash="tiny",
                             calib_hash=self.data.content_hash, settings=SETTINGS,
                             cache_dir=cache or self.cache, seed=0, **kw)


@pytest.fixture(scope="module")
def s(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    return Setup(tmp_path_factory.mktemp("profiles"))


def test_scores_cover_every_layer_and_are_non_negative(s: Setup) -> None:
    prof = s.profile
    assert prof.tokens == 4 * 64
    assert set(prof.scores) == set(s.layers) == set(prof.outliers)
    for name in s.layers:
        assert set(prof.scores[name]) == {str(c) for c in s.choices}
        assert all(v >= 0 and np.isfinite(v) for v in prof.scores[name].values())
        assert 0.0 <= prof.outliers[name] <= 1.0
    assert sum(prof.scores[n][str(SPARSE)] for n in s.layers) > 0


def test_a_no_op_choice_costs_zero(s: Setup, tmp_path: Path) -> None:
    # the model is fp32: dense+fp32 changes nothing, so its Fisher cost is zero
    prof = s.build(s.layers[:3], [Choice.parse("dense+fp32")], cache=tmp_path)
    assert all(abs(prof.scores[n]["dense+fp32"]) < 1e-12 for n in s.layers[:3])


def test_harsher_compression_costs_more(s: Setup) -> None:
    def mean(c: Choice) -> float:
        return float(np.mean([s.profile.cost(n, c) for n in s.layers]))

    assert mean(SPARSE) > mean(FP8)
    assert mean(SPARSE) > mean(Choice.parse("dense+int4_g64")) > mean(INT8)
    # per layer too, not only on average: pruning half the weights beats any 8-bit rounding
    assert all(s.profile.cost(n, SPARSE) > s.profile.cost(n, INT8) for n in s.layers)


def test_cache_hit_skips_capture(s: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_a, **_k) -> None:  # noqa: ANN002, ANN003
        raise AssertionError("capture must not run on a cache hit")

    monkeypatch.setattr(profile_mod, "capture", boom)
    monkeypatch.setattr(profile_mod, "score_task", boom)
    progress: list[tuple[int, int]] = []
    again = s.build(s.layers, s.choices, on_progress=lambda d, t: progress.append((d, t)))
    assert again.scores == s.profile.scores and again.outliers == s.profile.outliers
    assert progress == [(0, 0)]
    subset = s.build(s.layers[:2], s.choices[:1])  # a subset is a hit too
    assert subset.cost(s.layers[0], s.choices[0]) == s.profile.cost(s.layers[0], s.choices[0])


def test_cache_key_separates_settings_and_models(s: Setup) -> None:
    base = cache_path(s.cache, "tiny", s.data.content_hash, SETTINGS)
    assert base.is_file()
    others = {cache_path(s.cache, "other", s.data.content_hash, SETTINGS),
              cache_path(s.cache, "tiny", "other-calib", SETTINGS),
              cache_path(s.cache, "tiny", s.data.content_hash, CompressionSettings("magnitude")),
              cache_path(s.cache, "tiny", s.data.content_hash,
                         CompressionSettings(quant_method="gptq"))}
    assert base not in others and len(others) == 4


def _counting(monkeypatch: pytest.MonkeyPatch, fail_at: int | None = None) -> list[tuple]:
    calls: list[tuple] = []
    real = profile_mod.score_task

    def wrapped(task):  # noqa: ANN001, ANN202
        calls.append((task.layer, tuple(str(c) for c in task.choices)))
        if fail_at is not None and len(calls) == fail_at:
            raise KeyboardInterrupt
        return real(task)

    monkeypatch.setattr(profile_mod, "score_task", wrapped)
    return calls


def test_interrupted_profile_resumes_the_remaining_layers(
        s: Setup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    layers, choices, k = s.layers[:5], [FP8, SPARSE], 2
    first = _counting(monkeypatch, fail_at=k + 1)
    with pytest.raises(KeyboardInterrupt):
        s.build(layers, choices, cache=tmp_path)
    assert len(first) == k + 1
    saved = json.loads(next(tmp_path.glob("profile-*.json")).read_text())
    assert sorted(saved["scores"]) == sorted(layers[:k])  # written after every layer

    monkeypatch.undo()
    second = _counting(monkeypatch)
    progress: list[tuple[int, int]] = []
    prof = s.build(layers, choices, cache=tmp_path,
                   on_progress=lambda d, t: progress.append((d, t)))
    assert [name for name, _ in second] == layers[k:]
    assert progress[0] == (0, (5 - k) * 2) and progress[-1] == ((5 - k) * 2, (5 - k) * 2)
    for name in layers:  # the same numbers as one uninterrupted run
        for c in choices:
            assert prof.cost(name, c) == pytest.approx(s.profile.cost(name, c), rel=1e-4, abs=1e-12)


def test_new_choices_compute_only_what_is_missing(
        s: Setup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    layers = s.layers[:3]
    s.build(layers, [FP8], cache=tmp_path)
    calls = _counting(monkeypatch)
    prof = s.build(layers, [FP8, INT8], cache=tmp_path)
    assert calls == [(n, (str(INT8),)) for n in layers]
    assert all(prof.has(n, FP8) and prof.has(n, INT8) for n in layers)


def test_corrupt_cache_is_recomputed(s: Setup, tmp_path: Path) -> None:
    path = cache_path(tmp_path, "tiny", s.data.content_hash, SETTINGS)
    path.write_text("{truncated")
    prof = s.build(s.layers[:2], [FP8], cache=tmp_path)
    assert prof.cost(s.layers[0], FP8) == pytest.approx(s.profile.cost(s.layers[0], FP8), rel=1e-4)
    assert json.loads(path.read_text())["version"] == profile_mod.PROFILE_VERSION


def test_surrogate_tracks_measured_kl(s: Setup) -> None:
    """Sum of per-layer scores vs the KL measured on the compressed model, random mixed plans."""
    stats = collect_stats(s.model, s.layers, s.calib)
    evaluator = QualityEvaluator(s.model, s.data.eval)
    rng = np.random.default_rng(0)
    surrogate, measured = [], []
    for i in range(8):
        picks = {u.name: u.choices[int(rng.integers(1, len(u.choices)))]
                 for u in s.space.units if rng.random() < (i + 1) / 8}
        decisions = s.space.decisions(picks)
        surrogate.append(sum(s.profile.cost(n, c) for n, c in decisions.items()
                             if c != s.space.baseline))
        model, _ = compressed_copy(s.model, decisions, stats, SETTINGS, baseline=s.space.baseline)
        with torch.no_grad():
            measured.append(evaluator.evaluate(model).kl)
    rho = spearmanr(surrogate, measured).statistic
    assert rho > 0.8, (rho, surrogate, measured)
    # and in the right units: within a factor of 3 where the KL is clearly above noise
    for sur, kl in zip(surrogate, measured):
        if kl > 0.01:
            assert kl / 3 < sur < 3 * kl, (sur, kl)


class _ReversedExecutor:
    """Runs tasks out of order, as a distributed executor may; the profile must not care."""

    name = "reversed"

    def imap_unordered(self, fn, items):  # noqa: ANN001, ANN201
        listed = list(items)
        for i in reversed(range(len(listed))):
            yield i, fn(listed[i])

    def close(self) -> None:
        return None


def test_any_executor_order_gives_the_same_profile(s: Setup, tmp_path: Path) -> None:
    other = s.build(s.layers, s.choices, cache=tmp_path, executor=_ReversedExecutor())
    assert other.scores == s.profile.scores and other.outliers == s.profile.outliers
