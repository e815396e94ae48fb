"""GGUF export of gpt-oss plans (llama.cpp's `gpt-oss` layout, the source GGUF written by
gguf-py as convert_hf_to_gguf.py writes it, tests/unit/_tiny_gptoss_gguf.py): each expert's
interleaved gate_up goes back to `ffn_gate_exps` / `ffn_up_exps` (or the fused
`ffn_gate_up_exps`) in the planned type, kept MXFP4 experts byte for byte, and the file reads back
through autoplan's own GGUF reader as the plan's simulated weights; where the llama.cpp engine
is installed, llama.cpp runs it with the logits autoplan simulates."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from autoplan.compress import CompressionSettings, compressed_copy
from autoplan.engines import engine_status
from autoplan.export import export_plan
from autoplan.export.gguf import read_audit
from autoplan.formats import Choice
from autoplan.models import LoadedModel, load_model
from autoplan.models.gguf_convert import convert_gguf
from autoplan.models.registry import ModelSource
from tests.unit._tiny_gptoss_gguf import write_gptoss_gguf
from tests.unit._tiny_moe import EXPERTS, tiny_moe_model
from tests.unit.test_export_common import make_plan

gguf = pytest.importorskip("gguf")
needs_engine = pytest.mark.skipif(not engine_status("llama.cpp").installed,
                                  reason="the llama.cpp engine is not installed "
                                         "(autoplan engines install llama.cpp)")
# yarn with factor 1 is plain RoPE in transformers and in llama.cpp alike: at other factors
# llama.cpp rounds the yarn correction range (docs/modules.md), which is not the export's doing
_ROPE = {"rope_type": "yarn", "factor": 1.0, "beta_fast": 32.0, "beta_slow": 1.0,
         "truncate": False, "original_max_position_embeddings": 64, "rope_theta": 150000.0}
_VOCAB = 264
_SETTINGS = CompressionSettings("magnitude", "rtn")
# every type a GGUF block simulation owns, on every kind of layer
_PLANNED = {("gate_up_proj", 0): "dense+q8_0", ("down_proj", 0): "dense+q4_0",
            ("gate_up_proj", 1): "dense+q5_1", ("down_proj", 1): "dense+q8_0",
            "q_proj": "dense+q8_0", "k_proj": "dense+q4_1", "v_proj": "dense+q5_0",
            "o_proj": "dense+q8_0", "lm_head": "dense+q8_0"}


def _tensors(path: Path) -> dict:
    return {t.name: t for t in gguf.GGUFReader(str(path)).tensors}


def _deq(t) -> torch.Tensor:  # noqa: ANN001 - a gguf ReaderTensor
    return torch.from_numpy(gguf.dequantize(t.data, t.tensor_type).copy()).float()


def gptoss_source(root: Path, *, fused: bool = False, mxfp4: bool = True
            ) -> tuple[LoadedModel, dict[str, torch.Tensor]]:
    model = tiny_moe_model("gpt_oss", rope_parameters=_ROPE, vocab_size=_VOCAB)
    src = root / "gpt-oss.gguf"
    hf = write_gptoss_gguf(model, src, fused=fused, mxfp4=mxfp4)
    folder = convert_gguf(src, root / "hf")
    got = load_model(str(folder))
    return LoadedModel(got.model, got.tokenizer, got.spec, "tiny", got.content_hash, folder,
                       ModelSource("gguf", src, "tiny")), hf


def plan_decisions(loaded: LoadedModel, experts: str | None = None) -> dict[str, str]:
    out = {}
    for layer in loaded.spec.layers:
        proj = layer.name.rsplit(".", 1)[-1]
        if layer.expert >= 0:
            out[layer.name] = experts or _PLANNED[(proj, layer.block)]
        else:
            out[layer.name] = _PLANNED[proj]
    return out


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """The tiny gpt-oss GGUF, loaded; its plan in GGUF block types exported as llama.cpp's
    layout; the plan's simulated layers."""
    root = tmp_path_factory.mktemp("gptoss_export")
    loaded, _ = gptoss_source(root)
    decisions = plan_decisions(loaded)
    out = export_plan(make_plan(loaded, decisions, target="local", runtime="llama.cpp"),
                      loaded, "gguf", root / "plan.gguf")
    _, sims = compressed_copy(loaded.model, {n: Choice.parse(c) for n, c in decisions.items()},
                              None, _SETTINGS)
    return loaded, out, sims


def _check_read_back(exported: Path, dest: Path, loaded: LoadedModel, sims: dict) -> None:
    """autoplan's GGUF reader gives every planned layer its simulated weight bit for bit and
    every other parameter (biases, sinks, router, norms, embedding) as the source has it."""
    back = load_model(str(convert_gguf(exported, dest))).model.state_dict()
    for name, value in loaded.model.state_dict().items():
        layer = name.removesuffix(".weight")
        want = sims[layer].weight if layer in sims else value
        assert torch.equal(back[name], want.float()), name


def test_gate_up_splits_into_the_planned_stacked_tensors_and_reads_back_exactly(
        planned, tmp_path) -> None:  # noqa: ANN001
    loaded, out, sims = planned
    dst, src = _tensors(out), _tensors(loaded.source.path)
    assert set(dst) == set(src)  # convert_hf_to_gguf.py's tensors, no more, no fewer
    for block in range(2):
        for proj in ("gate_up_proj", "down_proj"):
            planned_type = _PLANNED[(proj, block)].split("+")[1].upper()
            parts = {"gate": slice(0, None, 2), "up": slice(1, None, 2)} \
                if proj == "gate_up_proj" else {"down": slice(None)}
            for part, rows in parts.items():
                t = dst[f"blk.{block}.ffn_{part}_exps.weight"]
                assert t.tensor_type.name == planned_type
                got = _deq(t)
                for e in range(EXPERTS):
                    want = sims[f"model.layers.{block}.mlp.experts.{e}.{proj}"].weight[rows]
                    assert torch.equal(got[e].reshape(want.shape), want), (block, part, e)
        for kind in ("attn_sinks.weight", "ffn_gate_inp.weight", "ffn_gate_inp.bias",
                     "ffn_gate_exps.bias", "ffn_up_exps.bias", "ffn_down_exps.bias",
                     "attn_q.bias"):  # copied from the source byte for byte
            name = f"blk.{block}.{kind}"
            assert dst[name].tensor_type == src[name].tensor_type
            assert np.array_equal(np.asarray(dst[name].data), np.asarray(src[name].data)), name
    # a Q8_0 tensor is gguf-py's own Q8_0 of the simulated weights, byte for byte
    sim = sims["model.layers.0.mlp.experts.1.gate_up_proj"].weight
    ref = gguf.quantize(sim[0::2].numpy(), gguf.GGMLQuantizationType.Q8_0)
    assert np.array_equal(np.asarray(dst["blk.0.ffn_gate_exps.weight"].data)[1], ref)
    _check_read_back(out, tmp_path / "back", loaded, sims)


def mxfp4_export(root: Path, *, fused: bool = False, mxfp4: bool = True):  # noqa: ANN202
    """The tiny gpt-oss with its experts planned gguf_mxfp4 (ggml's MXFP4; the rest as
    _PLANNED), exported for llama.cpp: (loaded, the source's HF MXFP4 tensors, simulated
    layers, file, the audit's GGUF tensors)."""
    loaded, hf = gptoss_source(root, fused=fused, mxfp4=mxfp4)
    decisions = plan_decisions(loaded, experts="dense+gguf_mxfp4")
    out = export_plan(make_plan(loaded, decisions, target="local", runtime="llama.cpp"),
                      loaded, "gguf", root / "plan.gguf")
    choices = {n: Choice.parse(c) for n, c in decisions.items()}
    _, sims = compressed_copy(loaded.model, choices, None, _SETTINGS)
    return loaded, hf, sims, out, read_audit(out)["gguf_tensors"]


@pytest.mark.parametrize(("fused", "mxfp4"), [(False, True), (True, True), (False, False)],
                         ids=["gate+up", "gate_up", "float-experts"])
def test_mxfp4_experts_are_written_as_ggml_mxfp4(tmp_path, fused, mxfp4) -> None:
    """The export of a plan with gguf_mxfp4 experts: the source's MXFP4 experts, which
    gguf_mxfp4 reproduces exactly, go back byte for byte; float experts planned gguf_mxfp4
    as the plan's own codes and scales (ggml's quantizer's bytes); both read back as the
    simulated weights."""
    loaded, hf, sims, out, audit = mxfp4_export(tmp_path, fused=fused, mxfp4=mxfp4)
    dst, src = _tensors(out), _tensors(loaded.source.path)
    assert set(dst) == set(src)
    experts = [n for n in dst if n.endswith("_exps.weight")]
    assert len(experts) == (4 if fused else 6)
    for name in experts:
        assert dst[name].tensor_type == gguf.GGMLQuantizationType.MXFP4, name
        assert audit[name]["type"] == "MXFP4"
        if mxfp4:  # the source's own bytes, not a re-encoding
            assert np.array_equal(np.asarray(dst[name].data), np.asarray(src[name].data)), name
        else:  # ggml's own MXFP4 of the float experts, byte for byte
            ref = gguf.quantize(_deq(src[name]).numpy(), gguf.GGMLQuantizationType.MXFP4)
            assert np.array_equal(np.asarray(dst[name].data).reshape(ref.shape), ref), name
    if fused:  # all gate rows, then all up rows
        got = _deq(dst["blk.1.ffn_gate_up_exps.weight"])
        want = sims["model.layers.1.mlp.experts.2.gate_up_proj"].weight
        assert torch.equal(got[2].reshape(want.shape), torch.cat([want[0::2], want[1::2]]))
    folder = tmp_path / "back"
    _check_read_back(out, folder, loaded, sims)
    if mxfp4:  # read back as the released checkpoint's MXFP4 blocks and scales, unchanged
        from safetensors.torch import load_file

        saved = load_file(str(folder / "model.safetensors"))
        for key, value in hf.items():
            if key.endswith(("_blocks", "_scales")):
                assert torch.equal(saved[key], value), key


def kl(p: torch.Tensor, q: torch.Tensor) -> float:
    """KL(p || q) of two [tokens, vocab] logits, nats per token."""
    lp, lq = p.double().log_softmax(-1), q.double().log_softmax(-1)
    return float((lp.exp() * (lp - lq)).sum(-1).mean())


TOKENS = torch.randint(2, _VOCAB, (48,), generator=torch.Generator().manual_seed(0))


def simulated_logits(loaded: LoadedModel, decisions: dict[str, str] | None) -> torch.Tensor:
    """autoplan's logits on TOKENS: the plan `decisions` simulated (None: the model)."""
    model = loaded.model if decisions is None else compressed_copy(
        loaded.model, {n: Choice.parse(c) for n, c in decisions.items()}, None, _SETTINGS)[0]
    with torch.no_grad():
        return model(input_ids=TOKENS[None]).logits[0]


def engine_logits(path: Path) -> torch.Tensor:
    """llama.cpp's logits on TOKENS (one thread, fp32 KV cache: only the weights and ggml's
    activation rounding differ from the simulation)."""
    from autoplan.engines.llamacpp import LlamaCppWorker

    with LlamaCppWorker(path, n_ctx=64, logits_all=True, kv_f32=True, threads=1) as worker:
        return torch.from_numpy(worker.logits(TOKENS.numpy())).float()


def _agree(engine: torch.Tensor, simulated: torch.Tensor, ref: torch.Tensor) -> None:
    kl_sim = kl(ref, simulated)
    assert kl_sim > 1e-3  # the plan is lossy enough for the comparison to mean something
    assert kl(simulated, engine) < 0.05 * kl_sim
    assert abs(kl(ref, engine) - kl_sim) < 0.15 * kl_sim
    # a random tiny model's logits are flat: near-ties flip on the rounding noise
    assert (engine.argmax(-1) == simulated.argmax(-1)).float().mean() > 0.85


@needs_engine
def test_llama_cpp_runs_the_exported_gptoss_with_the_simulated_logits(planned) -> None:  # noqa: ANN001
    """llama.cpp on the export against autoplan's simulation of the plan. At position 0 (no
    rotation, one key) the two agree to fp32 summation order; later positions decorrelate
    slightly through the int8 activation rounding both do per block of 32 (a code flips on
    an ulp-level difference), as on the embedded model (tests/integration/
    test_gguf_embedded.py). A layout error (gate and up swapped, another nibble order, a
    missing bias or sink) moves the logits by far more."""
    loaded, out, _ = planned
    simulated = simulated_logits(loaded, plan_decisions(loaded))
    engine = engine_logits(out)
    assert (engine[0] - simulated[0]).abs().max() < 1e-4 * simulated.abs().max()
    _agree(engine, simulated, simulated_logits(loaded, None))


@needs_engine
def test_llama_cpp_runs_the_mxfp4_experts_as_gguf_mxfp4_simulates(tmp_path) -> None:
    """llama.cpp on the export with the source's MXFP4 experts, against autoplan's
    gguf_mxfp4 simulation of the plan (MXFP4 weights, Q8_0 inputs): position 0 agrees to
    fp32 summation order, as for the other GGUF types. The experts at their MXFP4 values with
    unrounded inputs miss ggml's Q8_0 rounding (1 % of a logit at position 0), and vLLM's
    mxfp4 (MXFP4 inputs) is further still from what llama.cpp computes."""
    loaded, _, _, out, _ = mxfp4_export(tmp_path)
    engine = engine_logits(out)
    simulated = simulated_logits(loaded, plan_decisions(loaded, experts="dense+gguf_mxfp4"))
    assert (engine[0] - simulated[0]).abs().max() < 1e-4 * simulated.abs().max()
    _agree(engine, simulated, simulated_logits(loaded, None))
    exact = {n: "dense+fp32" if ".experts." in n else c
             for n, c in plan_decisions(loaded).items()}
    unrounded = simulated_logits(loaded, exact)
    assert (engine[0] - unrounded[0]).abs().max() > 1e-3 * unrounded.abs().max()
    w4a4 = simulated_logits(loaded, plan_decisions(loaded, experts="dense+mxfp4"))
    assert kl(w4a4, engine) > 10 * kl(simulated, engine)


def test_a_source_without_the_gate_or_up_stack_is_refused_naming_it(tmp_path) -> None:
    """The exporter writes each planned stack into the source's own tensor; a source that
    lacks one is an error naming the tensor and the fix, before anything is written."""
    from autoplan.errors import AutoplanError
    from autoplan.export._prepare import prepare
    from autoplan.export.gguf import _gptoss_gate_up

    loaded, _ = gptoss_source(tmp_path)
    plan = make_plan(loaded, plan_decisions(loaded), target="local", runtime="llama.cpp")
    prep = prepare(plan, loaded, "gguf", ("llama.cpp",))
    by_name = _tensors(loaded.source.path)
    assert set(_gptoss_gate_up(prep, by_name)) == {
        f"blk.{b}.ffn_{p}_exps.weight" for b in range(loaded.spec.n_layers) for p in ("gate", "up")}
    del by_name["blk.1.ffn_up_exps.weight"]
    with pytest.raises(AutoplanError, match=r"holds no blk\.1\.ffn_up_exps\.weight: "
                                            r"re-convert .*convert_hf_to_gguf"):
        _gptoss_gate_up(prep, by_name)
