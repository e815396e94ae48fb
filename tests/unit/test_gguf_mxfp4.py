"""gguf_mxfp4, ggml's MXFP4 as ggml-cpu runs it: weights and bytes bit-equal to gguf-py's
MXFP4 quantizer (ggml's quantize_row_mxfp4_ref) and to hand-made blocks, a GGUF MXFP4
tensor's values kept exactly, Q8_0 inputs; offered by llama.cpp on x86 CPUs only; where the
engine is installed, ggml's own quantize + mul_mat against the simulated layer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from autoplan.engines import engine_status
from autoplan.errors import UnsupportedFormatError
from autoplan.export.gguf import ggml_type_name, mxfp4_blocks
from autoplan.formats import Choice, Precision
from autoplan.formats.elements import decode_e8m0
from autoplan.formats.gguf_blocks import ggml_mxfp4_exponent
from autoplan.quant import SimulatedLinear, gptq_quantize, quantize_weight
from autoplan.quant.activations import quantize_activation
from autoplan.runtimes import supports
from autoplan.targets import get_target

gguf = pytest.importorskip("gguf")
MX = Precision.GGUF_MXFP4
QTYPE = gguf.GGMLQuantizationType.MXFP4
needs_engine = pytest.mark.skipif(not engine_status("llama.cpp").installed,
                                  reason="the llama.cpp engine is not installed "
                                         "(autoplan engines install llama.cpp)")


def _below(value: float, ulps: int) -> np.float32:
    x = np.float32(value)
    for _ in range(ulps):
        x = np.nextafter(x, np.float32(0))
    return x


def _weights(seed: int = 0) -> torch.Tensor:
    """Random rows, then blocks where the rules differ: exact midpoints of the E2M1 grid,
    negative values that round to zero, an all-zero block, and largest magnitudes a few
    floats below a power of two (where log2f rounds up to the power)."""
    gen = torch.Generator().manual_seed(seed)
    rows = [torch.randn(24, 128, generator=gen) * 0.05]
    grid = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 7.0, 0.1, 0.26, 1.74,
                         3.49, 4.99, 5.01, 2.51, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, -0.0, 0.0,
                         -0.1, -0.25, -0.75, -2.5, -3.5, -5.0, -1.75, -0.24])
    rows.append(torch.stack([grid, grid * -3.0, grid * 1.7, torch.zeros(32)])
                .repeat(1, 4) * 2.0**-4)
    near = [torch.linspace(-0.7, 0.7, 32) * float(_below(2.0**k, u))
            for k in (-9, -5, -3, 3, 6) for u in (1, 2, 3)]
    for r, (k, u) in zip(near, [(k, u) for k in (-9, -5, -3, 3, 6) for u in (1, 2, 3)]):
        r[7] = float(_below(2.0**k, u))
    rows.append(torch.stack(near).repeat(1, 4))
    return torch.cat(rows)


def test_weights_and_bytes_equal_gguf_quants():
    for seed in range(3):
        w = _weights(seed)
        qw = quantize_weight(w, MX)
        ref = gguf.quantize(w.numpy(), QTYPE)
        packed = mxfp4_blocks(qw.codes, qw.scales["weight_scale"])
        assert packed.shape == ref.shape and np.array_equal(packed, ref)
        assert torch.equal(qw.dequant, torch.from_numpy(gguf.dequantize(ref, QTYPE)))
    block, size = gguf.GGML_QUANT_SIZES[QTYPE]
    assert (block, size * 8 / block) == (MX.info.group, MX.info.weight_bits)


def test_a_hand_computed_block():
    """amax 6 * 2**-4: exponent floor(log2(0.375)) - 2 = -4 (byte 123); ties go to the
    smaller magnitude (0.75 -> 0.5, 2.5 -> 2, 5 -> 4: not to even), beyond 6 saturates,
    and a negative value that rounds to zero is stored +0 (code 0, not 8)."""
    x = torch.tensor([0.75, 2.5, 5.0, 1.75, 3.5, 7.0, -0.2, -2.5, 6.0, 0.25] + [0.0] * 22)
    qw = quantize_weight((x * 2.0**-4).reshape(1, 32), MX)
    assert qw.scales["weight_scale"].tolist() == [[123]]
    values = [0.5, 2.0, 4.0, 1.5, 3.0, 6.0, 0.0, -2.0, 6.0, 0.0]
    assert (qw.dequant[0, :10] * 2.0**4).tolist() == values
    codes = qw.codes[0, :10].tolist()
    assert codes == [1, 4, 6, 3, 5, 7, 0, 12, 7, 0]  # E2M1, sign in bit 3
    packed = mxfp4_blocks(qw.codes, qw.scales["weight_scale"])[0]
    assert packed[0] == 123 and packed[1] == 1 and packed[2] == 4  # element j: low nibble
    assert np.array_equal(packed, gguf.quantize((x * 2.0**-4).numpy()[None], QTYPE)[0])


def test_the_exponent_is_ggml_floorf_log2f():
    """log2f rounds log2 of the float just below 2**-2 up to -2.0: ggml stores byte 123
    there, where the exact floor (and vLLM's mxfp4) would give 122 and saturate at 6."""
    amax = torch.tensor([float(_below(0.25, 1)), 0.25, float(_below(0.25, 40)), 6.0, 0.0])
    assert ggml_mxfp4_exponent(amax).tolist() == [123, 123, 122, 127, 0]
    w = torch.full((1, 32), float(_below(0.25, 1)))
    qw = quantize_weight(w, MX)
    assert qw.dequant[0, 0].item() == 0.25  # 4 * 2**-4, not 6 * 2**-5
    assert np.array_equal(mxfp4_blocks(qw.codes, qw.scales["weight_scale"]),
                          gguf.quantize(w.numpy(), QTYPE))


def test_a_gguf_mxfp4_tensor_is_kept_exactly():
    """Any block_mxfp4 (gpt-oss's experts as the GGUF stores them) dequantized and
    requantized gives the same values: the model "as is" is a gguf_mxfp4 candidate."""
    gen = torch.Generator().manual_seed(5)
    raw = torch.randint(0, 256, (16, 8 * 17), generator=gen, dtype=torch.uint8)
    raw.view(16, 8, 17)[..., 0] = torch.randint(100, 140, (16, 8), generator=gen,
                                                dtype=torch.uint8)
    raw.view(16, 8, 17)[3, 2, 1:] = 0x88  # -0 codes
    values = torch.from_numpy(gguf.dequantize(raw.numpy(), QTYPE)).reshape(16, 256)
    qw = quantize_weight(values, MX)
    assert torch.equal(qw.dequant, values)
    assert not torch.signbit(qw.dequant[3, 64:96]).any()  # -0 comes back as +0


def test_inputs_are_rounded_to_q8_0():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, 96, generator=gen) * 3
    assert torch.equal(quantize_activation(x, MX), quantize_activation(x, Precision.Q8_0))
    assert not torch.equal(quantize_activation(x, MX), quantize_activation(x, Precision.MXFP4))


def test_gptq_stays_on_ggml_blocks():
    gen = torch.Generator().manual_seed(4)
    w = torch.randn(16, 64, generator=gen) * 0.05
    x = torch.randn(128, 64, generator=gen)
    scheme = Precision.GGUF_MXFP4.spec.weight_scheme(torch.float32)
    deq, codes, params, _ = gptq_quantize(w, 2 * x.t() @ x / x.shape[0], scheme)
    scale = decode_e8m0(params.scale).repeat_interleave(32, dim=1)
    assert torch.equal(deq, codes * scale)
    assert torch.equal(quantize_weight(deq, MX).dequant, deq)  # already on its blocks


def test_llama_cpp_offers_it_on_x86_cpus_only_and_the_gguf_exporter_refuses_mxfp4():
    def ok(target: str, choice: str) -> bool:
        return supports(get_target(target), "llama.cpp", Choice.parse(choice)).ok

    assert ok("xeon-8480", "gguf_mxfp4") and ok("epyc-9654", "gguf_mxfp4")
    assert not ok("graviton4", "gguf_mxfp4")  # ARM: ggml's NEON Q8_0 rounding differs
    assert not ok("h100", "gguf_mxfp4")  # CUDA's Q8_1 inputs are not simulated
    assert not ok("xeon-8480", "mxfp4")  # MXFP4 inputs are not what ggml computes
    for runtime in ("vllm", "onnxruntime"):
        assert not supports(get_target("xeon-8480"), runtime, Choice.parse("gguf_mxfp4")).ok
    assert MX.info.shape_problem(64, 48)  # K must fill blocks of 32
    assert ggml_type_name(MX) == "MXFP4"
    with pytest.raises(UnsupportedFormatError, match="gguf_mxfp4"):
        ggml_type_name(Precision.MXFP4)


def test_a_gptoss_gguf_source_is_as_is_in_gguf_mxfp4(tmp_path):
    """The source's MXFP4 experts are gguf_mxfp4 choices, so the file is the search's "as
    is" candidate on llama.cpp, measured with Q8_0-rounded expert inputs."""
    from autoplan.engines.ggml_microbench import source_decisions
    from autoplan.search.optimize import build_space
    from autoplan.search.preparation import as_is
    from tests.unit.test_gguf_gptoss_export import gptoss_source

    loaded, _ = gptoss_source(tmp_path)
    types = source_decisions(loaded)
    experts = {c for n, c in types.items() if ".experts." in n}
    assert experts == {"dense+gguf_mxfp4"}
    space = build_space(loaded.spec, get_target("xeon-8480"), "llama.cpp")
    keep = as_is(loaded, space, tuple(0 for _ in space.units))
    assert keep.quantized_source, keep.note
    picked = {str(u.choices[i]) for u, i in zip(space.units, keep.picks)
              if ".experts." in u.layers[0].name}
    assert picked == {"dense+gguf_mxfp4"}


@needs_engine
def test_ggml_quantizes_and_multiplies_as_simulated():
    """ggml's own quantize_row_mxfp4_ref + mul_mat (MXFP4 x Q8_0) on the same fp32 weights:
    with inputs 127 * I (Q8_0 scale exactly 1) the product is 127 x the dequantized weights,
    bit for bit; with random inputs it is the simulated layer up to fp32 summation order."""
    from autoplan.engines.llamacpp import GgmlWorker

    w = _weights(0)[:, :128].contiguous()
    lin = torch.nn.Linear(128, w.shape[0], bias=False)
    lin.weight.data = w
    sim = SimulatedLinear.from_linear(lin, Choice.parse("gguf_mxfp4"))
    x = torch.randn(6, 128, generator=torch.Generator().manual_seed(2)) * 2
    with GgmlWorker(threads=1) as worker:
        eye = worker.matmul(w.numpy(), (127 * torch.eye(128)).numpy(), int(QTYPE))
        got = torch.from_numpy(worker.matmul(w.numpy(), x.numpy(), int(QTYPE))).double()
    assert torch.equal(torch.from_numpy(eye).t(), 127 * sim.weight)
    with torch.no_grad():
        want = sim(x).double()
        unrounded = (x @ sim.weight.t()).double()
    scale = want.abs().max()
    assert (got - want).abs().max() / scale < 3e-6
    assert (got - unrounded).abs().max() / scale > 1e-4  # the Q8_0 rounding it simulates
