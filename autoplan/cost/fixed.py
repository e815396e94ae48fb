"""The parts of a step that do not depend on the per-layer choices: attention with its
KV-cache traffic, norms and elementwise ops, embeddings, sampling, and fixed overheads.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoplan.cost.efficiency import FamilyEfficiency
from autoplan.cost.kv import KvLayout, block_token_bytes, cached_tokens
from autoplan.modelspec import ModelSpec
from autoplan.targets import Target
from autoplan.workload import Workload

# Non-GEMM kernels per transformer block in a tuned runtime (vLLM / TensorRT-LLM): two
# fused residual-add + norm, rotary embedding, KV-cache write, attention, activation.
_BLOCK_KERNELS = 6
# Per step: embedding gather, final norm, logits processing + sampling.
_STEP_KERNELS = 3


@dataclass(frozen=True)
class PhaseTime:
    """Seconds of one prefill pass over the batch's prompts and of one decode step."""

    prefill_s: float
    decode_s: float

    def __add__(self, other: PhaseTime) -> PhaseTime:
        return PhaseTime(self.prefill_s + other.prefill_s, self.decode_s + other.decode_s)

    def scaled(self, factor: float) -> PhaseTime:
        return PhaseTime(self.prefill_s * factor, self.decode_s * factor)


ZERO = PhaseTime(0.0, 0.0)


@dataclass(frozen=True)
class KvBlockCost:
    """One block's KV cache in a step: its stored bytes per token and its attention time."""

    block: int
    format: str
    bytes_per_token: float
    window: int
    prefill_s: float
    decode_s: float
    read_bytes: float  # one decode step's read of this block's cache


@dataclass(frozen=True)
class FixedCost:
    """Non-linear parts by name, and the KV bytes one decode step reads (for MBU)."""

    parts: dict[str, PhaseTime]
    kv_read_bytes: float
    kv_blocks: tuple[KvBlockCost, ...] = ()

    @property
    def total(self) -> PhaseTime:
        out = ZERO
        for part in self.parts.values():
            out = out + part
        return out


def _roof(bytes_: float, flops: float, bw: float, peak: float) -> float:
    return max(bytes_ / bw, flops / peak)


def _causal_pairs(s: int, window: int) -> float:
    """(query, key) pairs causal attention over s tokens computes, S^2 / 2 as the dense
    formula counts them; a sliding window keeps about window * s - window^2 / 2."""
    if not window or window >= s:
        return s * s / 2
    return window * s - window * window / 2


@dataclass(frozen=True)
class _AttentionShape:
    """Per-token attention sizes of one block (elements, bytes, FLOPs)."""

    query: int  # elements of one token's query that decode attention reads
    decode_flops_per_key: float  # per cached token, per query token
    prefill_bytes: float  # q, k, v read and the output written, per prompt token
    prefill_flops_per_pair: float  # per causal (query, key) pair
    rotary: int  # elements the rotary embedding rewrites per token

    @classmethod
    def of(cls, spec: ModelSpec) -> _AttentionShape:
        heads, d = spec.n_heads, spec.head_dim
        mla = spec.mla
        if mla is not None:  # decode over the latent (absorbed), prefill per head: mla.py
            return cls(heads * mla.cached_width, mla.decode_flops_per_key(heads),
                       (mla.prefill_qkv_width(heads) + heads * mla.v_head_dim) * 2,
                       mla.prefill_flops_per_pair(heads), mla.rotary_width(heads))
        q_out, kv_out = heads * d, spec.n_kv_heads * d
        return cls(q_out, 4 * heads * d, (2 * q_out + 2 * kv_out) * 2, 4 * heads * d,
                   q_out + kv_out)


def fixed_cost(spec: ModelSpec, target: Target, eff: FamilyEfficiency, workload: Workload,
               base_peak: float, kv_bytes: float | KvLayout, chunk_tokens: int) -> FixedCost:
    """Attention, elementwise, embedding and overhead terms for a workload.

    Args:
        spec: the model architecture.
        target: the hardware.
        eff: the family's efficiency constants.
        workload: batch and lengths; decode is costed at the mean decode context.
        base_peak: FLOP/s of the baseline math (attention runs there).
        kv_bytes: bytes per KV-cache element, or a per-block KvLayout.
        chunk_tokens: prefill tokens per engine step (chunked prefill).

    Returns:
        The fixed terms.
    """
    bw, peak = eff.eta_bw * target.bandwidth, eff.eta_c * base_peak
    b, s, ctx = workload.batch, workload.input_len, workload.mean_decode_context
    layers = spec.n_layers
    shape = _AttentionShape.of(spec)
    chunks = math.ceil(b * s / chunk_tokens)
    layout = kv_bytes if isinstance(kv_bytes, KvLayout) else KvLayout.uniform_bytes(spec, kv_bytes)

    # Attention, block by block. Decode reads the block's whole KV cache once per step;
    # prefill is compute-bound.
    blocks, kv_read, attn_pre, attn_dec = [], 0.0, 0.0, 0.0
    for i, (elem, fmt) in enumerate(zip(layout.element_bytes, layout.formats)):
        window = spec.window(i)
        ctx_i = cached_tokens(window, ctx)  # a sliding-window block reads its window
        per_tok = block_token_bytes(spec, elem)
        read = b * ctx_i * per_tok
        dec = _roof(read + b * shape.query * 4, b * ctx_i * shape.decode_flops_per_key, bw,
                    peak)
        pre = _roof(b * s * shape.prefill_bytes,
                    b * _causal_pairs(s, window) * shape.prefill_flops_per_pair, bw, peak)
        blocks.append(KvBlockCost(i, fmt.value if fmt else f"{elem:g} bytes", per_tok, window,
                                  pre, dec, read))
        kv_read, attn_pre, attn_dec = kv_read + read, attn_pre + pre, attn_dec + dec

    # Elementwise passes per token per block (bytes): 2 norms and 2 residual adds over the
    # hidden state, rotary on q and k, the MLP activation, the KV-cache write.
    mlp_act = (3 if spec.gated_mlp else 2) * spec.active_intermediate * 2
    per_tok = layers * (10 * spec.hidden * 2 + 2 * shape.rotary * 2 + mlp_act) \
        + sum(block_token_bytes(spec, e) for e in layout.element_bytes)
    elem = PhaseTime(b * s * per_tok / bw, b * per_tok / bw)

    emb_tok = spec.hidden * 2 * 3  # gather + final norm read/write
    sample = b * spec.vocab * 4 * 2  # fp32 logits written and read by the sampler
    embed = PhaseTime((b * s * emb_tok + sample) / bw, (b * emb_tok + sample) / bw)

    kernels = layers * _BLOCK_KERNELS + _STEP_KERNELS
    overhead = PhaseTime(chunks * (kernels * eff.kernel_s + eff.step_s),
                         kernels * eff.kernel_s + eff.step_s)
    parts = {
        "attention": PhaseTime(attn_pre, attn_dec),
        "norms_elementwise": elem,
        "embedding_sampling": embed,
        "kernel_overhead": overhead,
    }
    return FixedCost(parts, kv_read, tuple(blocks))


__all__ = ["FixedCost", "KvBlockCost", "PhaseTime", "ZERO", "fixed_cost"]
