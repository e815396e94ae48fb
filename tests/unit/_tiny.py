"""Shared helpers for the search, plan and sensitivity tests (no downloads, all in-process).

- a tiny Llama saved as an HF folder (safetensors + fast tokenizer): hidden 64, intermediate
  128 (int4_g64 tiles it), 2 blocks, 4 query / 2 KV heads, vocab 256, untied lm_head, drawn
  with a wide init so compressing one layer moves the output distribution measurably;
- a bigger ModelSpec built from a config dict, with a seeded synthetic sensitivity profile,
  so study tests get realistic cost-model tables without a torch model;
- hand-made Tables (random times and quality costs) for exact-solver comparisons.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from autoplan.compress import CompressionSettings
from autoplan.cost.model import CostModel
from autoplan.formats import Choice
from autoplan.modelspec import LinearLayer, ModelSpec
from autoplan.search import DecisionUnit, SearchSpace, build_space
from autoplan.search.optimize import Tables, build_tables
from autoplan.sensitivity import SensitivityProfile
from autoplan.targets import get_target
from autoplan.workload import Workload
from tests.unit.tiny_llama import tiny_tokenizer

VOCAB = 256
INIT_STD = 0.15
# Small data settings for run_search on the tiny model (seconds, not minutes).
FAST = {"seq_len": 64, "calib_blocks": 2, "eval_blocks": 2}
WORKLOAD = Workload(batch=8, input_len=128, output_len=32)

_shared: dict[str, Path] = {}


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():  # noqa: ANN201 - import into a test module to use
    """Tiny GEMMs on a shared 2-core machine: a second intra-op thread only spins (measured
    ~24 ms vs 0.08 ms for a 128x64x256 linear), so these tests run torch on one thread."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def tiny_config() -> dict:
    return {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": VOCAB, "tie_word_embeddings": False}


def tiny_spec() -> ModelSpec:
    return ModelSpec.from_config(tiny_config(), name="tiny")


def tiny_llama(seed: int = 0):
    """The tiny LlamaForCausalLM in eval mode (deterministic for a seed)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(**{k: v for k, v in tiny_config().items() if k != "model_type"},
                      max_position_embeddings=256, initializer_range=INIT_STD,
                      eos_token_id=1, bos_token_id=1, pad_token_id=0)
    return LlamaForCausalLM(cfg).eval()


def save_tiny_folder(folder: Path, seed: int = 0) -> Path:
    """Write the tiny model (safetensors) and its tokenizer into `folder`; return it."""
    folder.mkdir(parents=True, exist_ok=True)
    tiny_llama(seed).save_pretrained(folder, safe_serialization=True)
    tiny_tokenizer().save_pretrained(folder)
    return folder


def shared_dirs(factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(tiny model folder, autoplan cache folder), built once per test session.

    The cache is shared on purpose: the sensitivity profile of the tiny model is computed
    once and reused by every run_search test. Tests of the cache itself use their own dirs.
    """
    if "model" not in _shared:
        _shared["model"] = save_tiny_folder(factory.mktemp("tiny-llama"))
        _shared["cache"] = factory.mktemp("autoplan-cache")
    return _shared["model"], _shared["cache"]


@pytest.fixture(scope="module", name="model_dir")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201 - Iterator[Path]
    """`model_dir`: the shared tiny model folder, with AUTOPLAN_CACHE set to the shared cache
    (and so exported to subprocesses) for the module's tests. Import into a module to use."""
    folder, cache = shared_dirs(tmp_path_factory)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUTOPLAN_CACHE", str(cache))
        yield folder


# ---- synthetic tables ----------------------------------------------------------------------
def streamed_logits(sm, ids: torch.Tensor, *, block0_args: bool = False  # noqa: ANN001
                    ) -> torch.Tensor:
    """A StreamedModel's logits for `ids`, each block resident in turn (`block0_args`: every
    block gets block 0's arguments, a deliberately wrong run)."""
    from autoplan.streaming.skeleton import BlockArgs

    with torch.no_grad():
        hidden, kwargs = sm.block_inputs(ids)
        assert isinstance(kwargs, BlockArgs) and len(kwargs.per_block) == sm.n_blocks
        for i in range(sm.n_blocks):
            with sm.resident(i):
                hidden = sm.run_block(i, hidden, dict(kwargs) if block0_args else kwargs)
        return sm.logits(hidden)


def search_plan(folder: Path, root: Path, execution: str, monkeypatch: pytest.MonkeyPatch,
                device: str = "cpu", **kw):  # noqa: ANN003, ANN201 - a Plan
    """A fast search of `folder` for h100-sxm / vLLM, `execution` memory or stream, with its
    own cache under `root` (so each run profiles); `kw` overrides the request's fields."""
    from autoplan.search import SearchRequest, run_search
    from autoplan.streaming import ExecutionSettings

    monkeypatch.setenv("AUTOPLAN_CACHE", str(root / f"cache-{execution}"))
    args = {"model": str(folder), "target": "h100-sxm", "runtime": "vllm",
            "budget": "kl<=0.05", "trials": 100, "out": root / f"plan-{execution}.json",
            "workload": WORKLOAD,
            "execution": ExecutionSettings(device=device, execution=execution)}
    return run_search(SearchRequest(**(args | FAST | kw))).plan


def assert_same_plan(streamed, in_memory) -> None:  # noqa: ANN001 - two Plans
    """A streamed search returned the in-memory one's plan, measured quality and audit."""
    assert streamed.decisions == in_memory.decisions
    assert streamed.quality.kl == pytest.approx(in_memory.quality.kl, rel=1e-4, abs=1e-9)
    assert streamed.quality.ppl == pytest.approx(in_memory.quality.ppl, rel=1e-6)
    assert streamed.audit.tensors == in_memory.audit.tensors


def synthetic_profile(space: SearchSpace, seed: int = 0) -> SensitivityProfile:
    """Scores grow as a choice keeps fewer bits, times a per-layer log-normal sensitivity."""
    rng = np.random.default_rng(seed)
    prof = SensitivityProfile("synthetic", "synthetic", CompressionSettings())
    base_bits = space.baseline.bits_per_weight()
    for unit in space.units:
        for layer in unit.layers:
            scale = float(rng.lognormal(mean=-7.0, sigma=1.0))
            prof.outliers[layer.name] = float(rng.uniform(0, 0.02))
            prof.scores[layer.name] = {
                str(c): scale * (base_bits / c.bits_per_weight() - 1) * float(rng.uniform(0.5, 1.5))
                for c in unit.choices if c != space.baseline}
    return prof


def llama_tables(n_layers: int = 8, target: str = "h100-sxm", runtime: str = "vllm",
                 seed: int = 0) -> tuple[Tables, CostModel, SensitivityProfile]:
    """Cost-model tables of a mid-size Llama spec with a synthetic profile (4 units/block)."""
    spec = ModelSpec.from_config({
        "model_type": "llama", "hidden_size": 1024, "intermediate_size": 2816,
        "num_hidden_layers": n_layers, "num_attention_heads": 16, "num_key_value_heads": 4,
        "vocab_size": 32000}, name="mid")
    tgt = get_target(target)
    space = build_space(spec, tgt, runtime)
    profile = synthetic_profile(space, seed)
    cost = CostModel(spec, tgt, Workload(batch=16, input_len=512, output_len=128))
    return build_tables(space, cost, profile), cost, profile


_CHOICES = tuple(Choice.parse(c) for c in (
    "dense+bf16", "dense+fp8_e4m3", "dense+int8", "dense+int4_g64", "2:4+bf16", "2:4+fp8_e4m3"))


def random_tables(n_units: int, n_choices: int, seed: int, output_len: int = 8) -> Tables:
    """Hand-made tables: choice 0 is the baseline (slowest, cost 0); others trade time for
    quality with noise, so some are dominated (as in real tables)."""
    rng = np.random.default_rng(seed)
    choices = _CHOICES[:n_choices]
    units, pre, dec, qual = [], [], [], []
    for u in range(n_units):
        layer = LinearLayer(f"l{u}", "o", u, 64, 64, f"g{u}")
        units.append(DecisionUnit(f"u{u}", (layer,), choices))
        size = rng.uniform(0.5, 2.0)
        speed = np.concatenate([[1.0], rng.uniform(0.3, 0.95, n_choices - 1)])
        damage = np.concatenate([[0.0], (1 - speed[1:]) * rng.lognormal(0, 0.7, n_choices - 1)])
        pre.append(size * speed * 1e-3)
        dec.append(size * speed * 1e-4)
        qual.append(damage * rng.uniform(0.5, 2.0) * 1e-2)
    space = SearchSpace("t", "r", choices[0], tuple(units), ())
    return Tables(space, tuple(pre), tuple(dec), tuple(qual), 1e-3, 1e-4, output_len)


def brute_force(tables: Tables, limit: float) -> tuple[float, tuple[int, ...]]:
    """(min total time, picks) under the limit by enumerating every combination."""
    sizes = [len(q) for q in tables.quality]
    best = (float("inf"), ())
    for picks in itertools.product(*(range(s) for s in sizes)):
        if tables.surrogate(picks) <= limit + 1e-15:
            t = total_time(tables, picks)
            if t < best[0]:
                best = (t, picks)
    return best


def total_time(tables: Tables, picks) -> float:  # noqa: ANN001 - sequence of ints
    return sum(float(tables.total_time(u)[c]) for u, c in enumerate(picks))
