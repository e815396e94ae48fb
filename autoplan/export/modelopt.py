"""`--format modelopt`: a ModelOpt unified HF checkpoint for TensorRT-LLM, the 2:4 path.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import Tensor

from autoplan import __version__
from autoplan.atomic import atomic_dir
from autoplan.errors import AutoplanError, UnsupportedFormatError
from autoplan.export._prepare import UNQUANTIZED, Prepared
from autoplan.export._write import is_export, write_sidecars
from autoplan.export.kv import kv_scheme
from autoplan.formats import format_spec
from autoplan.models.graph import get_linear, is_tied
from autoplan.models.moe import checkpoint_key

FORMAT = "modelopt"
HF_QUANT_CONFIG = "hf_quant_config.json"
QUANT_CFG = "quant_cfg.json"


def check_nm_pattern(name: str, weight: Tensor, n: int, m: int) -> None:
    """Raise unless every run of ``m`` inputs of ``weight`` holds at most ``n`` non-zeros."""
    rows, cols = weight.shape
    if cols % m:
        raise UnsupportedFormatError(f"{name} has {cols} inputs, not a multiple of {m}: "
                                     f"it cannot be stored {n}:{m}-sparse; re-plan it dense")
    kept = (weight.reshape(rows, cols // m, m) != 0).sum(-1)
    if int(kept.max()) > n:
        raise AutoplanError(f"{name} breaks the {n}:{m} pattern after compression; nothing "
                            "was written (please report)")


def _layer_tensors(name: str, prep: Prepared) -> tuple[dict[str, Tensor], dict | None]:
    """The stored tensors of one decided layer and its quantized_layers entry (None: 16-bit)."""
    sim = prep.sims[name]
    p, sp = sim.choice.precision, sim.choice.sparsity
    if sp.kind == "nm":
        check_nm_pattern(name, sim.weight, sp.n, sp.m)
    dtype = get_linear(prep.loaded.model, name).weight.dtype
    out: dict[str, Tensor] = {}
    if sim.bias is not None:
        out[f"{name}.bias"] = sim.bias.to(dtype)
    if p in UNQUANTIZED:
        out[f"{name}.weight"] = sim.weight.to(dtype).contiguous()
        return out, None
    try:
        algo = format_spec(p).exported_as(FORMAT).quant_algo  # the spec's name, or its refusal
    except UnsupportedFormatError as err:
        raise UnsupportedFormatError(f"{err} ({name})") from None
    out[f"{name}.weight"] = sim.quantized.codes.contiguous()
    out[f"{name}.weight_scale"] = sim.quantized.scales["weight_scale"].reshape(-1).contiguous()
    return out, {"quant_algo": algo}


def _kv_tensors(prep: Prepared) -> dict[str, Tensor]:
    """The plan's calibrated K/V scales under ModelOpt's names (``k_proj.k_scale``,
    ``v_proj.v_scale``, FP32 scalars, which TensorRT-LLM's HF loader reads)."""
    from autoplan.quant.kv_cache import attention_modules

    names = {m: n for n, m in prep.loaded.model.named_modules()}
    attn = attention_modules(prep.loaded.model)
    out = {}
    for i, (k, v) in prep.kv_scales.items():
        base = names[attn[i]]
        out[f"{base}.k_proj.k_scale"] = k.float().reshape(()).contiguous() if k.numel() == 1 \
            else k.float().contiguous()
        out[f"{base}.v_proj.v_scale"] = v.float().reshape(()).contiguous() if v.numel() == 1 \
            else v.float().contiguous()
    return out


def _quant_section(quantized: dict[str, dict], excluded: list[str], kv_algo: str | None = None
                   ) -> tuple[dict, bool]:
    """hf_quant_config's "quantization" object, and whether it is MIXED_PRECISION."""
    algos = {entry["quant_algo"] for entry in quantized.values()}
    section: dict = {"kv_cache_quant_algo": kv_algo, "exclude_modules": sorted(excluded)}
    if len(algos) > 1:
        section.update(quant_algo="MIXED_PRECISION", quantized_layers=dict(sorted(quantized.items())))
        return section, True
    section["quant_algo"] = next(iter(algos)) if algos else None
    return section, False


def _renamed(section: dict, model_type: str) -> dict:
    """hf_quant_config's module names under the checkpoint's own (Mixtral's experts)."""
    def name(n: str) -> str:
        return checkpoint_key(f"{n}.x", model_type)[:-2]

    out = dict(section, exclude_modules=[name(n) for n in section["exclude_modules"]])
    if "quantized_layers" in section:
        out["quantized_layers"] = {name(n): v for n, v in section["quantized_layers"].items()}
    return out


class ModelOptExporter:
    """Writes ModelOpt unified checkpoints for TensorRT-LLM."""

    name = FORMAT
    runtimes = ("tensorrt-llm",)

    def write(self, prep: Prepared, out_dir: str | Path) -> Path:
        """Write the checkpoint atomically into ``out_dir``; return its path."""
        if (not prep.quantized() and kv_scheme(prep.plan, FORMAT) is None
                and all(c.sparsity.kind == "dense" for c in prep.choices.values())):
            raise UnsupportedFormatError("the plan quantizes no layer, sparsifies none and has "
                                         "no KV-cache scales; a ModelOpt checkpoint would be "
                                         "the original model: serve that")
        model = prep.loaded.model
        config = copy.deepcopy(model.config)
        state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        quantized: dict[str, dict] = {}
        excluded: list[str] = []
        for name in sorted(prep.sims):
            tensors, entry = _layer_tensors(name, prep)
            state.pop(f"{name}.weight", None)
            state.update(tensors)
            if entry is None:
                excluded.append(name)
            else:
                quantized[name] = entry
            if is_tied(model, name):
                config.tie_word_embeddings = False  # lm_head now has weights of its own
        undecided = [n for n, m in model.named_modules()
                     if isinstance(m, torch.nn.Linear) and n not in prep.sims]
        if getattr(config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)  # tied and unchanged: HF stores it once
        kv_algo = kv_scheme(prep.plan, FORMAT)
        state.update(_kv_tensors(prep))
        section, mixed = _quant_section(quantized, excluded + undecided, kv_algo)
        mt = prep.loaded.spec.model_type  # MoE: experts under the checkpoint's own names
        state = {checkpoint_key(k, mt): v for k, v in state.items()}
        section = _renamed(section, mt)
        sparse = {n: str(c.sparsity) for n, c in prep.choices.items() if c.sparsity.kind == "nm"}
        hf_quant = {"producer": {"name": "modelopt", "version": f"autoplan-{__version__}"},
                    "quantization": section}
        if sparse:
            hf_quant["sparsity"] = {"layers": dict(sorted(sparse.items())),
                                    "build": "trtllm-build --weight_sparsity"}
        with atomic_dir(out_dir, is_ours=is_export) as tmp:
            config.save_pretrained(str(tmp))
            save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
            (tmp / HF_QUANT_CONFIG).write_text(json.dumps(hf_quant, indent=4, sort_keys=True))
            if mixed:
                per_layer = {k: section[k] for k in ("quant_algo", "kv_cache_quant_algo",
                                                     "quantized_layers")}
                (tmp / QUANT_CFG).write_text(json.dumps(per_layer, indent=4, sort_keys=True))
            if prep.loaded.tokenizer is not None:
                prep.loaded.tokenizer.save_pretrained(str(tmp))
            write_sidecars(tmp, prep.plan, self.name, prep.runtime,
                           {n: str(c) for n, c in prep.choices.items()},
                           {"sparsity": sparse, "verified": "codes and scales are autoplan's; "
                            "N:M patterns checked", "kv_cache_quant_algo": kv_algo},
                           artifact=Path(out_dir))
        return Path(out_dir)


__all__ = ["HF_QUANT_CONFIG", "ModelOptExporter", "QUANT_CFG", "check_nm_pattern"]
