"""Memory plan of a profile + verification run, from the model's config alone.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autoplan.models.head import chunk_rows
from autoplan.modelspec import ModelSpec

F32 = 4
RESIDENT = "weights resident (fp32 block or embedding)"
# fp32 [positions, vocab] arrays alive at once while a chunk of logits is reduced: the
# logits, their log-softmax, its exponent and the KL's temporaries (models/head.py)
LOGIT_COPIES = 6
SIM_BYTES = 6  # per parameter of a compressed layer: fp32 weight, bool mask, int8 codes
PROCESS_BYTES = 700 * 2**20  # python + torch + transformers, measured ~0.6-0.7 GB on CPU
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1}


@dataclass(frozen=True)
class Workload:
    """Token counts of a run (calibration tokens, tokens per forward batch, evaluation)."""

    calib_tokens: int = 1024
    calib_batch_tokens: int = 512
    eval_tokens: int = 1536
    eval_batch_tokens: int = 1024
    seq_len: int = 256
    head_profiled: bool = True  # the lm_head is profiled (not protected by the search space)
    # verification holds each layer's full input Hessian (GPTQ, SparseGPT), else only its
    # diagonal (RTN with magnitude or Wanda scores: streaming/evaluate.py)
    full_hessians: bool = True


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per part and per place; `host`/`device` totals are the peaks of the run."""

    execution: str
    device: str  # "cpu" or "cuda"
    host_parts: dict[str, int] = field(default_factory=dict)
    device_parts: dict[str, int] = field(default_factory=dict)
    # part -> the phase it belongs to ("profile" or "verification"); the two phases run one
    # after the other, so a place's peak is its other parts plus the larger phase
    phases: dict[str, str] = field(default_factory=dict)

    def _peak(self, parts: dict[str, int]) -> int:
        shared = sum(b for k, b in parts.items() if k not in self.phases)
        per_phase: dict[str, int] = {}
        for k, b in parts.items():
            if k in self.phases:
                per_phase[self.phases[k]] = per_phase.get(self.phases[k], 0) + b
        return shared + max(per_phase.values(), default=0)

    @property
    def host(self) -> int:
        if self.device == "cpu":
            return self._peak({**self.host_parts, **self.device_parts})
        return self._peak(self.host_parts)

    @property
    def device_total(self) -> int:
        return self._peak(self.device_parts)

    @property
    def gpu(self) -> int:
        return self.device_total if self.device != "cpu" else 0

    def phase_host(self, phase: str) -> int:
        """Host peak of one phase alone (what `profile` needs without a search's
        verification, say)."""
        parts = {**self.host_parts, **(self.device_parts if self.device == "cpu" else {})}
        return sum(b for k, b in parts.items() if self.phases.get(k, phase) == phase)

    def to_json(self) -> dict:
        return {"execution": self.execution, "device": self.device,
                "host_bytes": self.host, "device_bytes": self.gpu,
                "host_bytes_by_phase": {ph: self.phase_host(ph)
                                        for ph in sorted(set(self.phases.values()))},
                "host_parts": self.host_parts, "device_parts": self.device_parts,
                "phases": self.phases}


def _block_dims(spec: ModelSpec, full_hessians: bool = True) -> tuple[int, int, int, int]:
    """(params, distinct input features, output features, Hessian elements: sum of in^2, or
    of in for diagonals only) of one block (the first MoE block of an MoE model). A routed
    expert sees only its tokens: per token, the experts' captures are top_k experts' inputs
    and outputs, not all E."""
    index = spec.moe.moe_blocks[0] if spec.moe is not None and spec.moe.moe_blocks else 0
    block = [la for la in spec.layers if la.block == index]
    dense = [la for la in block if la.expert < 0]
    groups = {la.fuse_group: la.in_features for la in dense}
    ins, outs = sum(groups.values()), sum(la.out_features for la in dense)
    one_expert = [la for la in block if la.expert == 0]
    if one_expert:  # gate/up read the token's hidden state, down its activation
        k = spec.moe.top_k
        ins += k * (spec.hidden + spec.moe.expert_intermediate)
        outs += k * sum(la.out_features for la in one_expert)
    power = 2 if full_hessians else 1
    return (sum(la.params for la in block), ins, outs,
            sum(la.in_features ** power for la in block))


def _largest_block_tensor(spec: ModelSpec) -> int:
    """Elements of the largest tensor a block stores (gpt-oss stacks a block's routed experts
    in one tensor per projection; other checkpoints store one per expert)."""
    moe = spec.moe
    if moe is not None and moe.fused_gate_up:
        index = moe.moe_blocks[0] if moe.moe_blocks else 0
        experts = [la for la in spec.layers if la.block == index and la.expert >= 0]
        return max((sum(la.params for la in experts if la.role == role)
                    for role in {la.role for la in experts}), default=0)
    return max((la.params for la in spec.layers if la.role != "lm_head"), default=0)


def _converting_bytes(spec: ModelSpec) -> int:
    """Bytes held beside the resident fp32 block while its largest tensor is read: that
    tensor as stored; gpt-oss's MXFP4 experts at 4.25 bits a weight, plus the decoder's
    scratch for the one expert it decodes at a time, two fp32 copies of it
    (streaming/weights.py)."""
    n = _largest_block_tensor(spec)
    moe = spec.moe
    if moe is None or moe.source_format != "mxfp4":
        return n * _DTYPE_BYTES.get(spec.dtype, 2)
    return int(n * 4.25 / 8 + 2 * F32 * n / moe.n_experts)


def checkpoint_bytes(spec: ModelSpec, params: float | None = None) -> float:
    """Bytes on disk of the whole checkpoint (or of `params` parameters of one block): the
    checkpoint dtype, with gpt-oss's routed experts as MXFP4 (4.25 bits per weight)."""
    per = _DTYPE_BYTES.get(spec.dtype, 2)
    moe = spec.moe
    total = spec.total_params if params is None else params
    if moe is None or moe.source_format != "mxfp4":
        return total * per
    experts = sum(la.params for la in spec.layers if la.expert >= 0)
    if params is not None:  # one block: its share of the experts
        experts /= max(1, len(moe.moe_blocks))
    return (total - experts) * per + experts * 4.25 / 8


def _activations(spec: ModelSpec, batch_tokens: int, seq_len: int) -> int:
    """Autograd activations of one block over one batch (norms, attention, MLP)."""
    q_out = spec.n_heads * spec.head_dim
    kv_out = spec.n_kv_heads * spec.head_dim
    per_token = 6 * spec.hidden + 2 * q_out + 4 * kv_out + 4 * spec.active_intermediate
    attn = spec.n_heads * seq_len * batch_tokens  # attention probabilities
    return (per_token * batch_tokens + attn) * F32


def _scoring(spec: ModelSpec, tokens: int, head: bool = True) -> int:
    """One ScoreTask: Hessian in^2, ~3 copies of the weight, ~3 [tokens, out] products (the
    largest profiled layer's; the lm_head only when it is profiled)."""
    return max(la.in_features ** 2 * F32 + 3 * la.params * F32
               + 3 * tokens * la.out_features * F32 for la in spec.layers
               if head or la.role != "lm_head")


def logits_bytes(vocab: int) -> int:
    """Peak bytes of the logits: LOGIT_COPIES x `chunk_rows(vocab)` positions x vocab fp32,
    the same for any number of tokens."""
    return LOGIT_COPIES * chunk_rows(vocab) * vocab * F32


def plan(spec: ModelSpec, execution: str, device: str, w: Workload | None = None) -> MemoryPlan:
    """The memory plan of `execution` ('memory' or 'stream') on `device` ('cpu'/'cuda')."""
    w = w or Workload()
    dev = "cpu" if device == "cpu" else "cuda"
    block_params, block_in, block_out, block_h = _block_dims(spec, w.full_hessians)
    t, v, h = w.calib_tokens, spec.vocab, spec.hidden
    logits = logits_bytes(v)
    reference = w.eval_tokens * v * 2
    # the lm_head's captured inputs and output gradients (T x vocab), when it is profiled
    head_capture = t * (h + v) * F32 if w.head_profiled else 0
    chunked = f"logits ({chunk_rows(v)} positions x {v:,} at a time)"
    if execution == "memory":
        weights = spec.total_params * F32
        compressed = sum(la.params for la in spec.layers
                         if w.head_profiled or la.role != "lm_head")
        parts = {
            "weights (fp32, whole model)": weights,
            "captures (all blocks' layers)": spec.n_layers * t * (block_in + block_out) * F32,
            "lm_head captures (T x vocab gradients)": head_capture,
            "activations (whole model, 1 batch)": spec.n_layers * _activations(
                spec, w.calib_batch_tokens, w.seq_len),
            chunked: logits,
            "scoring (largest layer)": _scoring(spec, t, w.head_profiled),
            # verification: the copy shares the original's tensors and holds its compressed
            # layers (fp32 simulated weight, keep-mask, codes: SIM_BYTES each), and every
            # layer's Hessian at once
            "compressed layers + all Hessians": compressed * SIM_BYTES
            + spec.n_layers * block_h * F32 + (h * h if w.full_hessians else h) * F32,
            "reference log-probs": reference,
        }
        phases = dict.fromkeys(("captures (all blocks' layers)",
                                "lm_head captures (T x vocab gradients)",
                                "activations (whole model, 1 batch)", "scoring (largest layer)"),
                               "profile") | dict.fromkeys(
            ("compressed layers + all Hessians", "reference log-probs"),
            "verification")
        return MemoryPlan(execution, dev, {"process": PROCESS_BYTES}, parts, phases)
    # One block, or the embedding / lm_head, is resident at a time (never both: the
    # embedding is read for the first block's inputs, the lm_head after the last block), and
    # each is read a tensor at a time, so only one tensor is also held as stored while it is
    # converted.
    on_demand = max(spec.embedding_params, v * h)
    per = _DTYPE_BYTES.get(spec.dtype, 2)
    resident = max(block_params * F32 + _converting_bytes(spec), on_demand * (F32 + per))
    # verification compresses every decided layer of the resident block once per block and
    # keeps the simulations until the block is done, with the block's Hessians
    hessians = ("verification: one block's Hessians (GPTQ / SparseGPT)" if w.full_hessians
                else "verification: one block's Hessian diagonals")
    block_sims = block_params * SIM_BYTES
    device_parts = {
        RESIDENT: resident,
        "one block's captures": max(t * (block_in + block_out) * F32, head_capture),
        "activations (one block, 1 batch)": _activations(
            spec, w.calib_batch_tokens, w.seq_len),
        "scoring (largest layer)": _scoring(spec, t, w.head_profiled),
        hessians: block_h * F32,
        "verification: one block's simulations": block_sims,
        chunked: logits,
    }
    host_parts = {
        "process": PROCESS_BYTES,
        "block-boundary states": (spec.n_layers + 1) * t * h * F32 + 2 * t * h * F32,
        "reference log-probs": reference,
    }
    phases = {"one block's captures": "profile", "activations (one block, 1 batch)": "profile",
              "scoring (largest layer)": "profile",
              hessians: "verification",
              "verification: one block's simulations": "verification",
              "reference log-probs": "verification"}
    return MemoryPlan(execution, dev, host_parts, device_parts, phases)


# Share of the available memory the in-memory estimate may take: comfortably inside it when
# streaming is an option (the estimate is not a bound: allocator slack, the evaluation's
# logits), nearly all of it when the request cannot stream (--recover, gates, kernel timing).
COMFORTABLE = {"cpu": 0.25, "gpu": 0.5}
NEEDED = 0.9


def choose(spec: ModelSpec, device: str, host_available: int, device_memory: int | None,
           w: Workload | None = None, needs_memory: str | None = None) -> tuple[str, str]:
    """('memory' | 'stream', why): in memory when it fits comfortably (it is the simpler,
    slightly faster path: no recomputation), streamed otherwise. `needs_memory` names what
    in the request cannot stream (e.g. "--recover"): then memory whenever it fits at all."""
    mem = plan(spec, "memory", device, w)
    kind = "cpu" if device == "cpu" else "gpu"
    need, room = (mem.host, host_available) if kind == "cpu" else (mem.gpu, device_memory)
    share = NEEDED if needs_memory else COMFORTABLE[kind]
    fits = room is not None and need <= share * room
    gb = 2**30
    why = (f"in-memory peak ~{need / gb:.1f} GiB vs {(room or 0) / gb:.1f} GiB "
           f"{'available RAM' if kind == 'cpu' else 'GPU memory'}"
           + (f"; in memory for {needs_memory}" if needs_memory and fits else ""))
    return ("memory" if fits else "stream"), why


__all__ = ["LOGIT_COPIES", "MemoryPlan", "Workload", "checkpoint_bytes", "choose",
           "logits_bytes", "plan"]
