"""Mixture-of-experts models as autoplan measures them: every routed expert an nn.Linear,
the calibration routing counted, expert counts checked against the config.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autoplan.errors import UserInputError
from autoplan.modelspec import ModelSpec


class ExpertMLP(nn.Module):
    """One routed expert: gate/up/down linears (or gpt-oss's interleaved gate_up)."""

    def __init__(self, hidden: int, inter: int, *, fused: bool, bias: bool, act: Any,
                 alpha: float = 1.702, limit: float = 7.0) -> None:
        super().__init__()
        self.fused = fused
        if fused:
            self.gate_up_proj = nn.Linear(hidden, 2 * inter, bias=bias, device="meta")
        else:
            self.gate_proj = nn.Linear(hidden, inter, bias=bias, device="meta")
            self.up_proj = nn.Linear(hidden, inter, bias=bias, device="meta")
        self.down_proj = nn.Linear(inter, hidden, bias=bias, device="meta")
        self.act_fn, self.alpha, self.limit = act, alpha, limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.fused:
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        gate_up = self.gate_up_proj(x)  # gpt-oss: gate and up interleaved, clamped SwiGLU
        gate = gate_up[..., ::2].clamp(max=self.limit)
        up = gate_up[..., 1::2].clamp(min=-self.limit, max=self.limit)
        return self.down_proj((up + 1) * (gate * torch.sigmoid(gate * self.alpha)))


class UnfusedExperts(nn.Module):
    """A block's routed experts as named submodules "0" ... "E-1" (same forward contract as
    transformers' experts module: hidden [T, H], top-k indices and weights [T, k])."""

    def __init__(self, experts: list[ExpertMLP]) -> None:
        super().__init__()
        self.num_experts = len(experts)
        for e, mlp in enumerate(experts):
            self.add_module(str(e), mlp)

    def expert(self, e: int) -> ExpertMLP:
        return getattr(self, str(e))

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(hidden_states)
        for e in torch.unique(top_k_index).tolist():
            token_idx, pos = torch.where(top_k_index == e)
            y = self.expert(e)(hidden_states[token_idx])
            y = y * top_k_weights[token_idx, pos, None]
            out.index_add_(0, token_idx, y.to(out.dtype))
        return out


def _is_fused_experts(module: nn.Module) -> bool:
    gate_up = getattr(module, "gate_up_proj", None)
    return isinstance(gate_up, torch.Tensor) and gate_up.dim() == 3


def _unfused(module: nn.Module, fused_gate_up: bool) -> UnfusedExperts:
    gate_up, down = module.gate_up_proj.detach(), module.down_proj.detach()
    n = gate_up.shape[0]
    act = getattr(module, "act_fn", None)
    experts = []
    for e in range(n):
        if fused_gate_up:  # gpt-oss: [E, H, 2I] and [E, I, H], x @ W + b
            hidden, inter = gate_up.shape[1], gate_up.shape[2] // 2
            mlp = ExpertMLP(hidden, inter, fused=True, bias=True, act=None,
                            alpha=float(module.alpha), limit=float(module.limit))
            mlp.gate_up_proj.weight = nn.Parameter(gate_up[e].T.contiguous(), requires_grad=False)
            mlp.gate_up_proj.bias = nn.Parameter(module.gate_up_proj_bias.detach()[e].clone(),
                                                 requires_grad=False)
            mlp.down_proj.weight = nn.Parameter(down[e].T.contiguous(), requires_grad=False)
            mlp.down_proj.bias = nn.Parameter(module.down_proj_bias.detach()[e].clone(),
                                              requires_grad=False)
        else:  # [E, 2I, H] (gate rows, then up rows) and [E, H, I]
            inter, hidden = gate_up.shape[1] // 2, gate_up.shape[2]
            mlp = ExpertMLP(hidden, inter, fused=False, bias=False, act=act)
            mlp.gate_proj.weight = nn.Parameter(gate_up[e, :inter].clone(), requires_grad=False)
            mlp.up_proj.weight = nn.Parameter(gate_up[e, inter:].clone(), requires_grad=False)
            mlp.down_proj.weight = nn.Parameter(down[e].clone(), requires_grad=False)
        experts.append(mlp)
    return UnfusedExperts(experts)


def unfuse_experts(model: nn.Module, spec: ModelSpec) -> int:
    """Replace every transformers experts module of an MoE model by `UnfusedExperts`, in
    place; returns how many blocks were unfused (0 for a dense model)."""
    if spec.moe is None:
        return 0
    count = 0
    for name, module in list(model.named_modules()):
        if name.endswith(".experts") and _is_fused_experts(module):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, _unfused(module, spec.moe.fused_gate_up))
            count += 1
    return count


class RoutingCounter:
    """Counts, per MoE block, the tokens routed to each expert while it is entered."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.counts: dict[int, torch.Tensor] = {}
        self._handles: list = []

    def __enter__(self) -> RoutingCounter:
        for name, module in self.model.named_modules():
            if isinstance(module, UnfusedExperts):
                block = int(re.search(r"layers\.(\d+)\.", name + ".").group(1))  # type: ignore[union-attr]

                def hook(mod, args, _out, block=block):  # noqa: ANN001 - torch hook
                    idx = args[1].reshape(-1).to("cpu", torch.int64)
                    add = torch.bincount(idx, minlength=mod.num_experts)
                    self.counts[block] = self.counts.get(block, torch.zeros_like(add)) + add

                self._handles.append(module.register_forward_hook(hook))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def as_lists(self) -> dict[str, list[int]]:
        return {str(b): [int(c) for c in counts] for b, counts in sorted(self.counts.items())}


@contextmanager
def counting_routing(model: nn.Module) -> Iterator[RoutingCounter]:
    with RoutingCounter(model) as counter:
        yield counter


_EXPERT_INDEX = re.compile(r"\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.")


# Mixtral's checkpoints name an expert's projections w1 (gate), w3 (up), w2 (down) under
# `block_sparse_moe`; qwen2_moe / qwen3_moe store them under the names autoplan uses.
_MIXTRAL = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}


def checkpoint_name(layer: str, model_type: str) -> str:
    """The checkpoint's tensor name (without `.weight`) of a per-expert layer (or of the
    router, `mlp.gate`); gpt-oss stores its experts stacked and has none per expert."""
    if model_type != "mixtral" or ".mlp." not in layer:
        return layer
    head, _, tail = layer.partition(".mlp.")
    parts = tail.split(".")
    if parts[0] == "experts" and len(parts) == 3:
        parts[2] = _MIXTRAL.get(parts[2], parts[2])
    return f"{head}.block_sparse_moe.{'.'.join(parts)}"


@dataclass(frozen=True)
class TensorSource:
    """Where a module tensor of the unfused model is stored in the checkpoint: a tensor of
    its own, or row `expert` of a stacked [E, ...] tensor (transposed for gpt-oss)."""

    key: str
    expert: int | None = None
    transpose: bool = False

    def take(self, stored: torch.Tensor) -> torch.Tensor:
        t = stored if self.expert is None else stored[self.expert]
        return t.T.contiguous() if self.transpose else t


_STACKED = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_up_proj|down_proj)\.(weight|bias)$")


def tensor_sources(spec: ModelSpec, keys: list[str]) -> dict[str, TensorSource]:
    """Checkpoint source of each module tensor key of the unfused model (identity for
    everything but routed experts stored under other names or stacked)."""
    out = {}
    for key in keys:
        out[key] = TensorSource(key)
        if spec.moe is None or ".mlp." not in key:
            continue
        if spec.model_type == "gpt_oss" and (m := _STACKED.match(key)):
            group, e, proj, kind = m.groups()
            stored = f"{group}.{proj}" + ("_bias" if kind == "bias" else "")
            out[key] = TensorSource(stored, int(e), transpose=kind == "weight")
        elif spec.model_type == "mixtral":  # experts and router under block_sparse_moe
            module, _, kind = key.rpartition(".")
            out[key] = TensorSource(f"{checkpoint_name(module, 'mixtral')}.{kind}")
    return out


def checkpoint_key(key: str, model_type: str) -> str:
    """A tensor key of the unfused model (`module.param`, or transformers' save of it with
    `block_sparse_moe` already in place) under the checkpoint's own names."""
    if model_type != "mixtral":
        return key
    module, _, param = key.rpartition(".")
    return f"{checkpoint_name(module.replace('.block_sparse_moe.', '.mlp.'), model_type)}.{param}"


def check_expert_count(tensor_shapes: dict[str, Any], spec: ModelSpec) -> None:
    """Refuse a checkpoint whose routed experts disagree with its config (names and shapes
    from the safetensors headers: per-expert tensors, or stacked [E, ...] ones).

    Raises:
        UserInputError: one line naming both counts, or the expert tensor whose shape the
            config gets wrong.
    """
    moe = spec.moe
    if moe is None:
        return
    block = moe.moe_blocks[0]
    seen = {int(m.group(2)) for n in tensor_shapes
            if (m := _EXPERT_INDEX.search("." + n)) and int(m.group(1)) == block}
    if not seen:  # stacked experts (gpt-oss's blocks, transformers' own saves)
        stacked = [shape[0] for n, shape in tensor_shapes.items()
                   if f"layers.{block}.mlp.experts." in n and len(shape) >= 3]
        seen = set(range(stacked[0])) if stacked else set()
    if len(seen) != moe.n_experts:
        raise UserInputError(
            f"the checkpoint has {len(seen)} experts in block {block} but its config.json says "
            f"{moe.n_experts}; re-save the model with the config it was trained with")
    for layer in spec.layers:
        if layer.block != block or layer.expert != 0:
            continue
        name = checkpoint_name(layer.name, spec.model_type) + ".weight"
        got = tensor_shapes.get(name)
        want = [layer.out_features, layer.in_features]
        if got is not None and list(got) != want:
            raise UserInputError(
                f"'{name}' is {list(got)} in the checkpoint but config.json makes it {want} "
                "(an expert's [out, in] from hidden_size and the expert intermediate size); "
                "fix config.json or pass the folder the checkpoint came with")


def source_quantization(folder: Path) -> dict[str, Any]:
    """`from_pretrained` keywords for a checkpoint that arrives quantized: gpt-oss's MXFP4
    experts are read at their exact values (E2M1 codes x E8M0 scales are exact in bf16 and
    fp32: transformers' own dequantization), so autoplan measures the model it was given."""
    import json

    try:
        cfg = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    quant = cfg.get("quantization_config") if isinstance(cfg, dict) else None
    if not isinstance(quant, dict) or quant.get("quant_method") != "mxfp4":
        return {}
    from transformers import Mxfp4Config

    return {"quantization_config": Mxfp4Config(dequantize=True)}


def check_moe_checkpoint(folder: Path) -> None:
    """For an HF folder whose config routes to experts: an MoE autoplan plans (else one line
    naming what is missing) whose checkpoint holds the experts its config says; headers only.

    Raises:
        ModelConfigError / UserInputError: one line.
    """
    import json

    from autoplan.modelspec.moe import is_moe_config
    from autoplan.models.check import tensor_shapes

    try:
        cfg = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return  # the loader reports a missing or malformed config itself
    if not isinstance(cfg, dict) or not is_moe_config(cfg, str(cfg.get("model_type", ""))):
        return
    check_expert_count(tensor_shapes(folder), ModelSpec.from_config(cfg))


__all__ = ["ExpertMLP", "RoutingCounter", "UnfusedExperts", "check_expert_count",
           "checkpoint_key", "checkpoint_name",
           "check_moe_checkpoint", "counting_routing", "source_quantization", "TensorSource", "tensor_sources",
           "unfuse_experts"]
