"""vLLM worker: runs in the vLLM engine's own venv (``autoplan engines install vllm``),
started by ``autoplan.engines.vllm_engine.run_vllm``. It imports only the standard library and
vllm (autoplan is not installed in that venv).

Reasoning and sources: docs/modules.md.
"""

import json
import os
import sys
import time
import traceback


def _error(stage: str, exc: BaseException) -> dict:
    # vLLM's engine core re-raises in the parent with a generic message; the first line of
    # the original exception (kept in __cause__ / __context__) is what names the reason.
    seen, texts = set(), []
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        text = f"{type(exc).__name__}: {exc}".strip()
        texts.append(" ".join(text.split()))
        exc = exc.__cause__ or exc.__context__
    return {"ok": False, "stage": stage, "error": texts[-1][:600], "chain": texts[:4]}


def _chosen(entry, token):  # noqa: ANN001, ANN202
    if entry is None:
        return None
    lp = entry.get(token)
    return None if lp is None else float(lp.logprob)


def _cpu_info() -> dict:
    import torch

    cpu = torch.cpu
    flags = {name: bool(getattr(cpu, f"_is_{name}_supported", lambda: False)())
             for name in ("avx2", "avx512", "avx512_bf16", "vnni", "amx_tile", "amx_fp16")}
    # vllm/platforms/cpu.py: _C needs AVX-512 + AVX512-BF16, _C_AVX512 AVX-512, else _C_AVX2
    lib = ("_C" if flags["avx512"] and flags["avx512_bf16"] else
           "_C_AVX512" if flags["avx512"] else "_C_AVX2")
    return {"torch_isa": flags, "vllm_library": lib, "flags": _x86_flags()}


def _x86_flags() -> list:
    """The kernel's CPU flags that decide vLLM's int8 and bf16 paths (torch reports no
    AVX-VNNI, which oneDNN uses): empty where /proc/cpuinfo has no x86 flags line."""
    wanted = {"avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8",
              "amx_bf16"}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return sorted(wanted & set(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return []


def _probe_layers(llm, specs: dict, out_path: str) -> dict:  # noqa: ANN001
    """Run each named layer once on its input through vLLM's own forward (docs/modules.md)."""
    def probe(model):  # noqa: ANN001, ANN202
        import torch
        from safetensors.torch import load_file, save_file

        tensors, info = {}, {}
        for name, path in specs.items():
            layer = model.get_submodule(name)
            x = load_file(path)["x"].to(torch.bfloat16)
            with torch.inference_mode():
                y = layer.quant_method.apply(layer, x)
            tensors[f"y:{name}"] = y.float().contiguous()
            scheme = getattr(layer, "scheme", None)
            kernel = getattr(scheme, "kernel", None) or getattr(scheme, "fp8_linear", None)
            method = getattr(kernel, "linear_method", None)
            info[name] = {"method": type(layer.quant_method).__name__,
                          "scheme": type(scheme).__name__ if scheme is not None else "",
                          "kernel": type(kernel).__name__ if kernel is not None else "",
                          "path": getattr(method, "__name__", "")}
            if info[name]["path"] == "_apply_weights_onednn":
                from vllm import _custom_ops as ops

                codes, scales, _ = ops.onednn_scaled_int8_quant(x, None, None, True)
                tensors[f"codes:{name}"] = codes.contiguous()
                tensors[f"scales:{name}"] = scales.float().reshape(-1).contiguous()
        save_file(tensors, out_path)
        return info

    return llm.apply_model(probe)[0]


def main() -> None:
    cfg = json.loads(sys.argv[1])
    # this script's folder (autoplan/engines) holds autoplan's own vllm_*.py modules: keep
    # it off the path so `import vllm` finds the engine
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.get("kv_cache_gib", 1)))
    # the engine core in this process: its exceptions reach us with vLLM's own text instead
    # of EngineDeadError, and no second process is left to stop
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    t0 = time.perf_counter()
    try:
        import vllm
        from vllm import LLM, SamplingParams

        llm = LLM(model=cfg["model"], dtype=cfg.get("dtype", "bfloat16"),
                  max_model_len=int(cfg.get("max_model_len", 512)),
                  max_num_seqs=int(cfg.get("max_num_seqs", 8)), seed=0,
                  kv_cache_dtype=cfg.get("kv_cache_dtype", "auto"),
                  enforce_eager=True, trust_remote_code=False)
    except BaseException as exc:  # noqa: BLE001 - reported to the caller as vLLM's words
        print(json.dumps(_error("load", exc)), flush=True)
        traceback.print_exc(file=sys.stderr)
        return
    load_s = time.perf_counter() - t0
    try:
        params = SamplingParams(temperature=0.0, max_tokens=int(cfg["max_tokens"]),
                                logprobs=int(cfg.get("logprobs", 1)),
                                prompt_logprobs=int(cfg.get("prompt_logprobs", 1)),
                                ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": ids} for ids in cfg["prompts"]], params,
                            use_tqdm=False)
        results = []
        for prompt, out in zip(cfg["prompts"], outs):
            comp = out.outputs[0]
            toks = list(comp.token_ids)
            results.append({
                "tokens": toks,
                "logprobs": [_chosen(e, t) for e, t in zip(comp.logprobs or [], toks)],
                "prompt_logprobs": [_chosen(e, t) for e, t in
                                    zip(out.prompt_logprobs or [], prompt)],
            })
        layers = (_probe_layers(llm, cfg["layers"], cfg["layers_out"])
                  if cfg.get("layers") else {})
    except BaseException as exc:  # noqa: BLE001
        print(json.dumps(_error("generate", exc)), flush=True)
        traceback.print_exc(file=sys.stderr)
        return
    print(json.dumps({"ok": True, "load_s": load_s, "results": results, "layers": layers,
                      "cpu": _cpu_info(), "versions": {"vllm": vllm.__version__}}), flush=True)


if __name__ == "__main__":
    main()
