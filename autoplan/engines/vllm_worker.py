"""vLLM worker: runs in the vLLM engine's own venv (``autoplan engines install vllm``),
started by ``autoplan.engines.vllm.run_vllm``. It imports only the standard library and
vllm (autoplan is not installed in that venv).

Protocol: argv[1] is one JSON object
  {"model": DIR, "dtype": "bfloat16", "max_model_len": N, "prompts": [[ids], ...],
   "max_tokens": n, "logprobs": k, "prompt_logprobs": k}
and the worker prints one JSON line on stdout, its last:
  {"ok": true, "load_s": s, "results": [{"tokens": [...], "logprobs": [lp, ...],
    "prompt_logprobs": [lp or null, ...]}, ...], "versions": {...}}
  {"ok": false, "stage": "load" | "generate", "error": "vLLM's own exception text"}
``logprobs`` are those of the tokens chosen greedily; ``prompt_logprobs`` those of each
prompt token given the tokens before it (teacher forcing: null for the first).
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


def main() -> None:
    cfg = json.loads(sys.argv[1])
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.get("kv_cache_gib", 1)))
    t0 = time.perf_counter()
    try:
        import vllm
        from vllm import LLM, SamplingParams

        llm = LLM(model=cfg["model"], dtype=cfg.get("dtype", "bfloat16"),
                  max_model_len=int(cfg.get("max_model_len", 512)),
                  max_num_seqs=int(cfg.get("max_num_seqs", 8)), seed=0,
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
    except BaseException as exc:  # noqa: BLE001
        print(json.dumps(_error("generate", exc)), flush=True)
        traceback.print_exc(file=sys.stderr)
        return
    print(json.dumps({"ok": True, "load_s": load_s, "results": results,
                      "versions": {"vllm": vllm.__version__}}), flush=True)


if __name__ == "__main__":
    main()
