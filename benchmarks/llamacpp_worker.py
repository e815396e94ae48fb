"""llama.cpp decode timing worker, run by cpu_bench.py in llama-cpp-python's own venv.

It is a separate process (and a separate venv) because llama-cpp-python is an optional,
benchmark-only dependency that takes a long compile; keeping it out of autoplan's venv keeps
CI free of it. Protocol, one JSON object per line:
  argv: GGUF_PATH N_THREADS N_CTX
  out:  {"ready": true, "n_vocab": V}
  in:   {"ids": [[prompt token ids]], "n": new_tokens}      (batch 1)
  out:  {"tokens": [...], "ttft_s": s, "step_s": [...], "peak_rss_bytes": n}
Timing matches autoplan's OrtGenerator: greedy host-side argmax, prefill = one eval of the
whole prompt + the first token, then one eval per token; the KV cache is cleared per request.
"""

import json
import sys
import time

import numpy as np
from llama_cpp import Llama


def _peak_rss_bytes() -> int:
    """This process's own peak RSS: VmHWM starts afresh at exec, unlike getrusage's
    ru_maxrss, which a child inherits from the (large) bench process that forked it."""
    with open("/proc/self/status") as fh:
        line = next(x for x in fh if x.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def main() -> int:
    path, threads, n_ctx = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    llm = Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx,
                n_batch=n_ctx, n_ubatch=n_ctx, logits_all=False, verbose=False)
    n_vocab = llm.n_vocab()
    print(json.dumps({"ready": True, "n_vocab": n_vocab}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        (prompt,), n_new = req["ids"], req["n"]
        llm.reset()
        llm._ctx.kv_cache_clear()  # noqa: SLF001 - reset() keeps the cache cells
        tokens, steps = [], []
        start = time.perf_counter()
        feed = prompt
        for i in range(n_new):
            t0 = time.perf_counter()
            llm.eval(feed)
            # logits_all=False: llama.cpp keeps only the last position's logits.
            logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))  # noqa: SLF001
            nxt = int(logits.argmax())
            t1 = time.perf_counter()
            if i:
                steps.append(t1 - t0)
            else:
                ttft = t1 - start
            tokens.append(nxt)
            feed = [nxt]
        peak = _peak_rss_bytes()
        print(json.dumps({"tokens": tokens, "ttft_s": ttft, "step_s": steps,
                          "peak_rss_bytes": peak}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
