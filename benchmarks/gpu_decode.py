"""The GPU check's decode-step benchmark: a random-weight Llama-3.1-8B-shaped model (all 32
layers, bf16) decoding with a KV cache, dense and with FP8 / 2:4 / block-sparse layers
swapped in through autoplan.backends.microbench's kernels; tokens/s per plan and batch.
Random weights: the first logits' distance to dense is a sanity check of the swapped
kernels, not a quality figure.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from _common import one_line

PLANS = {
    # role group -> choice; roles not named stay dense bf16
    "fp8_all": {"attn": "dense+fp8_e4m3", "mlp": "dense+fp8_e4m3"},
    "fp8_attn+2:4fp8_mlp": {"attn": "dense+fp8_e4m3", "mlp": "2:4+fp8_e4m3"},
    "2:4bf16_mlp": {"mlp": "2:4+bf16"},
}
CONFIG = dict(llama=dict(hidden=4096, inter=14336, layers=32, heads=32, kv=8, vocab=128256),
              batches=(1, 32), steps=64, prompt=128, plans=PLANS)
SMOKE = dict(llama=dict(hidden=64, inter=128, layers=2, heads=4, kv=2, vocab=256),
             batches=(1, 2), steps=3, prompt=4,
             plans={"fp8_all": PLANS["fp8_all"], "block16@50_mlp": {"mlp": "block16@50+bf16"}})


def run_decode(cfg: dict[str, Any], deadline: float, results: list[dict[str, Any]],
               notes: list[str], on_row: Callable[[], None] = lambda: None) -> None:
    """Decode tokens/s of a random-weight Llama per plan and batch; appends to `results`."""
    import torch
    from autoplan.backends.microbench import prepare_linear

    from autoplan.formats import Choice

    llama = cfg["llama"]
    dev = torch.device(cfg["device"])
    model = _build_llama(llama, dev)
    prompt = cfg["prompt"]
    baseline_logits: dict[int, torch.Tensor] = {}
    for plan_name, plan in [("dense", {}), *cfg["plans"].items()]:
        restore = None
        try:
            t0 = time.monotonic()
            restore = _swap_linears(model, plan, dev, prepare_linear, Choice)
            swap_s = time.monotonic() - t0
            for batch in cfg["batches"]:
                if time.monotonic() > deadline:
                    notes.append(f"decode stopped before {plan_name} batch {batch}: time box")
                    return
                tps, first = _decode_tokens_per_s(model, batch, prompt, cfg["steps"], llama["vocab"], dev)
                row = {"plan": plan_name, "choices": plan, "batch": batch, "steps": cfg["steps"],
                       "prompt_len": prompt, "tokens_per_s": tps, "swap_s": round(swap_s, 2)}
                if plan_name == "dense":
                    baseline_logits[batch] = first
                elif batch in baseline_logits:
                    ref = baseline_logits[batch]
                    # random weights: only a sanity check that the swapped layers compute the layer
                    row["first_logits_rel_err"] = float((first - ref).norm() / ref.norm())
                results.append(row)
                on_row()
        except Exception as err:  # noqa: BLE001 - one plan failing must not stop the others
            results.append({"plan": plan_name, "choices": plan, "error": one_line(err)})
            on_row()
        finally:
            if restore is not None:
                restore()
            if dev.type == "cuda":
                torch.cuda.empty_cache()


def _build_llama(llama: dict[str, int], dev):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=llama["hidden"], intermediate_size=llama["inter"], num_hidden_layers=llama["layers"],
        num_attention_heads=llama["heads"], num_key_value_heads=llama["kv"], vocab_size=llama["vocab"],
        max_position_embeddings=8192, rope_theta=500000.0, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    with dev:  # initialise directly on the device: an 8B CPU init would eat the time budget
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    return model.eval()


def _swap_linears(model, plan: dict[str, str], dev, prepare_linear, Choice):
    """Replace decoder linears by the plan's kernels; returns a function that undoes it."""
    import torch

    groups = {"attn": ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp": ("gate_proj", "up_proj", "down_proj")}
    undo = []

    class Swapped(torch.nn.Module):
        def __init__(self, fn, out_features: int) -> None:
            super().__init__()
            self.fn, self.out_features = fn, out_features

        def forward(self, x):
            y = self.fn(x.reshape(-1, x.shape[-1]))
            return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    for group, choice in plan.items():
        build, _ = prepare_linear(Choice.parse(choice), dev)
        for layer in model.model.layers:
            parent = layer.self_attn if group == "attn" else layer.mlp
            for name in groups[group]:
                lin = getattr(parent, name)
                setattr(parent, name, Swapped(build(lin.weight.data), lin.out_features))
                undo.append((parent, name, lin))

    def restore() -> None:
        for parent, name, lin in undo:
            setattr(parent, name, lin)

    return restore


def _decode_tokens_per_s(model, batch: int, prompt: int, steps: int, vocab: int, dev):
    import torch

    gen = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(0, vocab, (batch, prompt), generator=gen).to(dev)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    step = _stepper(model)
    with torch.inference_mode():
        logits, cache = step(ids, None)
        first = logits.float().cpu()
        token = logits.argmax(-1, keepdim=True)
        for _ in range(2):  # warm-up steps (kernel selection, Triton compiles) outside the clock
            logits, cache = step(token, cache)
            token = logits.argmax(-1, keepdim=True)
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            logits, cache = step(token, cache)
            token = logits.argmax(-1, keepdim=True)
        sync()
        seconds = time.perf_counter() - t0
    return batch * steps / seconds, first


def _stepper(model):
    """One forward with KV cache -> (last-position logits [B, V], cache), across transformers versions."""
    import inspect

    params = inspect.signature(model.forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"  # renamed in transformers 5.x
    extra = {"logits_to_keep": 1} if "logits_to_keep" in params else {}

    def step(ids, cache):
        kwargs = {cache_kw: cache} if cache is not None else {}
        out = model(input_ids=ids, use_cache=True, **kwargs, **extra)
        new_cache = getattr(out, "cache", None)
        return out.logits[:, -1], new_cache if new_cache is not None else out.past_key_values

    return step


__all__ = ["CONFIG", "PLANS", "SMOKE", "run_decode"]
