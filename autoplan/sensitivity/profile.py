"""The sensitivity profile: for every layer x choice, a quality cost in KL nats per token.

score(layer, choice) = 1/2 * mean over tokens of sum_j (G_tj * dY_tj)^2, where dY is the
change of the layer's output when that layer alone is compressed to `choice` (pruned, then
quantized, with its activation quantization) and G is the Fisher gradient from the capture
pass. Summing scores over layers is the additive surrogate the search constrains.

The profile is cached on disk as JSON, keyed by model hash + calibration hash + settings,
with one entry per (layer, choice): it is written after every layer, so an interrupted run
resumes where it stopped, and adding choices later only computes the new ones.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from autoplan.compress import CompressionSettings, compress_linear
from autoplan.formats import Choice
from autoplan.models.graph import get_linear
from autoplan.plan.io import write_json_atomic
from autoplan.quant import HessianAccumulator
from autoplan.sensitivity.capture import Captured, capture
from autoplan.sensitivity.executor import Executor, SerialExecutor

# 2: Wanda's activation norms from a separately accumulated diagonal (last bits may differ)
PROFILE_VERSION = 2
# OWL (Yin et al. 2024): a weight is an outlier when its Wanda score exceeds M x the layer mean.
OWL_M = 5.0


@dataclass
class SensitivityProfile:
    """Per-layer, per-choice KL estimates and per-layer outlier ratios."""

    model_hash: str
    calib_hash: str
    settings: CompressionSettings
    tokens: int = 0
    scores: dict[str, dict[str, float]] = field(default_factory=dict)
    outliers: dict[str, float] = field(default_factory=dict)

    def cost(self, layer: str, choice: Choice) -> float:
        return self.scores[layer][str(choice)]

    def has(self, layer: str, choice: Choice) -> bool:
        return str(choice) in self.scores.get(layer, {})

    def to_json(self) -> dict:
        return {
            "version": PROFILE_VERSION, "model_hash": self.model_hash,
            "calib_hash": self.calib_hash, "tokens": self.tokens,
            "settings": {"prune_score": self.settings.prune_score,
                         "quant_method": self.settings.quant_method},
            "scores": self.scores, "outliers": self.outliers,
        }

    @classmethod
    def from_json(cls, raw: dict) -> SensitivityProfile:
        return cls(raw["model_hash"], raw["calib_hash"], CompressionSettings(**raw["settings"]),
                   raw.get("tokens", 0), raw.get("scores", {}), raw.get("outliers", {}))


def calibration_key(batches: Sequence[Tensor]) -> str:
    """Hash of exactly what the profile sees: the calibration token batches (not the
    evaluation split, so changing the evaluation size reuses the profile)."""
    h = hashlib.sha256(b"autoplan-calib-v1")
    for b in batches:
        h.update(f"{tuple(b.shape)}|".encode())
        h.update(b.to(torch.int64).contiguous().numpy().tobytes())
    return h.hexdigest()


def cache_path(cache_dir: Path, model_hash: str, calib_hash: str,
               settings: CompressionSettings) -> Path:
    key = hashlib.sha256(
        f"v{PROFILE_VERSION}|{model_hash}|{calib_hash}|{settings.prune_score}|"
        f"{settings.quant_method}".encode()).hexdigest()[:24]
    return cache_dir / f"profile-{key}.json"


def load_cached(path: Path, model_hash: str, calib_hash: str,
                settings: CompressionSettings) -> SensitivityProfile:
    """The cached profile at `path`, or an empty one (a corrupt cache is recomputed)."""
    if path.is_file():
        try:
            raw = json.loads(path.read_text())
            if raw.get("version") == PROFILE_VERSION and raw.get("model_hash") == model_hash:
                return SensitivityProfile.from_json(raw)
        except (json.JSONDecodeError, KeyError, TypeError):
            pass
    return SensitivityProfile(model_hash, calib_hash, settings)


def _outlier_ratio(weight: Tensor, act_norm: Tensor) -> float:
    score = weight.detach().float().abs() * act_norm[None, :]
    return float((score > OWL_M * score.mean()).float().mean())


@dataclass(frozen=True)
class ScoreTask:
    """Everything one layer's scoring needs, as plain tensors (so it can run on a worker)."""

    layer: str
    weight: Tensor
    bias: Tensor | None
    inputs: Tensor  # [T, in]
    grads: Tensor  # [T, out]
    tokens: int
    choices: tuple[Choice, ...]
    settings: CompressionSettings


@dataclass(frozen=True)
class ScoreResult:
    layer: str
    scores: dict[str, float]
    outlier: float


@torch.no_grad()
def score_task(task: ScoreTask) -> ScoreResult:
    """Score one layer for each of its choices: 1/2 mean_t sum_j (G * dY)^2."""
    linear = torch.nn.Linear(task.weight.shape[1], task.weight.shape[0],
                             bias=task.bias is not None, device="meta")
    linear.weight = torch.nn.Parameter(task.weight, requires_grad=False)
    if task.bias is not None:
        linear.bias = torch.nn.Parameter(task.bias, requires_grad=False)
    x, g = task.inputs, task.grads
    stats = HessianAccumulator(linear.in_features, full=task.settings.needs_hessian)
    stats.add(x)
    y_ref = x @ linear.weight.detach().float().T
    g2 = g.square()
    bias = linear.bias.detach().float() if linear.bias is not None else 0.0
    out: dict[str, float] = {}
    masks: dict = {}  # one mask per sparsity pattern, shared by its precisions
    for choice in task.choices:
        sim = compress_linear(linear, choice, stats, task.settings, masks=masks)
        dy = sim(x) - bias - y_ref
        out[str(choice)] = 0.5 * float((g2 * dy.square()).sum()) / max(task.tokens, 1)
    return ScoreResult(task.layer, out, _outlier_ratio(linear.weight, stats.act_norm()))


def make_task(model, name: str, choices: Sequence[Choice], cap: Captured,
              settings: CompressionSettings) -> ScoreTask:
    """The scoring task of layer `name` from its captures (its weight as it is now)."""
    linear = get_linear(model, name)
    return ScoreTask(name, linear.weight.detach(),
                     linear.bias.detach() if linear.bias is not None else None,
                     cap.inputs[name], cap.grads[name], cap.tokens, tuple(choices), settings)


class ProfileRun:
    """The cached profile, what is left to score, and the write-after-every-layer loop that
    both the in-memory and the streamed calibration feed."""

    def __init__(self, layer_names: Iterable[str], choices: Sequence[Choice], *,
                 model_hash: str, calib_hash: str, settings: CompressionSettings,
                 cache_dir: Path, on_progress: Callable[[int, int], None] | None = None,
                 executor: Executor | None = None) -> None:
        self.executor = executor or SerialExecutor()
        self.path = cache_path(cache_dir, model_hash, calib_hash, settings)
        self.profile = load_cached(self.path, model_hash, calib_hash, settings)
        todo = {n: [c for c in choices if not self.profile.has(n, c)] for n in layer_names}
        self.todo = {n: cs for n, cs in todo.items() if cs or n not in self.profile.outliers}
        self.total = sum(len(cs) for cs in self.todo.values())
        self.done = 0
        self.on_progress = on_progress
        self._report()

    def _report(self) -> None:
        if self.on_progress:
            self.on_progress(self.done, self.total)

    def score(self, tasks: Iterable[ScoreTask], tokens: int) -> None:
        """Run `tasks` on the executor, writing the cache after each finished layer."""
        self.profile.tokens = tokens
        for _i, res in self.executor.imap_unordered(score_task, tasks):
            self.profile.scores.setdefault(res.layer, {}).update(res.scores)
            self.profile.outliers[res.layer] = res.outlier
            write_json_atomic(self.path, self.profile.to_json())  # resumable after every layer
            self.done += len(res.scores)
            self._report()


def build_profile(
    model, layer_names: Iterable[str], choices: Sequence[Choice], calib_batches: Sequence[Tensor],
    *, model_hash: str, calib_hash: str, settings: CompressionSettings, cache_dir: Path,
    seed: int = 0, on_progress: Callable[[int, int], None] | None = None,
    layer_chunk: int | None = None, executor: Executor | None = None,
) -> SensitivityProfile:
    """Profile every layer x choice, resuming from the on-disk cache.

    All layers are captured in one forward+backward pass by default (about 3 GB for
    SmolLM2-135M at 2,048 tokens); `layer_chunk` bounds memory for bigger models at the price
    of one pass per chunk (`autoplan.streaming` bounds it to one block instead). `executor`
    runs the per-layer scoring tasks (serial by default).
    """
    run = ProfileRun(layer_names, choices, model_hash=model_hash, calib_hash=calib_hash,
                     settings=settings, cache_dir=cache_dir, on_progress=on_progress,
                     executor=executor)
    pending = list(run.todo)
    while pending:
        step = layer_chunk or len(pending)
        chunk, pending = pending[:step], pending[step:]
        cap = capture(model, chunk, calib_batches, seed=seed)
        run.score((make_task(model, name, run.todo[name], cap, settings) for name in chunk),
                  cap.tokens)
        del cap
    return run.profile


__all__ = ["OWL_M", "ProfileRun", "ScoreResult", "ScoreTask", "SensitivityProfile", "build_profile",
           "cache_path", "calibration_key", "load_cached", "make_task", "score_task"]
