"""A model whose decoder blocks live on disk until needed (sequential onloading).

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from autoplan.errors import UserInputError
from autoplan.models.moe import source_quantization, tensor_sources, unfuse_experts
from autoplan.modelspec import ModelSpec
from autoplan.streaming.weights import CheckpointReader


class BlockArgs(dict):
    """Block 0's keyword arguments, with every block's own in `per_block` (run_block uses
    block i's)."""

    def __init__(self, per_block: list[dict[str, Any]]) -> None:
        super().__init__(per_block[0])
        self.per_block = per_block


class _Recorder(nn.Module):
    """Stands in for a block during `block_inputs`: records the call and passes the hidden
    states through, so the model's forward reaches every block with its own arguments.
    Attributes the forward reads from a block come from the block it replaces."""

    def __init__(self, block: nn.Module, calls: list) -> None:
        super().__init__()
        object.__setattr__(self, "_block", block)  # not a submodule: nothing is registered
        object.__setattr__(self, "_calls", calls)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(object.__getattribute__(self, "_block"), name)

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        kwargs = dict(kwargs)
        hidden = args[0] if args else kwargs.pop("hidden_states")
        self._calls.append((hidden, kwargs))
        return hidden


def _set_tensor(model: nn.Module, name: str, device: torch.device | str,
                value: Tensor | None = None) -> None:
    from accelerate.utils import set_module_tensor_to_device

    set_module_tensor_to_device(model, name, device, value=value)


def _base(model: nn.Module) -> nn.Module:
    base = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    if base is None or not isinstance(getattr(base, "layers", None), nn.ModuleList) \
            or getattr(base, "norm", None) is None:
        raise UserInputError(f"streamed execution supports decoder models with "
                             f"model.layers and model.norm (Llama, Mistral, Qwen2, ...), not "
                             f"{type(model).__name__}: use --execution memory")
    return base


class StreamedModel:
    """Meta-device skeleton + resident embeddings/norm/lm_head + blocks read on demand.

    Args:
        folder: an HF safetensors folder.
        device: where blocks are computed.
        dtype: compute dtype (float32: the in-memory path's numerics, on every device).
    """

    def __init__(self, folder: Path, *, device: torch.device, dtype: torch.dtype = torch.float32,
                 trust_remote_code: bool = False) -> None:
        from accelerate import init_empty_weights
        from transformers import AutoConfig, AutoModelForCausalLM

        from autoplan.models.gguf_convert import quiet_transformers

        self.folder, self.device, self.dtype = Path(folder), device, dtype
        self.trust_remote_code = trust_remote_code
        # gpt-oss's MXFP4 experts: read at their exact values, as the in-memory loader does
        self.reader = CheckpointReader(self.folder,
                                       mxfp4=bool(source_quantization(self.folder)))
        with quiet_transformers():
            config = AutoConfig.from_pretrained(self.folder, trust_remote_code=trust_remote_code)
            with init_empty_weights(include_buffers=False):
                model = AutoModelForCausalLM.from_config(config, dtype=dtype,
                                                         trust_remote_code=trust_remote_code)
        model.eval()
        # MoE: every routed expert an nn.Linear, read from its checkpoint tensor (renamed,
        # or a row of a stacked one: models/moe.py)
        spec = ModelSpec.from_config(config.to_dict())
        unfuse_experts(model, spec)
        self.model = model
        self.config = config
        self.base = _base(model)
        self.blocks: nn.ModuleList = self.base.layers
        names = {m: n for n, m in model.named_modules()}
        prefix = names[self.blocks]
        keys = list(model.state_dict().keys())
        self.sources = tensor_sources(spec, keys)
        self.block_keys: list[list[str]] = [
            [k for k in keys if k.startswith(f"{prefix}.{i}.")] for i in range(len(self.blocks))]
        in_blocks = {k for ks in self.block_keys for k in ks}
        missing = [k for ks in self.block_keys for k in ks if not self._stored(k)]
        if missing:
            raise UserInputError(f"checkpoint in '{folder}' lacks {missing[0]} "
                                 f"(+{len(missing) - 1} more); re-save it with save_pretrained")
        for name, buf in model.named_buffers():  # rotary tables etc.: not in the checkpoint
            if buf.device.type != "meta":
                _set_tensor(model, name, device, value=buf)
        embed = model.get_input_embeddings()
        self.embed_keys = [k for k in keys if k.startswith(f"{names[embed]}.")]
        head_keys = [k for k in keys if k.startswith(f"{names[self.head]}.")]
        # A tied lm_head is the embedding matrix: the checkpoint stores it once.
        self.tied = bool(getattr(config, "tie_word_embeddings", False)) or not all(
            self._stored(k) for k in head_keys)
        self.head_keys = self.embed_keys if self.tied else head_keys
        on_demand = set(self.embed_keys) | set(head_keys)
        for k in [*self.embed_keys, *self.head_keys]:
            if not self._stored(k):
                raise UserInputError(f"checkpoint in '{folder}' lacks {k}; re-save it with "
                                     "save_pretrained")
        always = [k for k in keys if k not in in_blocks and k not in on_demand]
        for name, t in self._read([k for k in always if self._stored(k)]).items():
            _set_tensor(model, name, device, value=t)
        left = [k for k in always if not self._stored(k)]
        if left:
            raise UserInputError(f"checkpoint in '{folder}' lacks {left[0]}; re-save it with "
                                 "save_pretrained")
        for p in model.parameters():
            p.requires_grad_(False)
        self._holds: dict[str, int] = {}

    def _stored(self, key: str) -> bool:
        return self.sources[key].key in self.reader

    def _read(self, keys: list[str]) -> dict[str, Tensor]:
        """Module tensors by key in the compute dtype, each stored tensor read once (a
        stacked expert tensor gives every expert of the block its row).

        A stacked float tensor (gpt-oss in bf16) is read on its own, as stored, and each
        expert's row converted as it is taken: read whole in the compute dtype it would sit
        beside its experts' own copies, a second block's worth of fp32. MXFP4 experts are
        decoded into one buffer whose rows are the experts (no copy is taken)."""
        users: dict[str, list[str]] = defaultdict(list)
        for k in keys:
            users[self.sources[k].key].append(k)
        stacked = [s for s, ks in users.items()
                   if s not in self.reader.packed
                   and any(self.sources[k].expert is not None for k in ks)]
        out: dict[str, Tensor] = {}
        singles = self.reader.read([s for s in users if s not in stacked], dtype=self.dtype)
        for s, tensor in singles.items():
            out.update({k: self.sources[k].take(tensor) for k in users[s]})
        del singles
        for s in stacked:
            tensor = self.reader.read([s])[s]
            out.update({k: self.sources[k].take(tensor).to(self.dtype) for k in users[s]})
            del tensor
        return out

    def _tie(self) -> None:
        if self.tied:
            self.head.weight = self.model.get_input_embeddings().weight

    @contextmanager
    def _hold(self, keys: list[str]) -> Iterator[None]:
        """`keys` on the device for the duration; nested holds of a key load it once."""
        fresh = [k for k in keys if self._holds.get(k, 0) == 0]
        for k in keys:
            self._holds[k] = self._holds.get(k, 0) + 1
        try:
            for name, t in self._read(fresh).items():
                _set_tensor(self.model, name, self.device, value=t)
                self.model.get_parameter(name).requires_grad_(False)
            self._tie()
            yield
        finally:
            for k in keys:
                self._holds[k] -= 1
            for k in keys:
                if self._holds[k] == 0:
                    _set_tensor(self.model, k, "meta")
            self._tie()

    def embeddings(self) -> contextlib.AbstractContextManager[None]:
        """The token embedding on the device while the block is entered (for block_inputs)."""
        return self._hold(self.embed_keys)

    def head_resident(self) -> contextlib.AbstractContextManager[None]:
        """lm_head on the device while the block is entered (for logits and head layers)."""
        return self._hold(self.head_keys)

    @property
    def n_blocks(self) -> int:
        return len(self.blocks)

    @property
    def head(self) -> nn.Module:
        return self.model.get_output_embeddings()

    @contextmanager
    def resident(self, i: int) -> Iterator[nn.Module]:
        """Block `i` with its weights on the device; back on the meta device afterwards."""
        with self._hold(self.block_keys[i]):
            yield self.blocks[i]

    def block_inputs(self, batch: Tensor) -> tuple[Tensor, BlockArgs]:
        """Block 0's hidden states and each block's keyword arguments for token ids `batch`
        [b, seq]."""
        calls: list[tuple[Tensor, dict[str, Any]]] = []
        blocks = list(self.blocks)
        for i, block in enumerate(blocks):
            self.blocks[i] = _Recorder(block, calls)
        try:
            with torch.no_grad(), self.embeddings():
                self.base(input_ids=batch.to(self.device), use_cache=False)
        finally:
            for i, block in enumerate(blocks):
                self.blocks[i] = block
        if len(calls) != len(blocks):  # pragma: no cover - a forward that skips blocks
            raise UserInputError("the model's forward did not call each decoder block once: "
                                 "use --execution memory")
        return calls[0][0], BlockArgs([kw for _, kw in calls])

    def run_block(self, i: int, hidden: Tensor, kwargs: dict[str, Any]) -> Tensor:
        if isinstance(kwargs, BlockArgs):
            kwargs = kwargs.per_block[i]
        out = self.blocks[i](hidden, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    def logits(self, hidden: Tensor) -> Tensor:
        """What the CausalLM computes after the blocks: final norm, lm_head, and Gemma 2's
        final soft-cap (cap * tanh(logits / cap), in transformers' order of operations)."""
        with self.head_resident():
            logits = self.head(self.base.norm(hidden))
        cap = getattr(self.config, "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits


__all__ = ["BlockArgs", "StreamedModel"]
