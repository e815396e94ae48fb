"""`--format compressed-tensors`: an HF folder vLLM and SGLang load, written by the library.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

from autoplan.atomic import atomic_dir
from autoplan.errors import AutoplanError, UnsupportedFormatError
from autoplan.export._prepare import Prepared
from autoplan.export._write import engine_names, is_export, write_sidecars
from autoplan.export.kv import kv_scheme
from autoplan.formats import CompressedTensorsName, Precision, format_spec
from autoplan.formats.elements import decode_e8m0
from autoplan.models.graph import get_linear, is_tied
from autoplan.quant import SimulatedLinear

FORMAT = "compressed-tensors"


def _named(precision: Precision) -> CompressedTensorsName:
    """The format's compressed-tensors name (UnsupportedFormatError with its reason if none)."""
    return format_spec(precision).exported_as(FORMAT)


def _scheme(precision: Precision, targets: list[str]):  # noqa: ANN202 - library type
    """The compressed-tensors QuantizationScheme that stores ``precision`` as autoplan does."""
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationScheme,
        preset_name_to_scheme,
    )

    named = _named(precision)
    if named.preset is not None:
        return preset_name_to_scheme(named.preset, targets)
    if named.weights is None:
        raise AutoplanError(f"{precision.value} is stored unquantized, not as a "
                            "compressed-tensors scheme (please report)")
    inputs = None if named.input_activations is None else \
        QuantizationArgs(**named.input_activations)
    return QuantizationScheme(targets=targets, weights=QuantizationArgs(**named.weights),
                              input_activations=inputs)


def _check_shapes(prep: Prepared) -> None:
    for name, sim in prep.quantized().items():
        _named(sim.choice.precision)  # a format the exporter cannot hold is refused first
        problem = sim.choice.precision.info.shape_problem(sim.out_features, sim.in_features)
        if problem:
            raise UnsupportedFormatError(
                f"{name} cannot be stored as {sim.choice.precision.value} for vLLM: "
                f"{problem}; re-plan it")


def _load_params(module: nn.Module, sim: SimulatedLinear, act_global: torch.Tensor | None) -> None:
    """Put autoplan's weight and scales into the parameters the library initialized."""
    scales = sim.quantized.scales
    with torch.no_grad():
        module.weight.data = sim.weight.clone()
        # NVFP4 block scales are E4M3 and MXFP4's E8M0 exponent codes (uint8): the compressor
        # takes both as the floats they encode (exact: E8M0 ones are powers of two) and
        # encodes them back itself; every other scale keeps autoplan's storage dtype.
        stored = scales["weight_scale"]
        if stored.dtype == torch.float8_e4m3fn:
            module.weight_scale.data = stored.float()
        elif stored.dtype == torch.uint8:
            module.weight_scale.data = decode_e8m0(stored).to(module.weight_scale.dtype)
        else:
            module.weight_scale.data = stored.clone()
        if "global_scale" in scales:
            module.weight_global_scale.data = scales["global_scale"].float().clone()
            module.input_global_scale.data = act_global.float().reshape(1).clone()
        if "weight_zero_point" in scales:  # autoplan's unsigned zero points, library's signed
            zp = scales["weight_zero_point"].to(torch.int16) - _offset(sim)
            module.weight_zero_point.data = zp.to(module.weight_zero_point.dtype)
        elif hasattr(module, "weight_zero_point"):  # symmetric: dropped by the compressor
            module.weight_zero_point.data.zero_()


def _offset(sim: SimulatedLinear) -> int:
    """2**(bits-1): the distance between autoplan's unsigned codes and the library's signed."""
    return 1 << (sim.choice.precision.info.value_bits - 1)


def _bits(sim: SimulatedLinear) -> int:
    return sim.choice.precision.info.value_bits


def _stored_codes(module: nn.Module, sim: SimulatedLinear) -> torch.Tensor:
    """The codes as the library stored them, as float32 values, unpacked by the layout the
    library chose for the module (its ``quantization_scheme.format``)."""
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
    from compressed_tensors.config import CompressionFormat

    layout = CompressionFormat(module.quantization_scheme.format)
    if layout in (CompressionFormat.nvfp4_pack_quantized, CompressionFormat.mxfp4_pack_quantized):
        packed = module.weight_packed
        return unpack_fp4_from_uint8(packed, packed.shape[0], packed.shape[1] * 2,
                                     dtype=torch.float32)
    if layout is CompressionFormat.pack_quantized:
        codes = unpack_from_int32(module.weight_packed, _bits(sim), module.weight_shape).float()
        return codes + _offset(sim) if "weight_zero_point" in sim.quantized.scales else codes
    return module.weight.float()


def _stored_zero_points(module: nn.Module, sim: SimulatedLinear) -> torch.Tensor:
    """The packed zero points as the library stored them, unsigned as autoplan keeps them."""
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    want = sim.quantized.scales["weight_zero_point"]
    signed = unpack_from_int32(module.weight_zero_point, _bits(sim), want.shape, packed_dim=0)
    return signed.to(torch.int16) + _offset(sim)


def _verify(model: nn.Module, prep: Prepared) -> None:
    """Prove the compressed parameters hold autoplan's codes and scales, bit for bit."""
    for name, sim in prep.quantized().items():
        module = model.get_submodule(name)
        scheme = format_spec(sim.choice.precision).weight_scheme(sim.weight.dtype)
        want = scheme.code_values(sim.quantized.codes)
        ok = torch.equal(_stored_codes(module, sim), want)
        ws = sim.quantized.scales["weight_scale"]
        ok = ok and torch.equal(module.weight_scale.to(ws.dtype).view(torch.uint8),
                                ws.contiguous().view(torch.uint8))
        if "global_scale" in sim.quantized.scales:
            ok = ok and torch.equal(module.weight_global_scale.float(),
                                    sim.quantized.scales["global_scale"].float())
        if "weight_zero_point" in sim.quantized.scales:
            ok = ok and torch.equal(_stored_zero_points(module, sim),
                                    sim.quantized.scales["weight_zero_point"].to(torch.int16))
        if not ok:
            raise AutoplanError(f"compressed-tensors stored other codes or scales than autoplan "
                                f"simulated for {name}; nothing was written (please report)")


def _kv_params(model: nn.Module, prep: Prepared, strategy: str) -> None:
    """The plan's calibrated K/V scales as each attention module's ``k_scale`` /
    ``v_scale`` parameters, shaped as compressed-tensors initializes them for the
    ``kv_cache_scheme`` (``[1]`` per tensor, ``[kv_heads, 1, 1]`` per head) and named as
    vLLM loads them (``model.layers.N.self_attn.k_scale``). They are registered here
    because compressed-tensors 0.20 finds no cached attention module in transformers 5 (it
    looks for a ``past_key_values`` argument that transformers now names ``cache``)."""
    from autoplan.quant.kv_cache import attention_modules

    attn = attention_modules(model)
    for i, (k, v) in prep.kv_scales.items():
        for name, value in (("k_scale", k), ("v_scale", v)):
            shaped = value.float().reshape(-1, 1, 1) if strategy == "attn_head" else \
                value.float().reshape(1)
            attn[i].register_parameter(name, nn.Parameter(shaped.clone(), requires_grad=False))


def _build(prep: Prepared) -> tuple[nn.Module, object]:
    """A compressed copy of the model and the ModelCompressor that compressed it."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationStatus,
        apply_quantization_config,
    )

    model = copy.deepcopy(prep.loaded.model)
    by_precision: dict[Precision, list[str]] = {}
    for name, sim in sorted(prep.quantized().items()):
        by_precision.setdefault(sim.choice.precision, []).append(name)
    groups = {f"group_{i}": _scheme(p, names)
              for i, (p, names) in enumerate(sorted(by_precision.items(), key=lambda kv: kv[0].value))}
    quantized = prep.quantized()
    for name, sim in prep.sims.items():
        if name in quantized:
            continue
        linear = get_linear(model, name)
        if not torch.equal(linear.weight.float(), sim.weight):  # e.g. bf16 rounding of fp32
            tied = is_tied(model, name)
            linear.weight = nn.Parameter(sim.weight.to(linear.weight.dtype), requires_grad=False)
            if tied:
                model.config.tie_word_embeddings = False
    kv = kv_scheme(prep.plan, FORMAT)
    config = QuantizationConfig(config_groups=groups,
                                quantization_status=QuantizationStatus.FROZEN)
    apply_quantization_config(model, config, show_progress=False)
    for name, sim in quantized.items():
        module = model.get_submodule(name)
        if is_tied(prep.loaded.model, name):
            model.config.tie_word_embeddings = False  # a quantized lm_head has its own weight
        _load_params(module, sim, prep.input_global_scales.get(name))
    compressor = ModelCompressor.from_pretrained_model(model)
    if compressor is None or compressor.quantization_config is None:  # a KV-only plan
        compressor = ModelCompressor(quantization_config=config)
    compressor.compress_model(model)
    compressor.remove_decompression_hook(model)
    _verify(model, prep)
    if kv is not None:
        _kv_params(model, prep, kv["strategy"])
        compressor.quantization_config.kv_cache_scheme = QuantizationArgs(**kv)
    return model, compressor


def _kv_audit(prep: Prepared) -> dict | None:
    kv = prep.plan.kv_cache
    if kv is None or kv.format == kv.default:
        return None
    return {"format": kv.format, "scheme": kv_scheme(prep.plan, FORMAT),
            "scales": "calibrated, equal to the plan's digests" if prep.kv_scales else
            "none in the checkpoint (the engine's flag alone)"}


class CompressedTensorsExporter:
    """Writes compressed-tensors checkpoints for vLLM (and SGLang, which reuses its kernels)."""

    name = FORMAT
    runtimes = ("vllm", "sglang")

    def write(self, prep: Prepared, out_dir: str | Path) -> Path:
        """Write the checkpoint atomically into ``out_dir``; return its path."""
        _check_shapes(prep)
        if not prep.quantized() and kv_scheme(prep.plan, FORMAT) is None:
            raise UnsupportedFormatError("the plan quantizes no layer and no KV-cache scales; "
                                         "a compressed-tensors checkpoint would be the original "
                                         "model: serve that (with the plan's deploy command)")
        model, compressor = _build(prep)  # refusals and verification happen before writing
        with atomic_dir(out_dir, is_ours=is_export) as tmp:
            model.save_pretrained(str(tmp))
            compressor.update_config(str(tmp))
            engine_names(tmp, prep.loaded.spec.model_type)  # MoE experts as vLLM names them
            if prep.loaded.tokenizer is not None:
                prep.loaded.tokenizer.save_pretrained(str(tmp))
            layers = {n: str(c) for n, c in prep.choices.items()}
            write_sidecars(tmp, prep.plan, self.name, prep.runtime, layers, {
                "verified": "stored codes and scales equal autoplan's simulated ones, bit for bit",
                "kv_cache": _kv_audit(prep)}, artifact=Path(out_dir))
        return Path(out_dir)


__all__ = ["CompressedTensorsExporter"]
