"""Peak memory that follows the vocabulary: a model of Gemma-3-270M's shape (262,144-token
vocabulary, hidden 640, 18 blocks; random weights) next to the embedded SmolLM2-135M.

For each model, in a fresh process each (peak RSS from getrusage of the child):
  - the `profile --dry-run` estimate of the in-memory run (config only);
  - `quality`: the original's reference pass and one compressed copy's KL pass in memory,
    the measurement every verification makes (`QualityEvaluator`);
  - `search`: `autoplan search --execution memory --target T` end to end (profile,
    verification; T = h100 by default, whose search space protects the lm_head);
  - `bench`: `autoplan bench` of the baseline (its ONNX export, the ONNX Runtime session,
    the torch side), as it runs by default (the baseline's weights prepacked), and
    `bench_share_weights`: with `--share-weights` (one copy of the weights for both).

    python benchmarks/vocab_memory.py [--only gemma|smollm2] [--skip quality,search,bench]
        [--target h100] [--label after]
        -> benchmarks/results/vocab_memory.json

The Gemma-shaped model is written once into a temporary HF folder (safetensors, bf16, the
embedded model's tokenizer: its ids all lie inside the larger vocabulary). Random weights
measure memory, not quality. Run it on the code before and after a change, and say which.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import machine_info, write_result  # noqa: E402

# Gemma-3-270M's text config (google/gemma-3-270m config.json), weights drawn at random
GEMMA_270M = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 640,
    "intermediate_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 4,
    "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 262144,
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "sliding_window": 512,
    "query_pre_attn_scalar": 256, "hidden_activation": "gelu_pytorch_tanh",
    "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
    "final_logit_softcapping": None, "attn_logit_softcapping": None,
    "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 3,
}
GIB = 2**30


def build_gemma_shaped(folder: Path, seed: int = 0) -> Path:
    """The Gemma-3-270M-shaped model with random weights and the embedded tokenizer."""
    import torch
    from transformers import AutoTokenizer, Gemma3ForCausalLM, Gemma3TextConfig

    from autoplan.models.loader import ensure_hf_folder
    from autoplan.models.registry import resolve_model_arg

    if (folder / "config.json").is_file():
        return folder
    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(**{k: v for k, v in GEMMA_270M.items()
                              if k not in ("architectures", "model_type")})
    model = Gemma3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    AutoTokenizer.from_pretrained(ensure_hf_folder(resolve_model_arg("smollm2-135m"))
                                  ).save_pretrained(folder)
    return folder


_QUALITY = """
import sys, time
from autoplan.compress import CompressionSettings, compressed_copy
from autoplan.formats import Choice
from autoplan.models import load_model
from autoplan.quality import QualityEvaluator, load_text_dataset
loaded = load_model(sys.argv[1])
data = load_text_dataset(tokenizer=loaded.tokenizer, seq_len=256, n_calib=4, n_eval=6)
t0 = time.perf_counter()
ev = QualityEvaluator(loaded.model, data.eval)
choice = Choice.parse("dense+int8a8_g128")
decisions = {la.name: choice for la in loaded.spec.layers if la.role != "lm_head"}
copy, _ = compressed_copy(loaded.model, decisions, None, CompressionSettings())
res = ev.evaluate(copy)
print("KL", res.kl, "s", round(time.perf_counter() - t0, 1), flush=True)
"""


def _measure(cmd: list[str], label: str | None = None) -> dict:
    proc_t0 = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-f", "PEAK_KIB=%M", *cmd], capture_output=True,
                          text=True, check=False)
    peak = next((int(line.split("=")[1]) for line in proc.stderr.splitlines()
                 if line.startswith("PEAK_KIB=")), None)
    tail = [line for line in (proc.stdout + proc.stderr).strip().splitlines()
            if not line.startswith("PEAK_KIB=")][-2:]
    shown = label or " ".join("python" if c == sys.executable else c for c in cmd)
    return {"command": shown, "rc": proc.returncode,
            "wall_s": round(time.perf_counter() - proc_t0, 1),
            "peak_rss_gib": None if peak is None else round(peak * 1024 / GIB, 3),
            "tail": tail}


def _dry_run(model: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "autoplan.cli", "profile", "--model", model,
                           "--dry-run", "--device", "cpu", "--json"],
                          capture_output=True, text=True, check=False)
    if proc.returncode:
        return {"rc": proc.returncode, "error": proc.stderr.strip()[-300:]}
    doc = json.loads(proc.stdout)
    mem = doc["plans"]["memory"]
    return {"memory_host_gib": round(mem["host_bytes"] / GIB, 3),
            "parts_gib": {k: round(v / GIB, 3) for k, v in mem["device_parts"].items()},
            "stream_host_gib": round(doc["plans"]["stream"]["host_bytes"] / GIB, 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=("gemma", "smollm2"), default=None)
    p.add_argument("--skip", default="", help="comma-separated: quality,search,bench")
    p.add_argument("--label", default="", help="e.g. 'before' / 'after' (what code ran)")
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--target", default="h100", help="the search's target")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" /
                                        "vocab_memory.json"))
    args = p.parse_args()
    skip = {s for s in args.skip.split(",") if s}
    work = Path(tempfile.mkdtemp(prefix="autoplan-vocab-"))
    models = {"smollm2": "smollm2-135m",
              "gemma": str(build_gemma_shaped(work / "gemma-3-270m-shaped"))}
    if args.only:
        models = {args.only: models[args.only]}
    cli = [sys.executable, "-m", "autoplan.cli"]
    rows = {}
    for name, model in models.items():
        row: dict = {"model": model if name == "smollm2" else "gemma-3-270m-shaped (random)",
                     "dry_run": _dry_run(model)}
        if "quality" not in skip:
            row["quality"] = _measure([sys.executable, "-c", _QUALITY, model],
                                      "reference pass + one int8a8 copy's KL pass (_QUALITY)")
        if "search" not in skip:
            row["search"] = _measure([*cli, "search", "--model", model, "--target", args.target,
                                      "--execution", "memory",
                                      "--trials", str(args.trials), "--batch", "1",
                                      "--budget", "kl<=0.1", "--out", str(work / f"{name}.json"),
                                      "--quiet"])
        if "bench" not in skip:
            bench = [*cli, "bench", "--model", model, "--requests", "2", "--input-len", "128",
                     "--output-len", "16", "--json"]
            row["bench"] = _measure(bench)  # the default: the baseline prepacked
            row["bench_share_weights"] = _measure([*bench, "--share-weights"])
        rows[name] = row
        print(json.dumps({name: row}, indent=1), flush=True)
    result = {"label": args.label, "machine": machine_info(),
              "command": "python benchmarks/vocab_memory.py " + " ".join(sys.argv[1:]),
              "models": rows}
    write_result(Path(args.out), result)


if __name__ == "__main__":
    main()
