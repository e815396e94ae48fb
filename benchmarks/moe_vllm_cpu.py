"""Does vLLM's CPU build load autoplan's MoE exports? (issue 26 item 5)

For a tiny random Mixtral and Qwen3-MoE (tests/unit/_tiny_moe.py shapes, hidden 64, four
experts of width 32, top-2) and for the MoEfied SmolLM2 when its folder exists, a plan is
searched for vLLM (target b200: every vLLM format passes the runtime matrix, so the CPU
engine itself is asked), then exported as compressed-tensors with every linear layer (the
experts included) in one format, and loaded with `vllm.LLM` in the vLLM engine's venv. The
result per (model, format) is vLLM's own error text, or, when it loads, greedy tokens and
the teacher-forced logprob agreement with autoplan's simulation of the same plan.

    python benchmarks/moe_vllm_cpu.py [--formats int8,fp8_e4m3,int4_g32,bf16]
        -> benchmarks/results/moe_vllm_cpu.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import cpu_flags, start_run, write_result  # noqa: E402

FORMATS = ("bf16", "int8", "fp8_e4m3", "int4_g32")


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results/moe_vllm_cpu.json")
    p.add_argument("--formats", default=",".join(FORMATS))
    p.add_argument("--families", default="mixtral,qwen3_moe")
    p.add_argument("--moefied", default="", help="also the MoEfied SmolLM2 folder")
    return p.parse_args(argv)


def _plan(folder: Path, work: Path):  # noqa: ANN202 - (Plan, LoadedModel)
    from autoplan.models import load_model
    from autoplan.search import ExecutionSettings, SearchRequest, run_search
    from autoplan.workload import Workload

    req = SearchRequest(model=str(folder), target="b200", runtime="vllm", budget="kl<=0.5",
                        workload=Workload(batch=1, input_len=64, output_len=16),
                        objective="tpot", trials=20, seq_len=64, calib_blocks=2,
                        eval_blocks=2, out=work / "plan.json",
                        execution=ExecutionSettings(execution="memory"))
    return run_search(req).plan, load_model(str(folder))


def _uniform(plan, choice: str):  # noqa: ANN001, ANN202 - Plan in, Plan out
    decisions = {n: (choice if "lm_head" not in n else "dense+bf16") for n in plan.decisions}
    return plan.model_copy(update={"decisions": decisions,
                                   "audit": plan.audit.model_copy(update={"tensors": {}})})


def check(folder: Path, name: str, formats: list[str], work: Path) -> dict:
    from autoplan.engines.vllm_check import compare, reference_logprobs, simulated_model
    from autoplan.engines.vllm_engine import run_vllm
    from autoplan.errors import AutoplanError
    from autoplan.export import export_plan

    plan, loaded = _plan(folder, work / name)
    prompts = [[(7 * i + 3 * j) % 200 + 2 for j in range(24)] for i in range(3)]
    out = {}
    for fmt in formats:
        choice = f"dense+{fmt}"
        uniform = _uniform(plan, choice)
        row: dict = {"choice": choice}
        if fmt == "bf16":  # the unquantized checkpoint itself: does vLLM CPU run this MoE?
            folder_ct = folder
        else:
            try:
                folder_ct = export_plan(uniform, loaded, "compressed-tensors", work / name / fmt)
            except AutoplanError as exc:
                out[fmt] = row | {"exported": False, "error": str(exc)}
                continue
        run = run_vllm(folder_ct, prompts, max_tokens=4, dtype="bfloat16", logprobs=1,
                       max_model_len=128)
        row |= {"exported": True, "loaded": run.ok}
        if not run.ok:
            row["vllm_error"] = f"{run.stage}: {run.error}"
        else:
            sim = simulated_model(uniform, loaded)
            ref = reference_logprobs(sim, prompts, [r["tokens"] for r in run.results])
            row |= {"compare": compare(run.results, ref), "load_s": run.load_s,
                    "versions": run.versions}
        out[fmt] = row
        print(f"{name} {fmt}: {'loads' if row.get('loaded') else row.get('vllm_error', row.get('error'))}"
              [:300], flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    info, command = start_run(0, argv)
    from tests.unit._tiny_moe import save_tiny_moe

    formats = [f for f in args.formats.split(",") if f]
    results = {}
    with tempfile.TemporaryDirectory(prefix="autoplan-moe-vllm-") as tmp:
        work = Path(tmp)
        for family in [f for f in args.families.split(",") if f]:
            folder = save_tiny_moe(work / f"tiny-{family}-model", family)
            results[f"tiny-{family}"] = check(folder, f"tiny-{family}", formats, work)
        if args.moefied:
            results["moefied-smollm2"] = check(Path(args.moefied), "moefied", formats, work)
    write_result(args.out, {"machine": info, "command": command, "cpu_flags": cpu_flags(),
                            "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
