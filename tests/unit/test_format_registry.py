"""The format registry: one FormatSpec per Precision, each complete and self-consistent.

One test walks the whole registry (schemes, bits, groups, every exporter's name or refusal,
kernel names); one round-trips every quantized format (quantize -> stored codes and scales
-> dequant by the format's definition); the asymmetric INT4 rule is checked bit for bit
against compressed-tensors' own calculate_qparams / quantize / dequantize.
"""

from __future__ import annotations

import pytest
import torch

from autoplan.errors import AutoplanError, UnknownNameError, UnsupportedFormatError
from autoplan.formats import (
    EXPORTERS,
    CompressedTensorsName,
    FormatSpec,
    ModelOptName,
    OrtNode,
    Precision,
    Refused,
    format_spec,
    register_format,
    registered_formats,
)
from autoplan.formats.schemes import (
    AsymIntScheme,
    BlockInt8ActScheme,
    IntScheme,
    RoundScheme,
    Scheme,
)
from autoplan.formats.gguf_blocks import BlockFormat, GgufWeightScheme
from autoplan.quant import decode_e2m1, decode_e8m0, hessian_from_inputs, quantize_weight

SPECS = registered_formats()
_NAME_TYPES = {"compressed-tensors": CompressedTensorsName, "modelopt": ModelOptName,
               "onnx": OrtNode}


def test_every_precision_has_exactly_one_spec():
    assert [s.precision for s in SPECS] == list(Precision)
    assert all(format_spec(p.value) is format_spec(p) is p.spec for p in Precision)


def test_registering_twice_raises_and_unknown_names_list_the_registry():
    with pytest.raises(AutoplanError, match="registered twice"):
        register_format(format_spec(Precision.INT8))
    with pytest.raises(UnknownNameError) as err:
        format_spec("int3_g7")
    assert all(s.name in str(err.value) for s in SPECS)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_spec_is_complete_and_consistent(spec: FormatSpec):
    from autoplan.backends.microbench import _KERNELS

    info = spec.info
    for dtype in (torch.float32, torch.bfloat16):
        weights = spec.weight_scheme(dtype)
        assert isinstance(weights, Scheme)
        assert (weights.code_dtype is not None) == spec.quantized
        assert weights.group == info.group or (info.act_group and not info.group)
        if isinstance(weights, (IntScheme, AsymIntScheme)):
            assert weights.qmax - weights.qmin + 1 <= 2**info.value_bits
            assert 2 * (weights.qmax - weights.qmin + 1) > 2**info.value_bits  # uses its bits
    acts = spec.activation_scheme()
    assert isinstance(acts, Scheme)
    probe = torch.tensor([0.1])  # not a bf16/fp16 value: only a passthrough keeps it
    passthrough = isinstance(acts, RoundScheme) and torch.equal(acts.fake(probe, None, None)[0],
                                                                probe)
    assert passthrough == (info.weight_only or spec.precision is Precision.FP32)
    assert isinstance(acts, BlockInt8ActScheme) == bool(info.act_group)
    if info.act_group:
        assert acts.group == info.act_group
    assert info.weight_bits >= info.value_bits and info.act_bytes > 0
    for exporter in EXPORTERS:
        named = spec.naming(exporter)
        if isinstance(named, Refused):
            assert named.reason and "\n" not in named.reason
            with pytest.raises(UnsupportedFormatError, match=spec.name):
                spec.exported_as(exporter)
        else:
            assert isinstance(named, _NAME_TYPES[exporter])
    onnx = spec.naming("onnx")
    if isinstance(onnx, OrtNode) and onnx.op == "MatMulNBits":
        assert onnx.bits == info.value_bits and onnx.accuracy_level == (4 if info.act_group else 0)
        assert onnx.zero_points == isinstance(spec.weight_scheme(torch.float32), AsymIntScheme)
        assert onnx.block == (info.group or 128)
    gguf = spec.naming("gguf")  # the slot for other exporters: GGUF types where they exist
    assert isinstance(gguf, (Refused, BlockFormat, str))
    if isinstance(gguf, BlockFormat):
        assert isinstance(spec.weight_scheme(torch.float32), GgufWeightScheme)
        assert (gguf.bits, spec.info.group) == (info.value_bits, 32)
    assert isinstance(spec.naming("no-such-exporter"), Refused)
    assert set(spec.kernels.values()) <= set(_KERNELS)
    assert set(spec.kernels) <= {"dense", "2:4", "block"}
    assert (spec.float_dtype is None) == spec.quantized  # a float kernel's dtype, floats only
    if spec.input_calibration is not None:  # a static input parameter from a calibration amax
        param = spec.input_calibration(torch.tensor([3.0]))
        assert param.dtype == torch.float32 and torch.isfinite(param).all()


def _dequant_by_definition(q, spec: FormatSpec) -> torch.Tensor:  # noqa: ANN001
    """Dequantize stored codes and scales as the format's serving kernel does."""
    rows, cols = q.codes.shape
    g = spec.info.group or cols
    tile = spec.info.block_rows or 1  # a 2-D block format stores one scale per tile of rows

    def per_group(t: torch.Tensor) -> torch.Tensor:
        t = t.float().reshape(-(-rows // tile), -1).repeat_interleave(tile, dim=0)[:rows]
        return t.repeat_interleave(g, dim=1)[:, :cols]

    scale = q.scales["weight_scale"]
    if spec.precision is Precision.NVFP4:
        return decode_e2m1(q.codes) * per_group(scale) / q.scales["global_scale"]
    if spec.precision.value in ("mxfp4", "mxfp4_wo", "gguf_mxfp4"):  # E2M1, E8M0 scales
        return decode_e2m1(q.codes) * per_group(decode_e8m0(scale))
    if "weight_min" in q.scales:  # GGUF *_1: fp16 d * code + fp16 m
        return per_group(scale) * q.codes.float() + per_group(q.scales["weight_min"])
    zp = q.scales.get("weight_zero_point")
    codes = q.codes.float() - (0 if zp is None else per_group(zp))
    return codes * per_group(scale.expand(rows, -1) if scale.numel() == 1 else scale)


@pytest.mark.parametrize("spec", [s for s in SPECS if s.quantized], ids=lambda s: s.name)
@pytest.mark.parametrize("method", ["rtn", "gptq"])
def test_every_quantized_format_round_trips(spec: FormatSpec, method: str):
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(16, 256, generator=gen) * 0.05 + 0.01
    w[3, :64] = 0.0  # an all-zero group
    w[5] = w[5].abs()  # a row without negatives: asymmetric zero points hit their bound
    x = torch.randn(64, 256, generator=gen)
    q = quantize_weight(w, spec.precision, method=method,
                        hessian=hessian_from_inputs(x) if method == "gptq" else None)
    assert q.precision is spec.precision and q.codes is not None
    assert torch.equal(_dequant_by_definition(q, spec), q.dequant)
    scheme = spec.weight_scheme(w.dtype)  # code_values inverts store_codes (exporters verify)
    assert torch.equal(scheme.store_codes(scheme.code_values(q.codes)).view(torch.uint8),
                       q.codes.view(torch.uint8))
    assert not q.dequant[3, :64].any()
    if isinstance(spec.weight_scheme(torch.float32), (IntScheme, AsymIntScheme)) and \
            spec.info.value_bits == 4:
        zp = q.scales.get("weight_zero_point")
        lo, hi = (0, 15) if zp is not None else (-8, 7)
        assert int(q.codes.min()) >= lo and int(q.codes.max()) <= hi
        if zp is not None:  # the all-zero group stores code == zero point
            assert zp.dtype == torch.uint8 and int(zp.max()) <= 15
            per_col = zp.float().repeat_interleave(spec.info.group, dim=1)
            assert torch.equal(q.codes[3, :64].float(), per_col[3, :64])


@pytest.mark.parametrize("group", [32, 128])
def test_asymmetric_int4_is_compressed_tensors_rule_bit_for_bit(group):
    """uint4_gN's scale, zero point, codes and dequant equal compressed-tensors' own
    calculate_qparams / quantize / dequantize (asymmetric int4 group args), on fp32 weights;
    on bf16 weights the scale and zero point (computed in bf16 by both) match too."""
    ct = pytest.importorskip("compressed_tensors.quantization")
    from compressed_tensors.quantization.lifecycle.forward import dequantize, quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    args = ct.QuantizationArgs(num_bits=4, type="int", strategy="group", symmetric=False,
                               group_size=group)
    gen = torch.Generator().manual_seed(group)
    w = torch.randn(24, 256, generator=gen) * 0.03 + 0.004
    w[2] = w[2].abs() + 0.01  # min > 0: the min is clamped to 0
    w[4] = -w[4].abs() - 0.01  # max < 0
    prec = Precision.parse(f"uint4_g{group}")
    for dtype in (torch.float32, torch.bfloat16):
        wd = w.to(dtype)
        groups = wd.reshape(24, -1, group)
        scale, zp = calculate_qparams(groups.amin(-1), groups.amax(-1), args)
        q = quantize_weight(wd, prec)
        assert q.scales["weight_scale"].dtype == dtype
        assert torch.equal(q.scales["weight_scale"], scale)
        assert torch.equal(q.scales["weight_zero_point"].to(torch.int16) - 8, zp.to(torch.int16))
        if dtype is torch.float32:
            codes = quantize(wd, scale, zp, args, dtype=torch.int8)
            assert torch.equal(q.codes.to(torch.int16) - 8, codes.to(torch.int16))
            assert torch.equal(q.dequant, dequantize(codes, scale, zp, args))


def test_gptq_carries_the_zero_point():
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(256, 128, generator=gen) * torch.linspace(0.2, 3.0, 128)
    w = torch.randn(32, 128, generator=gen) * 0.05 + 0.02
    h = hessian_from_inputs(x)
    rtn = quantize_weight(w, Precision.UINT4_G32)
    gptq = quantize_weight(w, Precision.UINT4_G32, method="gptq", hessian=h)
    assert gptq.scales["weight_zero_point"].shape == (32, 4)
    assert torch.equal(_dequant_by_definition(gptq, format_spec(Precision.UINT4_G32)),
                       gptq.dequant)
    err = lambda q: float(((x @ (w - q.dequant).T) ** 2).mean())  # noqa: E731
    assert err(gptq) < err(rtn)


def test_zero_points_cut_int4_error_on_skewed_weights():
    """What the format is for: a group that is not centred on zero keeps all 16 levels."""
    w = torch.rand(8, 128, generator=torch.Generator().manual_seed(5)) * 0.1  # all positive
    sym = quantize_weight(w, Precision.INT4_G32)
    asym = quantize_weight(w, Precision.UINT4_G32)
    assert float((w - asym.dequant).abs().mean()) < 0.6 * float((w - sym.dequant).abs().mean())
