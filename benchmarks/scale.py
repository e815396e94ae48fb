"""Real model sizes: time and peak memory of `autoplan profile` and `autoplan search` on a
random-weight Llama of TinyLlama-1.1B's shape, and the --dry-run memory plans of
Llama-3.1-8B and 70B shapes. The models are built here (bf16 safetensors, random weights,
a character tokenizer): no hub. Random weights make every quality number meaningless; the
point is time and memory.

    python benchmarks/scale.py                      # CPU: profile + search + plans
    python benchmarks/scale.py --skip-search        # profile + plans only
    python benchmarks/scale.py --gpu --shape llama-3.1-8b --out $OUT/stream_8b.json
                                                    # (benchmarks/gpu_check.sh) on a GPU

Each command runs in a fresh child process whose peak RSS (and, on a GPU, peak allocated GPU
memory) is read when it exits; the load average is recorded before and after every run.
Results: benchmarks/results/scale.json (and a section of docs/lab/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info  # noqa: E402

SHAPES = {
    "smoke": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=1024),
    # TinyLlama-1.1B: the 11.9 min / 11.2 GB in-memory baseline
    "tinyllama-1.1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                           num_attention_heads=32, num_key_value_heads=4, vocab_size=32000),
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, vocab_size=128256),
    "llama-3.1-70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                          num_attention_heads=64, num_key_value_heads=8, vocab_size=128256),
}
RESULTS = Path(__file__).resolve().parent / "results"


def config_of(shape: str) -> dict:
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 1,
            "eos_token_id": 1, "pad_token_id": 0, "hidden_act": "silu", **SHAPES[shape]}


def _tokenizer():  # characters only: any vocabulary of these shapes holds its ids
    import string

    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "</s>": 1, **{c: i + 2 for i, c in enumerate(sorted(set(string.printable)))}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", eos_token="</s>")


class ShardedCheckpoint:
    """A safetensors checkpoint written one shard at a time (memory bounded by a shard), then
    its index and a `done` marker, so a folder with `done` is complete."""

    def __init__(self, folder: Path, n_shards: int) -> None:
        self.folder, self.n_shards = folder, n_shards
        self.index: dict[str, str] = {}
        self.total = 0

    def write(self, k: int, shard: dict) -> None:
        from safetensors.torch import save_file

        name = f"model-{k + 1:05d}-of-{self.n_shards:05d}.safetensors"
        save_file(shard, str(self.folder / name), metadata={"format": "pt"})
        for key, t in shard.items():
            self.index[key] = name
            self.total += t.numel() * t.element_size()

    def finish(self) -> None:
        (self.folder / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": self.total}, "weight_map": self.index}, indent=1))
        (self.folder / "done").write_text("ok")


def build_model(shape: str, folder: Path, device: str = "cpu", seed: int = 0) -> Path:
    """A random-weight bf16 checkpoint of `shape` (one shard per few blocks, with index)."""
    import torch
    from transformers import LlamaConfig

    if (folder / "done").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    cfg = config_of(shape)
    LlamaConfig(**{k: v for k, v in cfg.items() if k != "model_type"}).save_pretrained(folder)
    _tokenizer().save_pretrained(folder)
    h, inter, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    hd = h // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * hd
    gen = torch.Generator(device=device).manual_seed(seed)

    def rand(*shape_: int) -> torch.Tensor:
        t = torch.randn(*shape_, generator=gen, device=device, dtype=torch.float32)
        return (t * 0.02).to(torch.bfloat16).cpu()

    per_shard = max(1, int(2e9 // (2 * (2 * h * h + 2 * h * kv + 3 * h * inter))))
    ckpt = ShardedCheckpoint(folder, 1 + -(-L // per_shard))
    ckpt.write(0, {"model.embed_tokens.weight": rand(cfg["vocab_size"], h),
              "lm_head.weight": rand(cfg["vocab_size"], h),
              "model.norm.weight": torch.ones(h, dtype=torch.bfloat16)})
    shard: dict[str, torch.Tensor] = {}
    for i in range(L):
        p = f"model.layers.{i}."
        shard.update({
            p + "self_attn.q_proj.weight": rand(h, h), p + "self_attn.k_proj.weight": rand(kv, h),
            p + "self_attn.v_proj.weight": rand(kv, h), p + "self_attn.o_proj.weight": rand(h, h),
            p + "mlp.gate_proj.weight": rand(inter, h), p + "mlp.up_proj.weight": rand(inter, h),
            p + "mlp.down_proj.weight": rand(h, inter),
            p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
            p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16)})
        if (i + 1) % per_shard == 0 or i == L - 1:
            ckpt.write(1 + i // per_shard, shard)  # as we go: bounded memory
            shard = {}
    ckpt.finish()
    return folder


def _child(argv: list[str]) -> None:
    """Run the real CLI in this process; report wall, peak RSS and peak GPU memory."""
    report = Path(argv[0])
    from autoplan.cli import cli

    t0 = time.perf_counter()
    rc = 0
    try:
        cli.main(argv[1:], prog_name="autoplan", standalone_mode=False)
    except SystemExit as exc:
        rc = int(exc.code or 0)
    wall = time.perf_counter() - t0
    gpu = None
    import torch

    if torch.cuda.is_available():
        gpu = torch.cuda.max_memory_allocated() / 2**30
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    report.write_text(json.dumps({"rc": rc, "wall_s": wall, "peak_rss_gib": rss,
                                  "peak_gpu_gib": gpu}))


def measure(label: str, args: list[str], env: dict, stdout: Path | None = None) -> dict:
    """`autoplan ARGS` in a fresh child; its wall, peak RSS, load before/after."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        rep = Path(fh.name)
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, __file__, "_child", str(rep), *args], env=env,
                         capture_output=True, text=True)
    total = time.perf_counter() - t0
    res = json.loads(rep.read_text()) if rep.stat().st_size else {"rc": out.returncode}
    rep.unlink()
    if stdout is not None:
        stdout.write_text(out.stdout)
    res.update({"label": label, "command": "autoplan " + " ".join(args),
                "process_wall_s": round(total, 1), "load_before": [round(x, 2) for x in load0],
                "load_after": [round(x, 2) for x in os.getloadavg()]})
    if res.get("rc"):
        res["stderr_tail"] = out.stderr[-2000:]
    print(json.dumps({k: v for k, v in res.items() if k != "stderr_tail"}), flush=True)
    if res.get("rc"):
        print(out.stderr[-2000:], file=sys.stderr)
    return res


def dry_runs(env: dict, work: Path) -> dict:
    plans = {}
    for shape, dev, host in (("tinyllama-1.1b", "cpu", 24), ("llama-3.1-8b", "cuda", 64),
                             ("llama-3.1-70b", "cuda", 64)):
        cfg = work / f"{shape}.json"
        cfg.write_text(json.dumps(config_of(shape)))
        args = ["profile", "--model", str(cfg), "--dry-run", "--device", dev, "--host-memory",
                str(host), "--json"] + (["--gpu-memory", "80"] if dev == "cuda" else [])
        out = subprocess.run([sys.executable, "-m", "autoplan.cli", *args], env=env,
                             capture_output=True, text=True, check=True).stdout
        text = subprocess.run([sys.executable, "-m", "autoplan.cli",
                               *[a for a in args if a != "--json"]], env=env,
                              capture_output=True, text=True, check=True).stdout
        print(text, flush=True)
        doc = json.loads(out)
        doc["model"] = shape
        doc["command"] = "autoplan " + " ".join(args).replace(str(cfg), f"{shape}/config.json")
        plans[shape] = doc
    return plans


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="tinyllama-1.1b", choices=sorted(SHAPES))
    ap.add_argument("--target", default="h100")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--execution", default="auto")
    ap.add_argument("--skip-search", action="store_true")
    ap.add_argument("--gpu", action="store_true", help="GPU check: build on the GPU, profile only")
    ap.add_argument("--plans-only", action="store_true",
                    help="only (re)write the --dry-run plans into --out")
    ap.add_argument("--models", type=Path, default=None,
                    help="where the random models are kept (default: a temporary folder)")
    ap.add_argument("--out", type=Path, default=RESULTS / "scale.json")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="autoplan-scale-"))
    models = args.models or work / "models"
    env = dict(os.environ, AUTOPLAN_CACHE=str(work / "cache"))
    result: dict = {"machine": machine_info(), "shape": args.shape, "config": SHAPES[args.shape],
                    "note": "random weights: quality figures (KL, ppl) mean nothing here; "
                            "the figures are time and memory",
                    "command": "python benchmarks/scale.py " + " ".join(argv or sys.argv[1:])}
    def save() -> None:  # after every step: an interrupted run keeps what it measured
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        tmp.replace(args.out)

    if args.plans_only:
        if args.out.is_file():
            result = json.loads(args.out.read_text())
        result["dry_run"] = dry_runs(env, work)
        save()
        shutil.rmtree(work, ignore_errors=True)
        return
    try:
        t0 = time.perf_counter()
        folder = build_model(args.shape, models / args.shape,
                             device="cuda" if args.gpu else "cpu")
        result["build_s"] = round(time.perf_counter() - t0, 1)
        dev = "cuda" if args.gpu else args.device
        base = ["--model", str(folder), "--target", args.target, "--device", dev,
                "--execution", args.execution]
        prof = measure("profile (cold cache)", ["profile", *base, "--json"], env,
                       stdout=work / "profile.json")
        prof["command"] = prof["command"].replace(str(folder), "DIR")
        if prof.get("rc") == 0:
            doc = json.loads((work / "profile.json").read_text())
            prof.update({k: doc[k] for k in ("execution", "device", "tokens")})
            prof["layers"], prof["choices"] = len(doc["layers"]), len(doc["choices"])
        result["profile"] = prof
        save()
        if not (args.skip_search or args.gpu):
            search = measure("search (profile cached)",
                             ["search", *base, "--out", str(work / "plan.json"), "--json",
                              "--quiet"], env, stdout=work / "search.json")
            search["command"] = search["command"].replace(str(folder), "DIR").replace(
                str(work / "plan.json"), "plan.json")
            if search.get("rc") == 0:
                plan = json.loads((work / "search.json").read_text())
                search["plan"] = {"outcome": plan["search"]["outcome"],
                                  "real_evaluations": plan["search"]["real_evaluations"],
                                  "kl_meaningless_random_weights": plan["quality"]["kl"]}
            result["search"] = search
            save()
        if not args.gpu:
            result["dry_run"] = dry_runs(env, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    save()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        _child(sys.argv[2:])
    else:
        main()
