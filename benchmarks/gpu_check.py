"""One prepared GPU check (<= 8 minutes on an H200): layer microbenchmarks and decode speed.

Sections, each in its own try/except that records the failure and goes on, under one global
time guard:

  env          imports (torch, CUDA, triton, transformers), device, capability
  microbench   SmolLM2-135M and Llama-3.1-8B linear shapes at M in {1,16,64,256,1024,4096}:
               dense bf16 vs FP8 vs 2:4 bf16 / 2:4 FP8 vs Triton block-sparse (32, 64 @ 50%)
  decode       random-weight Llama-3.1-8B-shaped model (all 32 layers, bf16), batch 1 and 32,
               128 decode steps with KV cache: dense vs plans with FP8 / 2:4 layers swapped in

Writes, atomically after every section, under --out (default $OUT, else ./gpu_results):
  cost_table.json   the measured cost table (autoplan.backends.microbench format)
  gpu_check.json    everything: env, section status/reasons/seconds, decode rows, summary

`--cpu-smoke` runs the same plumbing on CPU with tiny shapes (tests use it). No network.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

MODELS = {
    # hidden, intermediate, heads, kv heads, head dim
    "smollm2-135m": dict(hidden=576, inter=1536, heads=9, kv=3, head_dim=64),
    "llama-3.1-8b": dict(hidden=4096, inter=14336, heads=32, kv=8, head_dim=128),
}
TOKENS = (1, 16, 64, 256, 1024, 4096)
CHOICES = ("dense+bf16", "dense+fp8_e4m3", "2:4+bf16", "2:4+fp8_e4m3", "block32@50+bf16", "block64@50+bf16")
PLANS = {
    # role group -> choice; roles not named stay dense bf16
    "fp8_all": {"attn": "dense+fp8_e4m3", "mlp": "dense+fp8_e4m3"},
    "fp8_attn+2:4fp8_mlp": {"attn": "dense+fp8_e4m3", "mlp": "2:4+fp8_e4m3"},
    "2:4bf16_mlp": {"mlp": "2:4+bf16"},
    "block64@50_mlp": {"mlp": "block64@50+bf16"},
}
SMOKE = dict(
    models={"tiny": dict(hidden=64, inter=128, heads=4, kv=2, head_dim=16)},
    tokens=(1, 8),
    choices=("dense+bf16", "dense+fp8_e4m3", "block16@50+bf16"),
    llama=dict(hidden=64, inter=128, layers=2, heads=4, kv=2, vocab=256),
    batches=(1, 2), steps=3, prompt=4, plans={"fp8_all": PLANS["fp8_all"], "block16@50_mlp": {"mlp": "block16@50+bf16"}},
)


class TimeGuard:
    """A global deadline: sections ask before starting work that may not fit."""

    def __init__(self, budget_s: float) -> None:
        self.start = time.monotonic()
        self.deadline = self.start + budget_s

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start


def _import_autoplan() -> None:
    # the GPU box gets the source tree, not an install: map backends/ to autoplan.backends
    try:
        import autoplan.backends.microbench  # noqa: F401
        return
    except ImportError:
        pass
    sys.path.insert(0, str(REPO))
    import autoplan

    spec = importlib.util.spec_from_file_location(
        "autoplan.backends", REPO / "backends" / "__init__.py", submodule_search_locations=[str(REPO / "backends")]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["autoplan.backends"] = module
    autoplan.backends = module
    spec.loader.exec_module(module)


def linear_shapes(hidden: int, inter: int, heads: int, kv: int, head_dim: int) -> dict[str, tuple[int, int]]:
    """(N out, K in) of each distinct decoder linear: q, k/v, o, gate/up, down."""
    return {
        "q_proj": (heads * head_dim, hidden),
        "kv_proj": (kv * head_dim, hidden),
        "o_proj": (hidden, heads * head_dim),
        "gate_up_proj": (inter, hidden),
        "down_proj": (hidden, inter),
    }


def section_env(report: dict[str, Any], device: str) -> None:
    import torch

    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__}
    env["cuda_available"] = torch.cuda.is_available()
    for name in ("triton", "transformers"):
        try:
            env[name] = __import__(name).__version__
        except Exception as err:  # noqa: BLE001 - record why, keep going
            env[name] = f"unavailable: {type(err).__name__}: {err}"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False: run with --cpu-smoke on a machine without a GPU")
        env["device"] = torch.cuda.get_device_name()
        env["capability"] = list(torch.cuda.get_device_capability())
        env["cuda"] = torch.version.cuda
        env["memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    report["env"] = env


def section_microbench(report: dict[str, Any], guard: TimeGuard, cfg: dict[str, Any], reserve_s: float) -> None:
    from autoplan.backends import microbench as MB

    rows, skipped = report["cost_rows"], report["cost_skipped"]
    for model, dims in cfg["models"].items():
        for role, (n, k) in linear_shapes(**dims).items():
            for m in cfg["tokens"]:
                if guard.left() < reserve_s:
                    report["notes"].append(f"microbench stopped at {model} {role} M={m}: time guard")
                    return
                got, skip = MB.run_microbench([(m, n, k)], cfg["choices"], cfg["device"], cfg["repeats"], cfg["warmup"])
                rows += [{**r, "model": model, "role": role} for r in got]
                skipped += [{**s, "model": model, "role": role} for s in skip]


def section_decode(report: dict[str, Any], guard: TimeGuard, cfg: dict[str, Any]) -> None:
    import torch

    from autoplan.backends.microbench import prepare_linear
    from autoplan.formats import Choice

    llama = cfg["llama"]
    dev = torch.device(cfg["device"])
    model = _build_llama(llama, dev)
    results = report["decode"]
    prompt = cfg["prompt"]
    baseline_logits: dict[int, torch.Tensor] = {}
    for plan_name, plan in [("dense", {}), *cfg["plans"].items()]:
        restore = None
        try:
            t0 = time.monotonic()
            restore = _swap_linears(model, plan, dev, prepare_linear, Choice)
            swap_s = time.monotonic() - t0
            for batch in cfg["batches"]:
                if guard.left() < 15:
                    report["notes"].append(f"decode stopped before {plan_name} batch {batch}: time guard")
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
        except Exception as err:  # noqa: BLE001 - one plan failing must not stop the others
            results.append({"plan": plan_name, "choices": plan, "error": _one_line(err)})
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


def summarize(report: dict[str, Any]) -> list[str]:
    """Speedups vs dense bf16 for every measured (model, role, M), and decode tokens/s."""
    base = {(r["model"], r["role"], r["m"]): r["median_us"] for r in report["cost_rows"] if r["choice"] == "dense+bf16"}
    lines = [f"{'model':14} {'role':13} {'M':>5} {'choice':18} {'us':>10} {'vs bf16':>8}"]
    for r in report["cost_rows"]:
        ref = base.get((r["model"], r["role"], r["m"]))
        speed = f"{ref / r['median_us']:.2f}x" if ref and r["choice"] != "dense+bf16" else ""
        lines.append(f"{r['model']:14} {r['role']:13} {r['m']:>5} {r['choice']:18} {r['median_us']:>10.1f} {speed:>8}")
    for d in report["decode"]:
        what = f"{d['tokens_per_s']:.1f} tok/s" if "tokens_per_s" in d else f"FAILED {d['error']}"
        lines.append(f"decode {d['plan']:22} batch {d.get('batch', '-')!s:>3}: {what}")
    for name, sec in report["sections"].items():
        if sec["status"] != "ok":
            lines.append(f"section {name}: {sec['status']} {sec.get('reason', '')}")
    return lines


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:300]


def _write(report: dict[str, Any], out: Path, device: str) -> None:
    from autoplan.backends import microbench as MB

    table = MB.cost_table(report["cost_rows"], device, report["cost_skipped"]) if report.get("env") else None
    if table is not None:
        MB.write_cost_table(table, out / "cost_table.json")
        # the check's own report reuses the same atomic writer
        MB.write_cost_table(report, out / "gpu_check.json")
    else:
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu_check.json").write_text(json.dumps(report, indent=1, sort_keys=True, default=str))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu_results")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on CPU: tests the plumbing only")
    parser.add_argument("--budget-s", type=float, default=420.0, help="global time guard (seconds)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--skip-stream", action="store_true", help="(gpu_check.sh) skip the streamed 8B profile")
    args = parser.parse_args(argv)

    guard = TimeGuard(args.budget_s)
    out = Path(args.out)
    device = "cpu" if args.cpu_smoke else "cuda"
    cfg: dict[str, Any] = dict(
        device=device, models=MODELS, tokens=TOKENS, choices=CHOICES, repeats=args.repeats, warmup=3,
        llama=dict(hidden=4096, inter=14336, layers=32, heads=32, kv=8, vocab=128256),
        batches=(1, 32), steps=128, prompt=128, plans=PLANS,
    )
    if args.cpu_smoke:
        cfg.update(SMOKE, repeats=2, warmup=1)
    report: dict[str, Any] = {
        "schema_version": 1, "mode": "cpu-smoke" if args.cpu_smoke else "gpu", "budget_s": args.budget_s,
        "sections": {}, "cost_rows": [], "cost_skipped": [], "decode": [], "notes": [],
    }
    _import_autoplan()
    # the decode section needs ~90 s on an H200 (8B init, 5 plans x 2 batches): keep it
    reserve = 5.0 if args.cpu_smoke else 150.0
    sections = [
        ("env", lambda: section_env(report, device)),
        ("microbench", lambda: section_microbench(report, guard, cfg, reserve)),
        ("decode", lambda: section_decode(report, guard, cfg)),
    ]
    for name, run in sections:
        t0 = time.monotonic()
        if name != "env" and "env" not in report:
            report["sections"][name] = {"status": "skipped", "reason": "environment check failed", "seconds": 0.0}
            continue
        try:
            run()
            report["sections"][name] = {"status": "ok", "seconds": round(time.monotonic() - t0, 1)}
        except Exception as err:  # noqa: BLE001 - record and continue with the next section
            report["sections"][name] = {
                "status": "failed", "reason": _one_line(err), "seconds": round(time.monotonic() - t0, 1),
                "traceback": traceback.format_exc(limit=5),
            }
        report["elapsed_s"] = round(guard.elapsed(), 1)
        _write(report, out, device)
    for line in summarize(report):
        print(line)
    print(f"results: {out / 'gpu_check.json'} and {out / 'cost_table.json'} ({guard.elapsed():.0f} s)")
    return 0 if all(s["status"] == "ok" for s in report["sections"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
