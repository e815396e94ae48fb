"""The sensitivity profile: for every layer x choice, a quality cost in KL nats per token.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from autoplan.compress import CompressionSettings, compress_linear
from autoplan.formats import Choice, Precision
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
    # MoE: block -> calibration tokens routed to each expert (the cost model's routing shares)
    routing: dict[str, list[int]] = field(default_factory=dict)
    # KV-cache formats: sensitivity.kv's unit (one per block) -> its key -> KL estimate
    kv: dict[str, dict[str, float]] = field(default_factory=dict)

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
            "scores": self.scores, "outliers": self.outliers, "routing": self.routing,
            "kv": self.kv,
        }

    @classmethod
    def from_json(cls, raw: dict) -> SensitivityProfile:
        return cls(raw["model_hash"], raw["calib_hash"], CompressionSettings(**raw["settings"]),
                   raw.get("tokens", 0), raw.get("scores", {}), raw.get("outliers", {}),
                   raw.get("routing", {}), raw.get("kv", {}))


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
    if x.shape[0] == 0:  # a routed expert no calibration token picked: no loss in any format
        return ScoreResult(task.layer, {str(c): 0.0 for c in task.choices}, 0.0)
    stats = HessianAccumulator(linear.in_features, full=task.settings.needs_hessian)
    stats.add(x)
    y_ref = x @ linear.weight.detach().float().T
    g2 = g.square()
    bias = linear.bias.detach().float() if linear.bias is not None else None
    out: dict[str, float] = {}
    masks: dict = {}  # one mask per sparsity pattern, shared by its precisions
    inputs = _QUANTIZED_INPUTS.of(x)  # x as each precision's kernel reads it, made once
    for choice in task.choices:
        sim = compress_linear(linear, choice, stats, task.settings, masks=masks,
                              with_codes=False)
        if choice.precision not in inputs:  # e.g. dense and 2:4 fp8_e4m3 share one
            inputs[choice.precision] = sim.quantize_input(x)
        y = sim.forward_quantized(x, inputs[choice.precision])
        out[str(choice)] = _fisher_score(y, bias, y_ref, g2, task.tokens)
    return ScoreResult(task.layer, out, _outlier_ratio(linear.weight, stats.act_norm()))


class _LastInputs:
    """The fake-quantized versions of the last captured input tensor scored.

    Layers that read one tensor (q/k/v, gate/up: `Recorder.result` hands them the same
    object) are scored one after the other, so remembering the last input's versions lets
    them share one activation quantization per precision. Identity, not equality, is the
    key (a weak reference, so the captures are not kept alive), and the versions are dropped
    as soon as that tensor is freed or a different one comes.
    """

    def __init__(self) -> None:
        self._ref: weakref.ref | None = None
        self._version = -1
        self._by_precision: dict[Precision, Tensor] = {}

    def of(self, x: Tensor) -> dict[Precision, Tensor]:
        if self._ref is None or self._ref() is not x or self._version != x._version:
            self._by_precision = by_precision = {}
            self._ref = weakref.ref(x, lambda _dead: by_precision.clear())
            self._version = x._version
        return self._by_precision


_QUANTIZED_INPUTS = _LastInputs()


def _fisher_score(y: Tensor, bias: Tensor | None, y_ref: Tensor, g2: Tensor,
                  tokens: int) -> float:
    """1/2 mean_t sum_j G^2 dY^2 with dY = y - bias - y_ref, overwriting the fresh output `y`.

    In place, step for step the out-of-place `g2 * (y - bias - y_ref).square()`: the same
    bits without three full-size [tokens, out] copies (without a bias, y - 0.0 is y).
    """
    dy = y if bias is None else y - bias
    dy.sub_(y_ref).square_().mul_(g2)
    return 0.5 * float(dy.sum()) / max(tokens, 1)


def make_task(model, name: str, choices: Sequence[Choice], cap: Captured,
              settings: CompressionSettings) -> ScoreTask:
    """The scoring task of layer `name` from its captures (its weight as it is now)."""
    linear = get_linear(model, name)
    return ScoreTask(name, linear.weight.detach(),
                     linear.bias.detach() if linear.bias is not None else None,
                     cap.inputs[name], cap.grads[name], cap.tokens, tuple(choices), settings)


# The choices to score: the same for every layer, or per layer (a layer absent: none)
LayerChoices = Sequence[Choice] | Mapping[str, Sequence[Choice]]


def choices_of(choices: LayerChoices, layer: str) -> Sequence[Choice]:
    """The choices a layer is scored for."""
    return choices.get(layer, ()) if isinstance(choices, Mapping) else choices


class ProfileRun:
    """The cached profile, what is left to score, and the write-after-every-layer loop that
    both the in-memory and the streamed calibration feed."""

    def __init__(self, layer_names: Iterable[str], choices: LayerChoices, *,
                 model_hash: str, calib_hash: str, settings: CompressionSettings,
                 cache_dir: Path, on_progress: Callable[[int, int], None] | None = None,
                 executor: Executor | None = None) -> None:
        self.executor = executor or SerialExecutor()
        self.path = cache_path(cache_dir, model_hash, calib_hash, settings)
        self.profile = load_cached(self.path, model_hash, calib_hash, settings)
        todo = {n: [c for c in choices_of(choices, n) if not self.profile.has(n, c)]
                for n in layer_names}
        self.todo = {n: cs for n, cs in todo.items() if cs or n not in self.profile.outliers}
        self.total = sum(len(cs) for cs in self.todo.values())
        self.done = 0
        self.on_progress = on_progress
        self._report()

    def _report(self) -> None:
        if self.on_progress:
            self.on_progress(self.done, self.total)

    def score(self, tasks: Iterable[ScoreTask], tokens: int,
              routing: dict[str, list[int]] | None = None) -> None:
        """Run `tasks` on the executor, writing the cache after each finished layer (and the
        pass's MoE routing counts, the first time a pass records them)."""
        self.profile.tokens = tokens
        if routing and not self.profile.routing:
            self.profile.routing = dict(routing)
        for _i, res in self.executor.imap_unordered(score_task, tasks):
            self.profile.scores.setdefault(res.layer, {}).update(res.scores)
            self.profile.outliers[res.layer] = res.outlier
            write_json_atomic(self.path, self.profile.to_json())  # resumable after every layer
            self.done += len(res.scores)
            self._report()


def build_profile(
    model, layer_names: Iterable[str], choices: LayerChoices, calib_batches: Sequence[Tensor],
    *, model_hash: str, calib_hash: str, settings: CompressionSettings, cache_dir: Path,
    seed: int = 0, on_progress: Callable[[int, int], None] | None = None,
    layer_chunk: int | None = None, executor: Executor | None = None,
) -> SensitivityProfile:
    """Profile every layer x choice (``choices`` per layer when a mapping), resuming from
    the on-disk cache.

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
                  cap.tokens, cap.routing)
        del cap
    return run.profile


__all__ = ["OWL_M", "LayerChoices", "ProfileRun", "ScoreResult", "ScoreTask", "SensitivityProfile", "build_profile",
           "cache_path", "calibration_key", "choices_of", "load_cached", "make_task",
           "score_task"]
