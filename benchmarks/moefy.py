"""MoEfy the embedded SmolLM2-135M into a Mixtral-format HF folder: a real-weight MoE to test on.

Each block's MLP (1,536 SiLU-gated neurons) is split into E experts of 1,536 / E neurons
(MoEfication, Zhang et al. 2022): neurons that fire together share an expert (balanced
k-means on their calibration activations |silu(g) u|), and expert e keeps exactly its
neurons' gate and up rows and down columns. Mixtral's router weights the top-k experts by
a softmax renormalized over them, so each expert's down projection is scaled by k: with a
router that is zero, top-k = E weights every expert 1/E and the block computes the dense MLP
exactly (up to the order of the float sums). With k < E the router picks, per token, the
k experts with the largest predicted output norm: a least-squares fit of each expert's
output norm on the MLP input over the calibration tokens, scaled so that its logits stay
small (the renormalized weights stay close to 1/k, the selected experts' sum close to
what they contributed in the dense model). What the dropped experts contributed is the
approximation, whose KL against the dense model on the held-out evaluation split is
reported.

Usage:
  python benchmarks/moefy.py --experts 8 --top-k 4 [--out FOLDER] [--json RESULTS] [--gguf]
      [--gguf-only | --measure-only]   (an existing folder: its GGUF, or its KL and routing)
Default folder: $AUTOPLAN_CACHE/models/smollm2-135m-moe-e{E}k{k}; results
benchmarks/results/moe_moefy_e{E}k{k}.json.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import start_run, write_result  # noqa: E402

CALIB_BLOCKS = 16  # 4,096 calibration tokens of 256 (the router fit and the neuron clusters)
LOGIT_STD = 0.02  # router logits' spread: renormalized top-k weights within ~1/k (1 +- 2 %)
SEED = 26


def mlp_inputs(model, batches: torch.Tensor) -> list[torch.Tensor]:
    """Per block, the MLP's input (the post-attention norm's output) over the tokens."""
    layers = model.model.layers
    got: list[list[torch.Tensor]] = [[] for _ in layers]
    hooks = [layer.mlp.register_forward_pre_hook(
        lambda _m, args, i=i: got[i].append(args[0].reshape(-1, args[0].shape[-1]).detach()))
        for i, layer in enumerate(layers)]
    try:
        with torch.no_grad():
            for row in batches:
                model(input_ids=row[None])
    finally:
        for h in hooks:
            h.remove()
    return [torch.cat(x) for x in got]


def balanced_clusters(features: torch.Tensor, groups: int, iters: int = 10,
                      seed: int = SEED) -> list[torch.Tensor]:
    """Partition the rows of `features` [n, d] into `groups` clusters of n / groups rows
    each (k-means with a greedy capacity-respecting assignment)."""
    n = features.shape[0]
    size = n // groups
    x = F.normalize(features, dim=1)
    gen = torch.Generator().manual_seed(seed)
    centers = x[torch.randperm(n, generator=gen)[:groups]].clone()
    assign = [0] * n
    for _ in range(iters):
        sim = x @ centers.T  # [n, groups]
        order = torch.argsort(sim.reshape(-1), descending=True).tolist()
        taken, room = [False] * n, [size] * groups
        for flat in order:  # best (neuron, expert) pairs first, each expert up to `size`
            i, g = divmod(flat, groups)
            if not taken[i] and room[g]:
                assign[i], taken[i] = g, True
                room[g] -= 1
        labels = torch.tensor(assign)
        centers = torch.stack([F.normalize(x[labels == g].mean(0), dim=0) for g in range(groups)])
    labels = torch.tensor(assign)
    return [torch.nonzero(labels == g).squeeze(1) for g in range(groups)]


def moefy_block(mlp, x: torch.Tensor, experts: int, top_k: int
                ) -> tuple[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], torch.Tensor]:
    """Experts (gate rows, up rows, down columns x top_k) and router weight [E, hidden] of one
    dense MLP, from its calibration inputs x [T, hidden]."""
    wg, wu, wd = (mlp.gate_proj.weight.detach(), mlp.up_proj.weight.detach(),
                  mlp.down_proj.weight.detach())
    act = F.silu(x @ wg.T) * (x @ wu.T)  # [T, inter]
    groups = balanced_clusters(act.abs().T.contiguous(), experts)
    parts, norms = [], []
    for idx in groups:
        idx = torch.sort(idx).values
        parts.append((wg[idx].clone(), wu[idx].clone(), (wd[:, idx] * top_k).contiguous()))
        norms.append((act[:, idx] @ wd[:, idx].T).norm(dim=1))  # expert output norm per token
    y = torch.stack(norms, dim=1)  # [T, E]
    if top_k == experts:  # every expert is picked: a zero router weights them all 1/E
        return parts, torch.zeros(experts, x.shape[1])
    ridge = 1e-3 * x.pow(2).mean() * x.shape[0]
    a = x.T @ x + ridge * torch.eye(x.shape[1])
    router = torch.linalg.solve(a, x.T @ (y - y.mean(0))).T  # [E, hidden]
    scale = LOGIT_STD / float((x @ router.T).std())
    return parts, router * scale


def build(dense, batches: torch.Tensor, experts: int, top_k: int):
    """A transformers MixtralForCausalLM holding the MoEfied dense Llama."""
    import transformers

    cfg = dense.config
    mcfg = transformers.MixtralConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size // experts,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
        hidden_act=cfg.hidden_act, max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=cfg.rms_norm_eps, rope_parameters=dict(cfg.rope_parameters),
        tie_word_embeddings=cfg.tie_word_embeddings, num_local_experts=experts,
        num_experts_per_tok=top_k, sliding_window=None, bos_token_id=cfg.bos_token_id,
        eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id, router_jitter_noise=0.0)
    moe = transformers.MixtralForCausalLM(mcfg).eval()
    state = {k: v for k, v in dense.state_dict().items() if ".mlp." not in k}
    missing = moe.load_state_dict(state, strict=False).missing_keys
    inputs = mlp_inputs(dense, batches)
    for i, layer in enumerate(dense.model.layers):
        parts, router = moefy_block(layer.mlp, inputs[i], experts, top_k)
        block = moe.model.layers[i].mlp
        with torch.no_grad():
            block.gate.weight.copy_(router)
            block.experts.gate_up_proj.copy_(torch.stack([torch.cat([g, u]) for g, u, _ in parts]))
            block.experts.down_proj.copy_(torch.stack([d for _, _, d in parts]))
    unexpected = [k for k in missing if ".mlp." not in k and "lm_head" not in k]
    if unexpected:
        raise RuntimeError(f"weights not carried over: {unexpected[:3]}")
    moe.tie_weights()
    return moe


def write_gguf(folder: Path, out: Path) -> Path:
    """The MoEfied folder as a GGUF llama.cpp runs (what its convert_hf_to_gguf.py writes
    for Mixtral: arch "llama" with `llama.expert_count`): the embedded GGUF's metadata,
    tokenizer, embeddings, norms and attention tensors copied byte for byte (the folder holds
    their exact dequantized values), the router and the stacked experts in F32."""
    import numpy as np
    from gguf import GGUFReader, GGUFValueType, GGUFWriter
    from safetensors.torch import load_file

    from autoplan.models.registry import resolve_model_arg

    cfg = __import__("json").loads((folder / "config.json").read_text())
    experts, top_k = cfg["num_local_experts"], cfg["num_experts_per_tok"]
    state = {}
    for f in sorted(folder.glob("*.safetensors")):
        state.update(load_file(str(f)))
    reader = GGUFReader(str(resolve_model_arg("smollm2-135m").path))
    tmp = out.with_name(f".{out.name}.tmp")
    writer = GGUFWriter(str(tmp), "llama")
    skip = ("general.architecture", "general.file_type", "llama.feed_forward_length")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in skip:
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    writer.add_uint32("llama.feed_forward_length", cfg["intermediate_size"])
    writer.add_uint32("llama.expert_count", experts)
    writer.add_uint32("llama.expert_used_count", top_k)
    writer.add_uint32("general.file_type", 0)  # mostly F32 (the experts)

    def expert_stack(block: int, proj: str) -> np.ndarray:
        return np.stack([state[f"model.layers.{block}.block_sparse_moe.experts.{e}.{proj}.weight"]
                         .float().numpy() for e in range(experts)])

    for t in reader.tensors:
        if ".ffn_" in t.name and t.name.split(".")[2] in ("ffn_gate", "ffn_up", "ffn_down"):
            if t.name.split(".")[2] != "ffn_gate":
                continue  # the three are written once, with the router, below
            block = int(t.name.split(".")[1])
            router = state[f"model.layers.{block}.block_sparse_moe.gate.weight"].float().numpy()
            writer.add_tensor(f"blk.{block}.ffn_gate_inp.weight", router)
            for proj, name in (("w1", "ffn_gate_exps"), ("w3", "ffn_up_exps"),
                               ("w2", "ffn_down_exps")):
                writer.add_tensor(f"blk.{block}.{name}.weight", expert_stack(block, proj))
            continue
        writer.add_tensor(t.name, np.asarray(t.data), raw_shape=t.data.shape,
                          raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.rename(out)
    return out


def mean_kl(ref_logits: torch.Tensor, logits: torch.Tensor) -> float:
    """KL(ref || model) in nats per token."""
    lp, lq = ref_logits.float().log_softmax(-1), logits.float().log_softmax(-1)
    return float((lp.exp() * (lp - lq)).sum(-1).mean())


def perplexity(logits: torch.Tensor, blocks: torch.Tensor) -> float:
    """Next-token perplexity of concatenated per-block logits [n * seq, vocab]."""
    seq = blocks.shape[1]
    lp = logits.float().log_softmax(-1).reshape(blocks.shape[0], seq, -1)[:, :-1]
    nll = -lp.gather(-1, blocks[:, 1:, None]).mean()
    return float(torch.exp(nll))


def logits_of(model, blocks: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([model(input_ids=row[None]).logits[0] for row in blocks])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--out", default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gguf", action="store_true",
                        help="also write FOLDER.gguf for llama.cpp (the source of GGUF plans)")
    parser.add_argument("--gguf-only", action="store_true",
                        help="only write the GGUF of an existing MoEfied --out folder")
    parser.add_argument("--measure-only", action="store_true",
                        help="only measure an existing MoEfied --out folder against the dense "
                             "model (KL, routing): no rebuild")
    args = parser.parse_args(argv)
    if args.experts < 1 or 1536 % args.experts or not 1 <= args.top_k <= args.experts:
        parser.error("--experts must divide 1,536 and 1 <= --top-k <= --experts")
    torch.set_num_threads(args.threads)
    info, command = start_run(SEED, argv)

    from autoplan.atomic import atomic_dir
    from autoplan.models import load_model
    from autoplan.models._cache import models_dir
    from autoplan.quality.text import load_text_dataset

    tag = f"e{args.experts}k{args.top_k}"
    out = Path(args.out) if args.out else models_dir() / f"smollm2-135m-moe-{tag}"
    if args.gguf_only:
        print(f"wrote {write_gguf(out, out.with_suffix('.gguf'))}")
        return 0
    t0 = time.perf_counter()
    dense = load_model("smollm2-135m")
    data = load_text_dataset(tokenizer=dense.tokenizer, seq_len=256, n_calib=CALIB_BLOCKS,
                             n_eval=8, seed=SEED)
    build_s = None
    if not (args.measure_only and (out / "config.json").is_file()):
        moe = build(dense.model, data.calib, args.experts, args.top_k)
        build_s = time.perf_counter() - t0
        with atomic_dir(out, is_ours=lambda d: (d / "config.json").is_file(),
                        what="MoEfied model folder") as tmp:
            moe.save_pretrained(tmp)
            dense.tokenizer.save_pretrained(tmp)

    loaded = load_model(str(out))  # autoplan's own loader: config check, experts unfused
    ref = logits_of(dense.model, data.eval)
    got = logits_of(loaded.model, data.eval)
    kl = mean_kl(ref, got)
    from autoplan.models.moe import counting_routing

    with counting_routing(loaded.model) as counter:
        logits_of(loaded.model, data.eval)
    tokens = data.eval.numel()
    shares = {b: [c / tokens for c in row] for b, row in counter.as_lists().items()}
    spread = [max(s) / min(s) if min(s) > 0 else math.inf for s in shares.values()]
    doc = {
        "machine": info, "command": command, "folder": str(out),
        "experts": args.experts, "top_k": args.top_k, "format": "mixtral",
        "calibration": {"source": data.source, "blocks": CALIB_BLOCKS, "seq_len": 256},
        "kl_vs_dense_nats_per_token": kl, "eval_tokens": tokens,
        "ppl_dense": perplexity(ref, data.eval), "ppl_moe": perplexity(got, data.eval),
        "max_abs_logit_diff": float((ref - got).abs().max()),
        "routing_shares_eval": shares,
        "hot_over_cold_expert_share_median": sorted(spread)[len(spread) // 2],
        "build_s": build_s, "params": loaded.spec.total_params,
        "active_params": loaded.spec.active_params(),
    }
    print(f"{out}: E={args.experts} k={args.top_k}, KL vs dense {kl:.4g} nats/token over "
          f"{tokens} held-out tokens, max |logit diff| {doc['max_abs_logit_diff']:.3g}")
    if args.gguf:
        doc["gguf"] = str(write_gguf(out, out.with_suffix(".gguf")))
    write_result(args.json or f"benchmarks/results/moe_moefy_{tag}.json", doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
