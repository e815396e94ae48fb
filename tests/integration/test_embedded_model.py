"""The embedded SmolLM2-135M (alias smollm2-135m): conversion, layer graph, hash, quality.

Uses the real cache (``$AUTOPLAN_CACHE`` or ~/.cache/autoplan): the first run converts the
GGUF (~35 s on 2 cores), later runs load the cached safetensors folder in under a second.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from autoplan.modelspec import ModelSpec
from autoplan.models import load_model, load_spec, verify_layer_graph, weights_hash
from autoplan.quality import QualityEvaluator, load_text_dataset
from tests.integration._embedded import needs_embedded

pytestmark = pytest.mark.slow

needs_weights = needs_embedded


@pytest.fixture(scope="module")
def loaded():
    torch.set_num_threads(2)
    return load_model("smollm2-135m")


@needs_weights
def test_converts_and_loads(loaded):
    source = json.loads((loaded.path / "autoplan_source.json").read_text())
    blocks = json.loads((loaded.path / "config.json").read_text())["num_hidden_layers"]
    # per block 7 linear weights (Q4_1 in this file) and 2 norms; then the token embedding
    # and the final norm (lm_head is tied to the embedding)
    assert source["gguf_tensors"] == 9 * blocks + 2
    assert source["four_bit_tensors"] == 7 * blocks
    assert loaded.path.name.startswith("smollm2-135m-")
    assert loaded.model_id == "smollm2-135m"


@needs_weights
def test_layer_graph_matches_config(loaded):
    blocks = loaded.model.config.num_hidden_layers
    assert len(loaded.spec.layers) == 7 * blocks + 1  # q k v o gate up down per block, lm_head
    verify_layer_graph(loaded.model, loaded.spec)
    shipped = ModelSpec.from_path(Path(__file__).parents[2] / "examples/configs/smollm2-135m.json")
    assert loaded.spec.layers == shipped.layers
    assert load_spec("smollm2-135m").layers == shipped.layers


@needs_weights
def test_hash_stable(loaded):
    assert weights_hash(loaded.path) == loaded.content_hash
    assert load_model("smollm2-135m").content_hash == loaded.content_hash


@needs_weights
def test_ppl_plausible_and_self_kl_zero(loaded):
    data = load_text_dataset(tokenizer=loaded.tokenizer, n_calib=0, n_eval=4)
    ev = QualityEvaluator(loaded.model, data.eval)
    res = ev.evaluate(loaded)
    assert res.kl == 0.0
    assert math.isfinite(res.ppl) and 5 < res.ppl < 40  # measured 15.1 on the default 8 blocks
    assert res.ppl == res.ppl_ref
