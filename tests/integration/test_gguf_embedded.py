"""GGUF on the embedded SmolLM2 (a Q4_1 GGUF): keeping a tensor in Q4_1 is exactly lossless,
the export stores the source's blocks byte for byte, and -- where the llama.cpp engine is
installed -- llama.cpp computes what autoplan simulates.

The engine checks are skipped without the engine (CI does not build it: the llama-cpp-python
compile takes ~25 minutes); `autoplan engines install llama.cpp` enables them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from autoplan.engines import engine_status
from tests.integration._embedded import needs_embedded

pytestmark = [pytest.mark.slow, needs_embedded]
needs_engine = pytest.mark.skipif(not engine_status("llama.cpp").installed,
                                  reason="autoplan engines install llama.cpp")


@pytest.fixture(scope="module")
def loaded():
    from autoplan.models import load_model

    return load_model("smollm2-135m")


def _plan(loaded, decisions):
    from tests.unit.test_export_common import make_plan

    return make_plan(loaded, decisions, target="local", runtime="llama.cpp")


def test_source_types_are_lossless_and_exported_byte_for_byte(loaded, tmp_path):
    from gguf import GGUFReader

    from autoplan.engines.ggml_microbench import source_decisions
    from autoplan.export._prepare import prepare
    from autoplan.export.gguf import write_gguf
    from autoplan.models.graph import get_linear

    source = source_decisions(loaded)
    assert set(source.values()) == {"dense+q4_1", "dense+q8_0"}  # lm_head: the Q8_0 embedding
    plan = _plan(loaded, source)
    prep = prepare(plan, loaded, "gguf", ("llama.cpp",))
    for name, sim in prep.sims.items():  # requantizing the Q4_1 (Q8_0) values changes nothing
        assert torch.equal(sim.weight, get_linear(loaded.model, name).weight.float()), name
    write_gguf(prep, tmp_path / "keep.gguf")
    src = {t.name: t for t in GGUFReader(str(loaded.source.path)).tensors}
    dst = {t.name: t for t in GGUFReader(str(tmp_path / "keep.gguf")).tensors}
    assert set(dst) == set(src)
    for name, t in src.items():
        assert dst[name].tensor_type == t.tensor_type
        assert np.array_equal(np.asarray(dst[name].data), np.asarray(t.data)), name


def test_every_gguf_type_equals_gguf_quants_on_real_weights(loaded):
    import gguf

    from autoplan.models.graph import get_linear
    from autoplan.quant import quantize_weight
    from autoplan.formats.gguf_blocks import gguf_formats, pack_blocks

    FORMATS = gguf_formats()

    for name in ("model.layers.0.self_attn.k_proj", "model.layers.17.mlp.down_proj"):
        w = get_linear(loaded.model, name).weight.detach()
        for precision, fmt in FORMATS.items():
            qtype = gguf.GGMLQuantizationType[fmt.ggml_type]
            ref = gguf.quantize(w.numpy(), qtype)
            qw = quantize_weight(w, precision)
            assert torch.equal(qw.dequant, torch.from_numpy(gguf.dequantize(ref, qtype)))
            assert np.array_equal(pack_blocks(qw.codes, qw.scales["weight_scale"],
                                              qw.scales.get("weight_min"), fmt), ref)


@needs_engine
def test_ggml_mul_mat_equals_the_simulated_layer_for_every_gguf_type(loaded):
    from autoplan.engines.ggml_microbench import GGML_TYPE_IDS
    from autoplan.engines.llamacpp import GgmlWorker
    from autoplan.formats import Choice
    from autoplan.models.graph import get_linear
    from autoplan.quant import SimulatedLinear

    linear = get_linear(loaded.model, "model.layers.3.mlp.down_proj")
    x = torch.randn(4, linear.in_features, generator=torch.Generator().manual_seed(0)) * 2
    with GgmlWorker() as worker:
        for precision, ggml_type in GGML_TYPE_IDS.items():
            sim = SimulatedLinear.from_linear(linear, Choice.parse(precision.value))
            with torch.no_grad():
                want = sim(x).double()
            got = torch.from_numpy(worker.matmul(linear.weight.detach().numpy(), x.numpy(),
                                                 ggml_type)).double()
            # fp32 summation order only: ~1e-7 of the largest output; without the simulated
            # activation rounding the gap is 1e-4 (fp16) to 6e-3 (4-bit types)
            assert (got - want).abs().max() / want.abs().max() < 3e-6, precision.value


@needs_engine
def test_exported_plan_runs_in_llama_cpp_with_the_simulated_quality(loaded, tmp_path):
    """End to end, llama.cpp's KL to the original equals the simulated KL up to the noise
    floor of per-layer activation rounding: every layer rounds its input to int8, so
    ulp-level differences in norms/softmax/SiLU flip codes and the two runs decorrelate by
    KL ~0.004 nats (the same as the simulation perturbed by 1e-7 relative noise)."""
    from autoplan.compress import CompressionSettings, compressed_copy
    from autoplan.engines.llamacpp import LlamaCppWorker
    from autoplan.export import export_plan
    from autoplan.formats import Choice
    from autoplan.quality.text import load_text_dataset

    decisions = {layer.name: {"down": "dense+q5_0", "o": "dense+fp16", "v": "dense+q8_0",
                              "gate": "dense+q4_0", "lm_head": "dense+q5_1"}
                 .get(layer.role, "dense+q4_1") for layer in loaded.spec.layers}
    out = export_plan(_plan(loaded, decisions), loaded, "gguf", tmp_path / "plan.gguf")
    sim, _ = compressed_copy(loaded.model, {n: Choice.parse(c) for n, c in decisions.items()},
                             None, CompressionSettings("magnitude", "rtn"))
    block = load_text_dataset(None, tokenizer=loaded.tokenizer, seq_len=256, n_calib=1,
                              n_eval=1, seed=0).eval[0]

    def kl(p: torch.Tensor, q: torch.Tensor) -> float:
        lp, lq = torch.log_softmax(p.double(), -1), torch.log_softmax(q.double(), -1)
        return float((lp.exp() * (lp - lq)).sum(-1).mean())

    with torch.no_grad():
        ref = loaded.model(input_ids=block[None]).logits[0]
        simulated = sim(input_ids=block[None]).logits[0]
    with LlamaCppWorker(out, n_ctx=256, logits_all=True) as worker:
        engine = torch.from_numpy(worker.logits(block.numpy()))
    kl_sim, kl_engine = kl(ref, simulated), kl(ref, engine)
    assert kl_sim > 0.02  # the plan is lossy enough for the comparison to mean something
    assert abs(kl_engine - kl_sim) < 0.15 * kl_sim
    assert kl(simulated, engine) < 0.01
    assert (engine.argmax(-1) == simulated.argmax(-1)).float().mean() > 0.9
