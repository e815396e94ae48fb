"""Element formats pinned against independent decodings of every code and a brute-force RNE."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from autoplan.quant import (
    cast_e2m1,
    cast_fp8_e4m3,
    cast_fp8_e5m2,
    decode_e2m1,
    decode_e8m0,
    encode_e2m1,
    encode_e8m0,
    mx_shared_exponent,
    round_to_bf16,
    round_to_fp16,
)


def _decode_minifloat(
    code: int, exp_bits: int, man_bits: int, bias: int, ieee_specials: bool
) -> float:
    """Value of a sign/exponent/mantissa code, from the format definition alone."""
    sign = -1.0 if code >> (exp_bits + man_bits) else 1.0
    e = (code >> man_bits) & ((1 << exp_bits) - 1)
    m = code & ((1 << man_bits) - 1)
    e_all_ones = e == (1 << exp_bits) - 1
    if ieee_specials and e_all_ones:
        return sign * math.inf if m == 0 else math.nan
    if (
        not ieee_specials and e_all_ones and m == (1 << man_bits) - 1
    ):  # E4M3fn: only S.1111.111 is NaN
        return math.nan
    if e == 0:
        return sign * (m / (1 << man_bits)) * 2.0 ** (1 - bias)
    return sign * (1 + m / (1 << man_bits)) * 2.0 ** (e - bias)


E4M3 = [_decode_minifloat(c, 4, 3, 7, False) for c in range(256)]
E5M2 = [_decode_minifloat(c, 5, 2, 15, True) for c in range(256)]
E2M1 = [_decode_minifloat(c, 2, 1, 1, False) for c in range(16)]
# E2M1 has no NaN: the generic rule above marks S.11.1 as NaN, which is 6.0 in E2M1.
E2M1 = [(-1.0 if c >> 3 else 1.0) * 6.0 if c & 7 == 7 else E2M1[c] for c in range(16)]


def _rne_reference(x: float, table: list[float], fmax: float) -> float:
    """Nearest finite positive-code value, ties to the even code, saturating at fmax."""
    mag = min(abs(x), fmax)
    finite = sorted((v, c) for c, v in enumerate(table[: len(table) // 2]) if math.isfinite(v))
    best = min(finite, key=lambda vc: (abs(vc[0] - mag), vc[1] & 1))
    return math.copysign(best[0], x)


@pytest.mark.parametrize(
    ("dtype", "table"), [(torch.float8_e4m3fn, E4M3), (torch.float8_e5m2, E5M2)]
)
def test_all_fp8_codes_decode_as_the_format_defines(dtype, table):
    codes = torch.arange(256, dtype=torch.uint8)
    got = codes.view(dtype).float().tolist()
    for c, (g, ref) in enumerate(zip(got, table)):
        assert (math.isnan(g) and math.isnan(ref)) or g == ref, (
            f"code {c:#04x}: torch {g}, ref {ref}"
        )


def test_fp8_format_constants():
    finite = [v for v in E4M3 if math.isfinite(v)]
    assert max(finite) == 448.0 and min(v for v in finite if v > 0) == 2.0**-9
    assert sum(math.isnan(v) for v in E4M3) == 2 and not any(math.isinf(v) for v in E4M3)
    finite5 = [v for v in E5M2 if math.isfinite(v)]
    assert max(finite5) == 57344.0 and min(v for v in finite5 if v > 0) == 2.0**-16


def _midpoints_and_randoms(table: list[float], fmax: float) -> torch.Tensor:
    pos = sorted({v for v in table if math.isfinite(v) and v >= 0})
    mids = [(a + b) / 2 for a, b in itertools.pairwise(pos)]
    gen = torch.Generator().manual_seed(0)
    rand = (torch.rand(2000, generator=gen) * 2 - 1) * fmax * 1.2
    tiny = (torch.rand(500, generator=gen) * 2 - 1) * pos[3] * 4
    vals = torch.tensor(pos + mids, dtype=torch.float64)
    return torch.cat([vals, -vals, rand.double(), tiny.double()]).float()


@pytest.mark.parametrize(
    ("cast", "table", "fmax"),
    [(cast_fp8_e4m3, E4M3, 448.0), (cast_fp8_e5m2, E5M2, 57344.0), (cast_e2m1, E2M1, 6.0)],
)
def test_casts_are_round_to_nearest_even_against_brute_force(cast, table, fmax):
    x = _midpoints_and_randoms(table, fmax)
    got = cast(x)
    ref = torch.tensor([_rne_reference(v, table, fmax) for v in x.tolist()])
    assert torch.equal(got, ref)


def test_casts_saturate_and_keep_nan():
    big = torch.tensor([449.0, 464.0, 1e9, float("inf"), -float("inf"), float("nan")])
    assert cast_fp8_e4m3(big)[:5].tolist() == [448.0, 448.0, 448.0, 448.0, -448.0]
    assert math.isnan(cast_fp8_e4m3(big)[5])
    assert cast_fp8_e5m2(torch.tensor([61440.0, 1e9, -float("inf")])).tolist() == [
        57344.0,
        57344.0,
        -57344.0,
    ]
    assert cast_e2m1(torch.tensor([6.5, 100.0, -7.0])).tolist() == [6.0, 6.0, -6.0]


def test_e2m1_ties_from_the_issue():
    x = torch.tensor([2.5, 3.5, 0.25, 0.75, 1.25, 1.75, 5.0, -2.5, -0.25])
    assert cast_e2m1(x).tolist() == [2.0, 4.0, 0.0, 1.0, 1.0, 2.0, 4.0, -2.0, -0.0]


def test_e2m1_codes_round_trip_all_sixteen():
    codes = torch.arange(16, dtype=torch.uint8)
    values = decode_e2m1(codes)
    assert values.tolist() == E2M1
    back = encode_e2m1(values)
    assert torch.equal(back, codes)


def test_casts_keep_input_dtype():
    x = torch.tensor([1.0625, 300.0], dtype=torch.bfloat16)
    assert cast_fp8_e4m3(x).dtype == torch.bfloat16
    assert cast_fp8_e4m3(x).tolist() == [1.0, 288.0]


def test_e8m0_scales_for_powers_of_two_and_edges():
    amax = torch.tensor(
        [1.0, 4.0, 6.0, 7.99, 8.0, 0.75, 0.0, 2.0**-130, 1.5 * 2.0**127, float("nan"), float("inf")]
    )
    exp = mx_shared_exponent(amax)
    # floor(log2(amax)) - 2 for E2M1
    assert exp[:6].tolist() == [-2.0, 0.0, 0.0, 0.0, 1.0, -3.0]
    codes = encode_e8m0(exp)
    assert codes[:6].tolist() == [125, 127, 127, 127, 128, 124]
    assert codes[6].item() == 0  # zero block: smallest scale 2**-127
    assert codes[7].item() == 0  # clamped at -127
    assert codes[8].item() == 252  # largest fp32 binade: 127 - 2 = 125
    assert encode_e8m0(torch.tensor([128.0, 300.0, -128.0])).tolist() == [254, 254, 0]
    assert codes[9].item() == 0xFF and codes[10].item() == 0xFF
    scales = decode_e8m0(torch.tensor([0, 125, 127, 254, 255], dtype=torch.uint8))
    assert scales[:4].tolist() == [2.0**-127, 0.25, 1.0, 2.0**127]
    assert math.isnan(scales[4])


def test_shared_exponent_just_below_a_power_of_two():
    just_below = torch.tensor([torch.nextafter(torch.tensor(8.0), torch.tensor(0.0)).item()])
    assert mx_shared_exponent(just_below).item() == 0.0  # floor(log2(7.999...)) = 2, minus 2


def test_16_bit_rounding():
    x = torch.tensor([1.0 + 2**-8, 1.0 + 3 * 2**-8, 70000.0])
    assert round_to_bf16(x)[:2].tolist() == [1.0, 1.0 + 2**-6]  # ties to even
    assert round_to_fp16(x)[:2].tolist() == [1.0 + 2**-8, 1.0 + 3 * 2**-8]
    assert math.isinf(round_to_fp16(x)[2])
