"""KV-cache formats: how a serving engine stores K (after RoPE) and V, bit for bit.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

from types import ModuleType
from typing import TYPE_CHECKING

from autoplan.errors import UnknownNameError, UserInputError
from autoplan.formats.registry import Refused

if TYPE_CHECKING:
    from torch import Tensor

# The registry's facts (bits, granularity, names) are read by the cost model and the CLI
# without torch; the numerics below import it, and the element casts and GGUF blocks, on
# first use. GGUF_BLOCK and E4M3_MAX are gguf_blocks.BLOCK and elements.E4M3_MAX
# (tests/unit/test_cli_startup.py checks they agree).
GGUF_BLOCK = 32
E4M3_MAX = 448.0


def _elements() -> ModuleType:
    from autoplan.formats import elements

    return elements


class KvFormat(str, Enum):
    """KV-cache formats, by their canonical text (a closed vocabulary)."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8_E4M3 = "fp8_e4m3"  # per-tensor (per layer, K and V apart) static scale
    FP8_E4M3_HEAD = "fp8_e4m3_head"  # a static scale per KV head
    FP8_E5M2 = "fp8_e5m2"  # no scale
    INT8 = "int8"  # per-tensor static scale (TensorRT-LLM)
    NVFP4 = "nvfp4"  # E2M1, E4M3 per 16, FP32 global (TensorRT-LLM, Blackwell)
    Q8_0 = "q8_0"  # llama.cpp
    Q4_0 = "q4_0"  # llama.cpp

    @classmethod
    def parse(cls, text: str) -> KvFormat:
        """Read a KV format name (case-insensitive; ``fp8`` = fp8_e4m3, ``fp8/head``,
        ``f16`` = fp16, ``auto`` is refused here: the runtime's default is resolved apart)."""
        key = text.strip().lower().replace("-", "_").replace("/", "_")
        key = {"fp8": "fp8_e4m3", "fp8_head": "fp8_e4m3_head", "f16": "fp16",
               "e4m3": "fp8_e4m3", "e5m2": "fp8_e5m2"}.get(key, key)
        try:
            return cls(key)
        except ValueError:
            raise UnknownNameError("KV-cache format", text, [k.value for k in cls]) from None

    @property
    def spec(self) -> KvSpec:
        return kv_spec(self)


Granularity = Literal["none", "tensor", "head", "block"]


@dataclass(frozen=True)
class KvSpec:
    """One KV-cache format.

    Attributes:
        format: the KvFormat this spec defines.
        bits: stored bits per cached element, block scales included (q8_0: 8 + 16/32).
        granularity: where the scales live.
        static: scales are calibrated offline from the amax of K and V (per layer, or per
            KV head); False: none, or computed from each token's own values as it is written.
        fake: ``(x [..., H, S, D] float32, static scale [1] or [H] or None) -> values``.
        calibrate: ``amax -> stored static scale`` (static formats only).
        compressed_tensors: the ``kv_cache_scheme`` of a compressed-tensors config, or Refused.
        modelopt: ModelOpt's ``kv_cache_quant_algo``, or Refused.
        gguf: llama.cpp's cache type (``-ctk``/``-ctv``), or Refused.
        summary: one line for docs and errors.
    """

    format: KvFormat
    bits: float
    granularity: Granularity
    static: bool
    fake: Callable[[Tensor, Tensor | None], Tensor]
    block: int = 0  # values along head_dim sharing a scale (block formats)
    calibrate: Callable[[Tensor], Tensor] | None = None
    compressed_tensors: Mapping[str, Any] | Refused = field(default_factory=dict)
    modelopt: str | Refused = ""
    gguf: str | Refused = ""
    summary: str = ""

    @property
    def name(self) -> str:
        return self.format.value

    @property
    def bytes(self) -> float:
        """Stored bytes per cached element."""
        return self.bits / 8

    @property
    def quantized(self) -> bool:
        return self.bits < 16

    def shape_problem(self, head_dim: int) -> str:
        """Why a model with this head_dim cannot use the cache, or "" (blocks must not
        straddle heads: ggml's flash attention dots one head's row of blocks)."""
        if self.block and head_dim % self.block:
            return (f"the {self.name} cache stores blocks of {self.block} along head_dim, "
                    f"and this model's head_dim is {head_dim}")
        return ""

    def quantize(self, x: Tensor, scale: Tensor | None = None) -> Tensor:
        """Dequantized values of ``x`` [..., kv_heads, tokens, head_dim], in ``x``'s dtype.

        Raises:
            UserInputError: a static format without its calibrated scale.
        """
        if self.static and scale is None:
            raise UserInputError(f"the {self.name} KV cache needs calibrated scales; "
                                 "calibrate them first (autoplan.quant.kv_cache)")
        return self.fake(x.float(), scale).to(x.dtype)

    def naming(self, exporter: str) -> Any:
        """How ``exporter`` (compressed-tensors, modelopt, gguf) names this format."""
        return {"compressed-tensors": self.compressed_tensors, "modelopt": self.modelopt,
                "gguf": self.gguf}[exporter]


def _per_head(scale: Tensor, x: Tensor) -> Tensor:
    """A [1] or [H] scale broadcast against x [..., H, S, D]."""
    return scale.float().reshape(-1, 1, 1)


def _fp8_static(x: Tensor, scale: Tensor | None) -> Tensor:
    s = _per_head(scale, x)  # type: ignore[arg-type]
    return _elements().cast_fp8_e4m3(x / s) * s


def _int8_static(x: Tensor, scale: Tensor | None) -> Tensor:
    import torch

    s = _per_head(scale, x)  # type: ignore[arg-type]
    inv = 1.0 / s
    return torch.round(x * inv).clamp_(-128, 127) * s


def _nvfp4(x: Tensor, scale: Tensor | None) -> Tensor:
    """Per 16 of the head dimension; ``scale`` is the layer's global scale (448 * 6 / amax)."""
    from autoplan.formats.schemes import NvFp4Scheme

    scheme = NvFp4Scheme(scale)
    g = scheme.prepare(x)
    blocks = x.reshape(*x.shape[:-1], -1, 16)
    qp = scheme.qparams(blocks, g)
    deq, _ = scheme.fake(blocks, qp, g)
    return deq.reshape(x.shape)


def _gguf_rows(x: Tensor, kind: str) -> Tensor:
    """llama.cpp cache rows: blocks of 32 along the head dimension (head_dim % 32 == 0)."""
    from autoplan.formats.gguf_blocks import (BLOCK, BlockFormat, GgufActScheme, block_codes,
                                              block_scales)

    if x.shape[-1] % BLOCK:
        raise UserInputError(f"llama.cpp's {kind} cache needs head_dim divisible by {BLOCK} "
                             f"(this model's is {x.shape[-1]}); use an f16 cache")
    blocks = x.reshape(*x.shape[:-1], -1, BLOCK)
    if kind == "q8_0":  # ggml-cpu's quantize_row_q8_0 (x86 SIMD), as for activations
        scheme = GgufActScheme()
        deq, _ = scheme.fake(blocks, scheme.qparams(blocks, None), None)
    else:  # quantize_row_q4_0 is quantize_row_q4_0_ref: gguf.quants' Q4_0
        fmt = BlockFormat("Q4_0", 4, False, "Q8_0")
        deq, _ = block_codes(blocks, block_scales(blocks, fmt), fmt)
    return deq.reshape(x.shape)


def _amax_scale(divisor: float) -> Callable[[Tensor], Tensor]:
    # an all-zero K or V (never seen on real text) gets scale 1 instead of 0 (no 0/0)
    def scale(amax: Tensor) -> Tensor:
        import torch

        return torch.where(amax > 0, amax.float() / divisor, 1.0)

    return scale


def _nvfp4_global(amax: Tensor) -> Tensor:
    from autoplan.formats.schemes import nvfp4_global_scale

    return nvfp4_global_scale(amax.float().amax())


_CT_FP8 = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False}
_NO_MODELOPT = Refused("ModelOpt's kv_cache_quant_algo is FP8, INT8 or NVFP4 (per-tensor)")
_NO_GGUF = Refused("llama.cpp's cache types are f16, bf16, q8_0, q4_0 (and other GGUF "
                   "block types); plan q8_0 or q4_0 for llama.cpp")
_NO_CT = Refused("compressed-tensors' kv_cache_scheme holds FP8 E4M3 with per-tensor or "
                 "per-head scales; plan fp8_e4m3 or fp8_e4m3_head for vLLM")

_REGISTRY: dict[KvFormat, KvSpec] = {}


def _register(spec: KvSpec) -> None:
    if spec.format in _REGISTRY:
        raise UserInputError(f"KV format {spec.name} is registered twice")
    _REGISTRY[spec.format] = spec


_register(KvSpec(KvFormat.FP32, 32, "none", False, lambda x, s: x, compressed_tensors={},
                 modelopt=Refused("TensorRT-LLM caches in the model's 16-bit dtype or lower"),
                 gguf="f32", summary="fp32 cache (ONNX Runtime's CPU export)"))
_register(KvSpec(KvFormat.BF16, 16, "none", False, lambda x, s: _elements().round_to_bf16(x),
                 compressed_tensors={}, modelopt=Refused("a 16-bit cache is the default: no "
                                                         "kv_cache_quant_algo"),
                 gguf="bf16", summary="16-bit bfloat cache (vLLM's 'auto' for bf16 models)"))
_register(KvSpec(KvFormat.FP16, 16, "none", False, lambda x, s: _elements().round_to_fp16(x),
                 compressed_tensors={}, modelopt=Refused("a 16-bit cache is the default: no "
                                                         "kv_cache_quant_algo"),
                 gguf="f16", summary="16-bit IEEE half cache (llama.cpp's default f16)"))
_register(KvSpec(KvFormat.FP8_E4M3, 8, "tensor", True, _fp8_static,
                 calibrate=_amax_scale(E4M3_MAX),
                 compressed_tensors=_CT_FP8 | {"strategy": "tensor"}, modelopt="FP8",
                 gguf=_NO_GGUF,
                 summary="FP8 E4M3, one calibrated scale per layer for K and one for V"))
_register(KvSpec(KvFormat.FP8_E4M3_HEAD, 8, "head", True, _fp8_static,
                 calibrate=_amax_scale(E4M3_MAX),
                 compressed_tensors=_CT_FP8 | {"strategy": "attn_head"},
                 modelopt=Refused("ModelOpt's FP8 KV cache has one scale per tensor; plan "
                                  "fp8_e4m3 for TensorRT-LLM"),
                 gguf=_NO_GGUF, summary="FP8 E4M3, one calibrated scale per KV head"))
_register(KvSpec(KvFormat.FP8_E5M2, 8, "none", False, lambda x, s: _elements().cast_fp8_e5m2(x),
                 compressed_tensors=Refused("compressed-tensors' kv_cache_scheme stores "
                                            "E4M3; vLLM takes fp8_e5m2 from the command line "
                                            "alone (no checkpoint scales)"),
                 modelopt=_NO_MODELOPT, gguf=_NO_GGUF,
                 summary="FP8 E5M2, unscaled (vLLM's fp8_e5m2)"))
_register(KvSpec(KvFormat.INT8, 8, "tensor", True, _int8_static,
                 calibrate=_amax_scale(127.0),
                 compressed_tensors=_NO_CT, modelopt="INT8", gguf=_NO_GGUF,
                 summary="INT8, one calibrated scale per layer for K and one for V"))
_register(KvSpec(KvFormat.NVFP4, 4 + 8 / 16, "block", True, _nvfp4, 16,
                 calibrate=_nvfp4_global,
                 compressed_tensors=_NO_CT, modelopt="NVFP4", gguf=_NO_GGUF,
                 summary="NVFP4: E2M1, an E4M3 scale per 16, a calibrated FP32 global scale"))
_register(KvSpec(KvFormat.Q8_0, 8 + 16 / 32, "block", False,
                 lambda x, s: _gguf_rows(x, "q8_0"), GGUF_BLOCK, compressed_tensors=_NO_CT,
                 modelopt=_NO_MODELOPT, gguf="q8_0",
                 summary="llama.cpp q8_0: int8 per block of 32, fp16 scale"))
_register(KvSpec(KvFormat.Q4_0, 4 + 16 / 32, "block", False,
                 lambda x, s: _gguf_rows(x, "q4_0"), GGUF_BLOCK, compressed_tensors=_NO_CT,
                 modelopt=_NO_MODELOPT, gguf="q4_0",
                 summary="llama.cpp q4_0: 4-bit per block of 32, fp16 scale"))


def kv_spec(fmt: KvFormat | str) -> KvSpec:
    """The KvSpec of a format (a KvFormat or its text)."""
    key = fmt if isinstance(fmt, KvFormat) else KvFormat.parse(fmt)
    return _REGISTRY[key]


def kv_formats() -> tuple[KvSpec, ...]:
    """Every KV format, in KvFormat order."""
    return tuple(_REGISTRY[k] for k in KvFormat)


def parse_kv_mix(text: str) -> dict[int, KvFormat] | None:
    """A per-block cache mix, ``FORMAT@BLOCKS`` items (``fp8@0-15,bf16@16-31``; blocks a
    number or an inclusive range), as block -> format; None when ``text`` names no blocks
    (plain formats). Which engine takes a mix is ``runtimes.check_kv_layers``'s question.

    Raises:
        UserInputError: an item without ``@``, a bad range, or a block given twice.
    """
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not any("@" in t for t in items):
        return None
    out: dict[int, KvFormat] = {}
    for item in items:
        name, _, blocks = item.partition("@")
        lo, _, hi = blocks.partition("-")
        if not (lo.strip().isdigit() and (not hi or hi.strip().isdigit())):
            raise UserInputError(f"--kv-cache {item!r}: a per-block mix is FORMAT@BLOCKS "
                                 "items, e.g. fp8@0-15,bf16@16-31")
        first, last = int(lo), int(hi or lo)
        if last < first:
            raise UserInputError(f"--kv-cache {item!r}: the range runs backwards")
        fmt = KvFormat.parse(name)
        for i in range(first, last + 1):
            if i in out:
                raise UserInputError(f"--kv-cache: block {i} is given twice")
            out[i] = fmt
    return out


__all__ = ["Granularity", "KvFormat", "KvSpec", "kv_formats", "kv_spec", "parse_kv_mix"]
