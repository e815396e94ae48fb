"""llama.cpp worker: runs in the llama.cpp engine's own venv (``autoplan engines install
llama.cpp``), started by ``autoplan.engines.llamacpp.LlamaCppWorker``. It imports only the
standard library, numpy and llama_cpp (autoplan is not installed in that venv).

Reasoning and sources: docs/modules.md.
"""

import json
import sys
import time

import llama_cpp.llama_cpp as _capi
import numpy as np
from llama_cpp import Llama

GGML_TYPE_F32 = 0
# ggml's type ids of the cache types llama.cpp takes (-ctk / -ctv), ggml.h
CACHE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
               "bf16": 30}


def _peak_rss_bytes() -> int:
    """This process's own peak RSS: VmHWM starts afresh at exec, unlike getrusage's
    ru_maxrss, which a child inherits from the (large) process that forked it."""
    with open("/proc/self/status") as fh:
        line = next(x for x in fh if x.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def _reset(llm: Llama) -> None:
    llm.reset()
    llm._ctx.kv_cache_clear()  # noqa: SLF001 - reset() keeps the cache cells


def _generate(llm: Llama, n_vocab: int, req: dict) -> dict:
    (prompt,), n_new = req["ids"], req["n"]
    _reset(llm)
    tokens, steps, cpu, ttft = [], [], [], 0.0
    start = time.perf_counter()
    feed = prompt
    for i in range(n_new):
        c0, t0 = time.process_time(), time.perf_counter()
        llm.eval(feed)
        logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))  # noqa: SLF001
        nxt = int(logits.argmax())
        t1, c1 = time.perf_counter(), time.process_time()
        if i:
            steps.append(t1 - t0)
            cpu.append(c1 - c0)
        else:
            ttft = t1 - start
        tokens.append(nxt)
        feed = [nxt]
    # step_cpu_s: the process's CPU seconds per step (all its threads): with one thread,
    # the step's time without the waits for a core that a loaded machine adds
    return {"tokens": tokens, "ttft_s": ttft, "step_s": steps, "step_cpu_s": cpu,
            "peak_rss_bytes": _peak_rss_bytes()}


def _logits(llm: Llama, req: dict) -> dict:
    ids = req["ids"]
    _reset(llm)
    llm.eval(ids)
    np.save(req["out"], np.ascontiguousarray(llm.scores[: len(ids)], dtype=np.float32))
    return {"rows": len(ids)}


def _no_extra_buffers() -> None:
    default = _capi.llama_model_default_params

    def params():  # noqa: ANN202 - a llama_model_params ctypes struct
        p = default()
        p.use_extra_bufts = False
        return p

    _capi.llama_model_default_params = params


def main() -> int:
    cfg = json.loads(sys.argv[1])
    if not cfg.get("extra_bufts"):
        _no_extra_buffers()
    kv = {"type_k": GGML_TYPE_F32, "type_v": GGML_TYPE_F32} if cfg.get("kv_f32") else {}
    if cfg.get("kv_type"):  # a quantized V cache needs flash attention (llama-context.cpp)
        kind = CACHE_TYPES[cfg["kv_type"]]
        kv = {"type_k": kind, "type_v": kind, "flash_attn": True}
    n_ctx = int(cfg["n_ctx"])
    llm = Llama(model_path=cfg["model"], n_threads=cfg["threads"],
                n_threads_batch=cfg["threads"], n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx,
                logits_all=bool(cfg.get("logits_all")), verbose=False, **kv)
    n_vocab = llm.n_vocab()
    print(json.dumps({"ready": True, "n_vocab": n_vocab}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        try:
            out = _logits(llm, req) if req.get("op") == "logits" else \
                _generate(llm, n_vocab, req)
        except Exception as exc:  # noqa: BLE001 - reported to the client as one line
            out = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
