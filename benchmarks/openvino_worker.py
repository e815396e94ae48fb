"""OpenVINO decode timing and logits worker, run by cpu_bench.py in the openvino engine's venv
(`autoplan engines install openvino`).

A separate process and venv because OpenVINO, optimum-intel and NNCF are benchmark-only
peers that autoplan itself never imports. Protocol, one JSON object per line
(benchmarks/_worker_client.py):
  argv: MODE IR_DIR N_THREADS [CONFIG]   MODE = generate | logits; CONFIG (logits mode
        only): a JSON object of CPU plugin properties overriding its defaults, e.g.
        {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}
  out:  {"ready": true, "mode": MODE, "inference_precision": ..., "kv_cache_precision": ...,
         "dynamic_quantization_group_size": ...}
  generate mode, through openvino_genai.LLMPipeline (what an OpenVINO user runs):
    in:  {"ids": [[prompt token ids]], "n": new_tokens}       (batch 1, greedy, EOS ignored)
    out: {"tokens": [...], "ttft_s": s, "step_s": [...], "peak_rss_bytes": n}
  logits mode, through the same IR compiled by openvino.Core (LLMPipeline keeps only the
  last position's logits, KL needs every position's):
    in:  {"ids_npy": PATH, "logits_npy": PATH}     int64 [B, S] -> float32 [B, S, vocab]
    out: {"shape": [B, S, V], "peak_rss_bytes": n}
Timing: TTFT and the per-token steps are LLMPipeline's own raw perf metrics (its
m_times_to_first_token and m_durations, taken in C++ around each token), so no Python
callback sits inside the decode loop. Both modes compile with the CPU plugin's defaults
(only the thread count is set), which is what the pipeline runs; the ready line says which
inference and KV-cache precisions, and which dynamic int8 quantization of activations
(group size, 0 = off), those defaults chose on this CPU.
"""

import json
import sys

import numpy as np
import openvino as ov


def _peak_rss_bytes() -> int:
    """This process's own peak RSS (VmHWM starts afresh at exec)."""
    with open("/proc/self/status") as fh:
        line = next(x for x in fh if x.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def _generate_loop(ir_dir: str, threads: int, overrides: dict | None = None) -> None:
    import openvino_genai as genai

    if overrides:
        raise ValueError("generate mode times the pipeline's defaults: no CONFIG")
    pipe = genai.LLMPipeline(ir_dir, "CPU", INFERENCE_NUM_THREADS=threads)
    core = ov.Core()
    print(json.dumps({"ready": True, "mode": "generate", **_precisions(core)}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        (prompt,), n_new = req["ids"], req["n"]
        config = genai.GenerationConfig()
        config.max_new_tokens = config.min_new_tokens = n_new
        config.do_sample, config.ignore_eos = False, True
        ids = np.asarray([prompt], np.int64)
        res = pipe.generate(genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids))),
                            config)
        raw = res.perf_metrics.raw_metrics
        print(json.dumps({"tokens": [int(t) for t in res.tokens[0]],
                          "ttft_s": float(raw.m_times_to_first_token[-1]) * 1e-6,
                          "step_s": [float(d) * 1e-6 for d in raw.m_durations],
                          "peak_rss_bytes": _peak_rss_bytes()}), flush=True)


def _precisions(core: ov.Core, compiled: ov.CompiledModel | None = None) -> dict:
    """The precisions the CPU plugin picked (the compiled model's when there is one)."""
    get = compiled.get_property if compiled else lambda key: core.get_property("CPU", key)
    return {"inference_precision": get("INFERENCE_PRECISION_HINT").get_type_name(),
            "kv_cache_precision": get("KV_CACHE_PRECISION").get_type_name(),
            "dynamic_quantization_group_size": int(get("DYNAMIC_QUANTIZATION_GROUP_SIZE"))}


def _logits_loop(ir_dir: str, threads: int, overrides: dict | None = None) -> None:
    core = ov.Core()
    config = {"INFERENCE_NUM_THREADS": threads, **(overrides or {})}
    compiled = core.compile_model(f"{ir_dir}/openvino_model.xml", "CPU", config)
    request = compiled.create_infer_request()
    print(json.dumps({"ready": True, "mode": "logits", **_precisions(core, compiled)}),
          flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        ids = np.load(req["ids_npy"]).astype(np.int64)
        out = []
        for row in ids:  # one sequence per prefill, the KV state reset before each
            request.reset_state()
            request.infer({"input_ids": row[None], "attention_mask": np.ones_like(row[None]),
                           "position_ids": np.arange(row.shape[0], dtype=np.int64)[None],
                           "beam_idx": np.zeros(1, np.int32)})
            out.append(np.array(request.get_tensor("logits").data[0], np.float32))
        logits = np.stack(out)
        np.save(req["logits_npy"], logits)
        print(json.dumps({"shape": list(logits.shape), "peak_rss_bytes": _peak_rss_bytes()}),
              flush=True)


def main() -> int:
    mode, ir_dir, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
    overrides = json.loads(sys.argv[4]) if len(sys.argv) > 4 else None
    try:
        {"generate": _generate_loop, "logits": _logits_loop}[mode](ir_dir, threads, overrides)
    except Exception as exc:  # noqa: BLE001 - one line back to the client, not a traceback
        print(json.dumps({"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}),
              flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
