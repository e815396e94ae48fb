"""A streamed profile of a random-weight model with Qwen3-30B-A3B's per-layer shapes: 128
experts of width 768 (top-8) per block, hidden 2048, 32 query / 4 KV heads of 128, q/k
norms, its 151,936-token vocabulary, and --layers blocks (default 4 of its 48). Peak RSS and
wall time per block of `autoplan profile --execution stream`, and what 48 blocks would take.

The checkpoint is written the way Qwen3-MoE checkpoints are (one bf16 tensor per expert
projection, `mlp.experts.{e}.gate_proj.weight`, a shard per block), generated tensor by
tensor, so writing it never holds more than one block. Random weights make the scores
meaningless; the point is memory and time.

    python benchmarks/moe_scale.py [--layers 4] [--choices fp8,int4_g128] [--calib-blocks 2]
        -> benchmarks/results/moe_scale.json
    python benchmarks/moe_scale.py --search --models DIR
        -> benchmarks/results/moe_scale_search.json: a whole streamed search (profile,
           surrogate, verification) through the library API, in a fresh process, with
           the same calibration as the profile; its peak RSS against the dry run's
           verification-phase estimate
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info, write_result  # noqa: E402
from scale import ShardedCheckpoint, _tokenizer  # noqa: E402

SHAPE = dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
             num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
             num_experts_per_tok=8, vocab_size=151936)


def config(layers: int) -> dict:
    return {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
            "num_hidden_layers": layers, "decoder_sparse_step": 1, "mlp_only_layers": [],
            "norm_topk_prob": True, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 1, "pad_token_id": 0,
            "attention_bias": False, **SHAPE}


def build(folder: Path, layers: int, seed: int = 0) -> Path:
    """The random checkpoint, one shard per block plus one for embeddings and head."""
    import torch

    if (folder / "done").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    cfg = config(layers)
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    _tokenizer().save_pretrained(folder)
    h, e, inter, vocab = SHAPE["hidden_size"], SHAPE["num_experts"], \
        SHAPE["moe_intermediate_size"], SHAPE["vocab_size"]
    hd = SHAPE["head_dim"]
    q, kv = SHAPE["num_attention_heads"] * hd, SHAPE["num_key_value_heads"] * hd
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.02).to(torch.bfloat16)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=torch.bfloat16)

    ckpt = ShardedCheckpoint(folder, layers + 1)
    ckpt.write(0, {"model.embed_tokens.weight": rand(vocab, h), "lm_head.weight": rand(vocab, h),
              "model.norm.weight": ones(h)})
    for i in range(layers):
        p = f"model.layers.{i}."
        shard = {p + "self_attn.q_proj.weight": rand(q, h), p + "self_attn.k_proj.weight": rand(kv, h),
                 p + "self_attn.v_proj.weight": rand(kv, h), p + "self_attn.o_proj.weight": rand(h, q),
                 p + "self_attn.q_norm.weight": ones(hd), p + "self_attn.k_norm.weight": ones(hd),
                 p + "input_layernorm.weight": ones(h), p + "post_attention_layernorm.weight": ones(h),
                 p + "mlp.gate.weight": rand(e, h)}
        for x in range(e):
            shard[f"{p}mlp.experts.{x}.gate_proj.weight"] = rand(inter, h)
            shard[f"{p}mlp.experts.{x}.up_proj.weight"] = rand(inter, h)
            shard[f"{p}mlp.experts.{x}.down_proj.weight"] = rand(h, inter)
        ckpt.write(1 + i, shard)
        del shard
    ckpt.finish()
    return folder


def _peak_rss_gib() -> float:
    """This process's VmHWM: its own high-water mark since exec, not ru_maxrss, which Linux
    carries over from the parent that forked it."""
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 2**20


def _child(argv: list[str]) -> None:
    """The real CLI in this process; its wall time and peak RSS (`_peak_rss_gib`)."""
    import time

    from autoplan.cli import cli

    t0 = time.perf_counter()
    rc = 0
    try:
        cli.main(argv[1:], prog_name="autoplan", standalone_mode=False)
    except SystemExit as exc:
        rc = int(exc.code or 0)
    Path(argv[0]).write_text(json.dumps({"rc": rc, "wall_s": time.perf_counter() - t0,
                                         "peak_rss_gib": _peak_rss_gib()}))


def _search_child(argv: list[str]) -> None:
    """A streamed search through the library API (the CLI has no calibration-size flags)
    in this fresh process: its wall time and peak RSS (VmHWM)."""
    import time

    from autoplan.formats import Choice
    from autoplan.search import SearchRequest, run_search
    from autoplan.streaming.settings import ExecutionSettings

    report, folder, choices, calib, evals, seq_len, out = argv
    req = SearchRequest(model=folder, target="h100", out=Path(out),
                        choices=tuple(Choice.parse(c) for c in choices.split(",")),
                        calib_blocks=int(calib), eval_blocks=int(evals), seq_len=int(seq_len),
                        execution=ExecutionSettings(device="cpu", execution="stream"))
    t0 = time.perf_counter()
    meta = run_search(req).plan.search
    Path(report).write_text(json.dumps({
        "rc": 0, "wall_s": time.perf_counter() - t0, "peak_rss_gib": _peak_rss_gib(),
        "outcome": str(meta.outcome), "stopped": meta.stopped}))


def measure(label: str, args: list[str], env: dict, stdout: Path, child: str = "_child"
            ) -> dict:
    """`autoplan ARGS` (or the `child` entry point's ARGS) in a fresh process: wall, peak
    RSS, load before and after."""
    import os
    import subprocess
    import time

    report = stdout.with_suffix(".report.json")
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, __file__, child, str(report), *args], env=env,
                         capture_output=True, text=True)
    res = json.loads(report.read_text()) if report.is_file() else {"rc": out.returncode}
    stdout.write_text(out.stdout)
    res.update({"label": label, "process_wall_s": round(time.perf_counter() - t0, 1),
                "load_before": [round(x, 2) for x in load0],
                "load_after": [round(x, 2) for x in os.getloadavg()]})
    if res.get("rc"):
        res["stderr_tail"] = out.stderr[-2000:]
    print(json.dumps({k: v for k, v in res.items() if k != "stderr_tail"}), flush=True)
    return res


def _profile_estimate(dry: Path) -> float | None:
    """The dry-run's streamed estimate of the profile phase alone (what `profile` runs)."""
    try:
        plan = json.loads(dry.read_text())["plans"]["stream"]
        return plan["host_bytes_by_phase"]["profile"] / 2**30
    except (OSError, ValueError, KeyError):
        return None


def verification_estimates(folder: Path, args: argparse.Namespace) -> dict:
    """The streamed estimate's verification-phase peak at this run's own workload: with the
    Hessian diagonals an RTN search holds (what the search estimates for itself), and with
    the full Hessians GPTQ / SparseGPT would hold (what `profile --dry-run` shows)."""
    from autoplan.modelspec import ModelSpec
    from autoplan.streaming import estimate
    from autoplan.streaming.runner import workload_of

    spec = ModelSpec.from_path(folder)
    out = {}
    for key, full in (("verification_estimate_rtn_gib", False),
                      ("verification_estimate_gptq_gib", True)):
        w = workload_of(args.seq_len, args.calib_blocks, args.eval_blocks, 2,
                        full_hessians=full)
        out[key] = estimate.plan(spec, "stream", "cpu", w).phase_host("verification") / 2**30
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--choices", default="dense+fp8_e4m3,dense+int4_g128")
    ap.add_argument("--calib-blocks", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--models", type=Path, default=None)
    ap.add_argument("--eval-blocks", type=int, default=2)
    ap.add_argument("--search", action="store_true",
                    help="run a whole streamed search after the profile (same calibration)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    args.out = args.out or ("benchmarks/results/moe_scale_search.json" if args.search
                            else "benchmarks/results/moe_scale.json")
    import os
    import time

    import subprocess

    root = args.models or Path(tempfile.mkdtemp(prefix="autoplan-moe-scale-"))
    folder = root / f"qwen3-30b-a3b-shaped-{args.layers}l"
    t0 = time.perf_counter()
    # built in a child of its own, so this process stays small when it starts the profile
    subprocess.run([sys.executable, __file__, "_build", str(folder), str(args.layers)],
                   check=True)
    build_s = time.perf_counter() - t0
    env = dict(os.environ, AUTOPLAN_CACHE=str(root / "cache"))
    cmd = ["profile", "--model", str(folder), "--target", "h100", "--execution", "stream",
           "--device", "cpu", "--choices", args.choices, "--calib-blocks",
           str(args.calib_blocks), "--seq-len", str(args.seq_len), "--json"]
    dry = measure("dry-run", ["profile", "--model", str(folder), "--dry-run", "--device", "cpu",
                              "--json"], env, stdout=root / "dry.json")
    run = measure("profile", cmd, env, stdout=root / "profile.json")
    size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    per_block = run.get("wall_s", 0) / args.layers
    doc = {"machine": machine_info(), "shape": SHAPE, "layers": args.layers,
           "checkpoint_bytes": size, "build_s": build_s,
           "command": "autoplan " + " ".join(cmd).replace(str(folder), "<qwen3-30b-a3b-shaped>"),
           "profile": run, "dry_run": json.loads((root / "dry.json").read_text() or "{}"),
           "peak_rss_gib": run.get("peak_rss_gib"),
           "peak_rss_gb": run.get("peak_rss_gib", 0) * 2**30 / 1e9,
           "goal_peak_rss_gb": 4.0,  # the "under 4 GB": 4e9 bytes
           "goal_met": bool(run.get("peak_rss_gib") and run["peak_rss_gib"] * 2**30 < 4e9
                            and run.get("rc") == 0),
           "dry_run_profile_estimate_gib": _profile_estimate(root / "dry.json"),
           "wall_s_per_block": per_block,
           "wall_s_48_blocks_estimate": per_block * 48,
           "note": "48-block estimate = wall / layers x 48 (the embedding and head passes "
                   "included once per block here, so it leans high)"}
    if args.search:
        search = measure("search", [str(folder), args.choices,
                                    str(args.calib_blocks), str(args.eval_blocks),
                                    str(args.seq_len), str(root / "plan.json")],
                         env, stdout=root / "search.txt", child="_search_child")
        doc.update({
            "search": search, "eval_blocks": args.eval_blocks,
            "search_api": "SearchRequest(model, target='h100', choices, calib_blocks, "
                          "eval_blocks, seq_len, execution=stream on cpu) -> run_search",
            "search_peak_rss_gib": search.get("peak_rss_gib"),
            **verification_estimates(folder, args)})
    del dry
    write_result(args.out, doc)
    print(json.dumps({k: doc[k] for k in ("peak_rss_gib", "peak_rss_gb", "goal_met",
                                           "dry_run_profile_estimate_gib", "wall_s_per_block",
                                           "wall_s_48_blocks_estimate")}))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["_child"]:
        _child(sys.argv[2:])
    elif sys.argv[1:2] == ["_search_child"]:
        _search_child(sys.argv[2:])
    elif sys.argv[1:2] == ["_build"]:
        build(Path(sys.argv[2]), int(sys.argv[3]))
    else:
        raise SystemExit(main())
