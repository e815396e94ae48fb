"""Weight quantization (RTN): scales, codes, ranges, groups and recalibration after masking."""

from __future__ import annotations

import pytest
import torch

from autoplan.errors import UserInputError
from autoplan.formats import Precision
from autoplan.quant import decode_e2m1, decode_e8m0, quantize_weight

P = Precision


def test_int8_per_channel_range_scale_and_round_half_even():
    w = torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -127.0, 3.0]])
    q = quantize_weight(w, P.INT8)
    assert q.scales["weight_scale"].tolist() == [[1.0]]
    assert q.codes.dtype == torch.int8
    assert q.codes.tolist() == [[127, 0, 2, 2, 0, -2, -127, 3]]
    assert torch.equal(q.dequant, q.codes.float() * q.scales["weight_scale"])


def test_int8_codes_stay_in_symmetric_range():
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(1))
    q = quantize_weight(w, P.INT8_WO)
    assert q.codes.abs().max() == 127 and q.codes.min() >= -127
    assert torch.allclose(q.scales["weight_scale"].squeeze(1), w.abs().amax(1) / 127)


def test_int4_symmetric_pack_quantized_convention():
    # scale = amax / 7.5 (compressed-tensors): +amax -> 8 clamps to 7, -amax -> -8; ties to even
    row = [7.5, -7.5, 2.5, 3.5, 0.5, -0.5, 1.0, 0.0] * 4
    q = quantize_weight(torch.tensor([row]), P.INT4_G32)
    assert q.scales["weight_scale"].tolist() == [[1.0]]
    assert q.codes[0, :8].tolist() == [7, -8, 2, 4, 0, 0, 1, 0]
    assert q.codes.min() >= -8 and q.codes.max() <= 7


@pytest.mark.parametrize("precision", [P.INT4_G32, P.INT4_G64, P.INT4_G128])
def test_int4_group_scales_follow_the_input_dim(precision):
    g = precision.info.group
    w = torch.randn(4, 256, generator=torch.Generator().manual_seed(2))
    q = quantize_weight(w, precision)
    scale = q.scales["weight_scale"]
    assert scale.shape == (4, 256 // g)
    assert torch.allclose(scale, w.reshape(4, -1, g).abs().amax(-1) / 7.5)
    expanded = scale.repeat_interleave(g, dim=1)
    assert torch.equal(q.dequant, q.codes.float() * expanded)


def test_ragged_last_group_gets_its_own_scale():
    w = torch.ones(2, 40)
    w[:, 32:] = 0.75  # the 8-column tail group
    q = quantize_weight(w, P.INT4_G32)
    assert q.scales["weight_scale"].shape == (2, 2)
    assert torch.allclose(q.scales["weight_scale"][:, 1], torch.tensor(0.75 / 7.5))
    assert q.dequant.shape == (2, 40)


def test_16_bit_weights_store_int_scales_in_their_dtype():
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    q = quantize_weight(w, P.INT4_G64)
    assert q.scales["weight_scale"].dtype == torch.bfloat16
    assert q.dequant.dtype == torch.bfloat16
    ref = (q.codes.float() * q.scales["weight_scale"].float()).to(torch.bfloat16)
    assert torch.equal(q.dequant, ref)


@pytest.mark.parametrize(("precision", "fmax"), [(P.FP8_E4M3, 448.0), (P.FP8_E5M2, 57344.0)])
def test_fp8_per_channel_and_per_tensor(precision, fmax):
    w = torch.randn(8, 32, generator=torch.Generator().manual_seed(4))
    q = quantize_weight(w, precision)
    scale = q.scales["weight_scale"]
    assert scale.shape == (8, 1) and scale.dtype == torch.float32
    assert torch.equal(scale, w.abs().amax(1, keepdim=True) / fmax)
    assert q.codes.float().abs().amax(1).eq(fmax).all()  # each row's amax lands on fmax
    assert torch.equal(q.dequant, q.codes.float() * scale)
    qt = quantize_weight(w, precision, per_channel=False)
    assert qt.scales["weight_scale"].shape == (1,)
    assert torch.equal(qt.scales["weight_scale"], (w.abs().amax() / fmax).reshape(1))


def test_nvfp4_scale_encoding_against_explicit_reference():
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(4, 48, generator=gen) * torch.tensor([1.0, 0.01, 3.0])[None].repeat_interleave(
        16, 1
    )
    q = quantize_weight(w, P.NVFP4)
    g = 448.0 * 6.0 / w.abs().amax()
    assert torch.equal(q.scales["global_scale"], g.reshape(1))
    block_amax = w.reshape(4, 3, 16).abs().amax(-1)
    ref_scale = ((block_amax / 6.0) * g).to(torch.float8_e4m3fn)
    assert q.scales["weight_scale"].dtype == torch.float8_e4m3fn
    assert torch.equal(q.scales["weight_scale"].float(), ref_scale.float())
    assert q.scales["weight_scale"].float().max() == 448.0  # the block holding the tensor amax
    s = ref_scale.float().repeat_interleave(16, 1)
    values = decode_e2m1(q.codes)
    assert torch.equal(q.dequant, (values * s) / g)
    # every value is on the E2M1 grid and nearest to w / (s / g), saturated at +-6 (a block
    # scale rounded down by E4M3 can push a block's amax past 6)
    scaled = w / (s / g)
    err = (values - scaled.clamp(-6, 6)).abs()
    grid = torch.tensor([0.0, 0.5, 1, 1.5, 2, 3, 4, 6])
    nearest = (grid[None, None] - scaled.abs().clamp(max=6)[..., None]).abs().amin(-1)
    assert torch.all(err <= nearest + 1e-6)


def test_nvfp4_zero_block_and_zero_tensor():
    w = torch.zeros(2, 32)
    w[0, :16] = torch.linspace(-1, 1, 16)
    q = quantize_weight(w, P.NVFP4)
    # compressed-tensors 0.20 calculate_qparams stores a zero E4M3 block scale as 0.125
    # (its _get_dtype_eps(E4M3)); the old expectation of 0 was not what the library writes
    assert q.scales["weight_scale"].float()[:, 1].eq(0.125).all()
    assert q.dequant[:, 16:].eq(0).all() and not q.dequant.isnan().any()
    z = quantize_weight(torch.zeros(2, 16), P.NVFP4)
    assert z.scales["global_scale"].item() == 1.0 and z.dequant.eq(0).all()


def test_mxfp4_e8m0_scales_and_saturation():
    w = torch.zeros(2, 64)
    # vLLM / compressed-tensors "even" scales (the OCP floor would give scale 1 and saturate
    # 7.9 at 6, which is not what vLLM runs): 7.9 = 1.975 * 2**2, mantissa >= 1.75, so amax
    # rounds up to 8 and the scale is 2**(3 - 2) = 2; 7.9 / 2 = 3.95 rounds to 4 -> 8.0
    w[0, :32] = 7.9
    w[0, 32:] = torch.linspace(-0.3, 0.3, 32)  # 0.3 = 1.2 * 2**-2: 2**(-2 - 2)
    q = quantize_weight(w, P.MXFP4)
    codes = q.scales["weight_scale"]
    assert codes.dtype == torch.uint8 and codes.shape == (2, 2)
    assert codes[0].tolist() == [128, 123]
    assert codes[1].tolist() == [0, 0]  # zero blocks: smallest scale, zero values
    assert q.dequant[0, :32].eq(8.0).all()
    w[0, :32] = 6.9  # 1.725 * 2**2 < 1.75: scale 1, 6.9 saturates to 6
    assert quantize_weight(w, P.MXFP4).dequant[0, :32].eq(6.0).all()
    expanded = decode_e8m0(codes).repeat_interleave(32, 1)
    assert torch.equal(q.dequant, decode_e2m1(q.codes) * expanded)


@pytest.mark.parametrize("precision", list(P))
def test_mask_recalibrates_scales_and_zeros_stay_zero(precision):
    gen = torch.Generator().manual_seed(6)
    w = torch.randn(8, 64, generator=gen)
    w[:, 0] = 50.0  # an outlier column that pruning removes
    mask = torch.rand(8, 64, generator=gen) > 0.5
    mask[:, 0] = False
    dense = quantize_weight(w, precision)
    pruned = quantize_weight(w, precision, mask=mask)
    assert pruned.dequant[~mask].eq(0).all()
    assert not pruned.dequant[~mask].signbit().any()
    if pruned.codes is not None:
        assert pruned.codes[~mask].view(torch.uint8).eq(0).all()
    for name, scale in pruned.scales.items():
        assert not torch.equal(scale.float(), dense.scales[name].float()), name


def test_bad_inputs_raise_user_errors():
    w = torch.randn(4, 32)
    with pytest.raises(UserInputError, match="method"):
        quantize_weight(w, P.INT8, method="awq")
    with pytest.raises(UserInputError, match="Hessian"):
        quantize_weight(w, P.INT8, method="gptq")
    with pytest.raises(UserInputError, match="2-D"):
        quantize_weight(w[0], P.INT8)
    with pytest.raises(UserInputError, match="mask"):
        quantize_weight(w, P.INT8, mask=torch.ones(4, 16, dtype=torch.bool))


def test_mxfp4_weight_only_holds_any_mxfp4_checkpoint_exactly() -> None:
    """gpt-oss's experts are MXFP4: re-quantizing their values as mxfp4_wo (what vLLM runs
    them as below Blackwell) gives them back bit for bit, whatever a block's largest code
    (a block whose codes are all small gets a smaller exponent and doubled codes: the same
    values), so the format adds no error to them."""
    gen = torch.Generator().manual_seed(0)
    values = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6.0])
    codes = values[torch.randint(0, 8, (64, 256), generator=gen)]
    codes = codes * torch.where(torch.rand(64, 256, generator=gen) < 0.5, -1.0, 1.0)
    codes[:16] = codes[:16].clamp(-1, 1)  # blocks whose largest magnitude is 1
    scales = torch.randint(100, 140, (64, 256 // 32), generator=gen).to(torch.uint8)
    w = codes * decode_e8m0(scales).repeat_interleave(32, dim=1)
    q = quantize_weight(w, Precision.parse("mxfp4_wo"))
    assert torch.equal(q.dequant, w)
