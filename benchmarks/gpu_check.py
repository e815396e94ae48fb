"""One prepared GPU check for a lent H200: sections ordered by value, each time-boxed.

    python benchmarks/gpu_check.py [--cpu-smoke] [--budget-s S] [--sections a,b,...]
                                   [--out DIR] [--search-model GGUF]

Sections (docs/gpu.md says what each measures), each run in its own child process with a
time box (a hang or a CUDA fault ends that section only):

  env       versions, the GPU, every kit and autoplan import
  tests     pytest -m gpu tests/gpu: autoplan's kernels and simulations on CUDA
  search    `autoplan search --device cuda --target h200` on the embedded model's first
            blocks (.gpu_model/, gpu_model.py), wall time beside the same command on CPU
  gemm      Llama-3.1-8B / 70B layer GEMMs x choices x M (gpu_gemm.py) -> cost_table.json
  validate  `autoplan validate --cost-table`: the analytic model's error per kernel class
  decode    decode-step tokens/s of an 8B-shaped model per plan (gpu_decode.py)
  stream    the streamed profile of a Llama-3.1-8B-shaped model (benchmarks/scale.py --gpu)

After every section, gpu_check.json (all sections: status, seconds, reason when not ok,
results) is rewritten atomically under --out (default $OUT, else ./gpu_results), with
cost_table.json beside it. `--cpu-smoke` runs every section's code on CPU with tiny shapes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from _common import one_line

SECTIONS = ("env", "tests", "search", "gemm", "validate", "decode", "stream")
# (time box, least time worth starting with) in seconds, on the GPU and in --cpu-smoke
BOXES = {
    "env": (40, 10), "tests": (120, 30), "search": (150, 45), "gemm": (120, 30),
    "validate": (30, 10), "decode": (60, 20), "stream": (300, 60),
}
SMOKE_BOXES = {
    "env": (120, 10), "tests": (300, 30), "search": (600, 45), "gemm": (180, 30),
    "validate": (60, 10), "decode": (120, 20), "stream": (300, 60),
}
KIT_MODULES = ("gguf", "optuna", "alembic", "sqlalchemy", "colorlog", "pydantic",
               "pydantic_core", "annotated_types", "typing_inspection", "compressed_tensors",
               "loguru", "pycountry", "mako", "typing_extensions")
AUTOPLAN_MODULES = ("autoplan.cli", "autoplan.backends.registry", "autoplan.backends.microbench",
                    "autoplan.backends.nvidia.kernels", "autoplan.backends.amd.triton_bsr",
                    "autoplan.search", "autoplan.streaming",
                    "autoplan.cost.table_check", "autoplan.search_spaces")
SEARCH_MODEL = REPO / ".gpu_model" / "smollm2-135m-4blocks.gguf"
CPU_SEARCH_REFERENCE = HERE / "results" / "gpu_search_cpu.json"


# ---------------------------------------------------------------- the orchestrator


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu_results"))
    ap.add_argument("--cpu-smoke", action="store_true", help="every section on CPU, tiny shapes")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="all sections together (default 520 on a GPU, 1800 with --cpu-smoke)")
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help=f"comma-separated, run in this order (default: {','.join(SECTIONS)})")
    ap.add_argument("--search-model", type=Path, default=None,
                    help=f"GGUF for the search section (default {SEARCH_MODEL.relative_to(REPO)})")
    ap.add_argument("--repeats", type=int, default=20, help="timed calls per GEMM row")
    ap.add_argument("--cpu-reference", action="store_true",
                    help="run the search section's command on CPU (full trials) and save it as "
                         f"{CPU_SEARCH_REFERENCE.relative_to(REPO)}, the figure the GPU's is "
                         "shown beside")
    ap.add_argument("--run-section", default=None, help=argparse.SUPPRESS)  # child mode
    ap.add_argument("--state", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--box-s", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.run_section:
        return run_child(args)
    if args.budget_s is None:
        args.budget_s = 1800.0 if args.cpu_smoke else 520.0
    if args.cpu_reference:
        args.sections, args.budget_s = "search", max(args.budget_s, 3600.0)
    names = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in names if s not in SECTIONS]
    if unknown:
        print(f"error: unknown section(s) {unknown}; choose from {','.join(SECTIONS)}",
              file=sys.stderr)
        return 2
    return orchestrate(args, names)


class _Stopped(Exception):
    """SIGTERM from gpu_check.sh's hard stop (or the device call's end)."""


def _on_term(signum, frame) -> None:  # noqa: ANN001
    raise _Stopped


def orchestrate(args: argparse.Namespace, names: list[str]) -> int:
    signal.signal(signal.SIGTERM, _on_term)
    start = time.monotonic()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    state = Path(tempfile.mkdtemp(prefix="gpu-check-state-"))
    boxes = SMOKE_BOXES if args.cpu_smoke else BOXES
    if args.cpu_reference:
        boxes = {**boxes, "search": (3600, 45)}
    report: dict[str, Any] = {
        "schema_version": 2, "mode": "cpu-smoke" if args.cpu_smoke else "gpu",
        "budget_s": args.budget_s, "sections_asked": names, "sections": {},
        "command": "python benchmarks/gpu_check.py " + " ".join(sys.argv[1:]),
        "complete": False,
    }
    _write_json(out / "gpu_check.json", report)
    try:
        try:
            _run_all(args, names, report, start, state, boxes)
        finally:  # the sections' partial results are copied into the report already
            shutil.rmtree(state, ignore_errors=True)
    except _Stopped:  # the running section was killed with its children; say so, then stop
        for name in names:
            report["sections"].setdefault(name, {
                "status": "skipped", "seconds": 0.0,
                "reason": "the check was stopped (SIGTERM: the hard stop) before it started"})
        report["stopped"] = "SIGTERM"
        report["elapsed_s"] = round(time.monotonic() - start, 1)
        _write_json(out / "gpu_check.json", report)
        print("stopped by SIGTERM; partial results in gpu_check.json", flush=True)
        return 124
    report["complete"] = True
    _write_json(out / "gpu_check.json", report)
    for line in summarize(report):
        print(line)
    print(f"results: {out / 'gpu_check.json'} ({report['elapsed_s']} s)")
    return 0 if all(s["status"] == "ok" for s in report["sections"].values()) else 1


def _run_all(args: argparse.Namespace, names: list[str], report: dict[str, Any], start: float,
             state: Path, boxes: dict[str, tuple[int, int]]) -> None:
    out: Path = args.out
    for name in names:
        left = args.budget_s - (time.monotonic() - start)
        box, least = boxes[name]
        box = min(box, left)
        if box < least:
            report["sections"][name] = {
                "status": "skipped", "seconds": 0.0,
                "reason": f"{left:.0f} s of the {args.budget_s:.0f} s budget left, it needs "
                          f"at least {least} s: run it in a second call (--sections {name})"}
        else:
            print(f"== {name} (time box {box:.0f} s)", flush=True)
            report["sections"][name] = _run_section(args, name, box, state)
            if getattr(args, "stopped", False):
                raise _Stopped
            sec = report["sections"][name]
            print(f"== {name}: {sec['status']} in {sec['seconds']} s"
                  + (f" ({sec['reason']})" if sec.get("reason") else ""), flush=True)
        report["elapsed_s"] = round(time.monotonic() - start, 1)
        _write_json(out / "gpu_check.json", report)


def _run_section(args: argparse.Namespace, name: str, box: float, state: Path) -> dict[str, Any]:
    """One section in a child process group, killed at its time box; its partial results
    (the child saves them as it goes) are kept either way."""
    partial = state / f"{name}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--run-section", name,
           "--state", str(state), "--out", str(args.out), "--box-s", str(box),
           "--repeats", str(args.repeats)]
    cmd += ["--cpu-smoke"] if args.cpu_smoke else []
    cmd += ["--cpu-reference"] if args.cpu_reference else []
    if args.search_model:
        cmd += ["--search-model", str(args.search_model)]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, start_new_session=True)
    try:
        rc = proc.wait(timeout=box)
        status, reason = ("ok", None) if rc == 0 else ("failed", f"exit code {rc}")
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        status, reason = "timed_out", f"stopped at its {box:.0f} s time box"
    except _Stopped:  # keep what the section saved, then stop the check
        _kill_group(proc)
        status, reason = "timed_out", "stopped by SIGTERM (gpu_check.sh's hard stop)"
        args.stopped = True
    result = _read_json(partial) or {}
    if result.get("error"):  # the child's own account of why it failed
        status, reason = "failed", result["error"]
    elif status == "ok" and result.get("incomplete"):
        status, reason = "incomplete", result["incomplete"]
    elif status == "ok" and not result:
        status, reason = "failed", "the section wrote no result"
    sec: dict[str, Any] = {"status": status, "seconds": round(time.monotonic() - t0, 1)}
    if reason:
        sec["reason"] = reason
    sec["result"] = result
    return sec


def _kill_group(proc: subprocess.Popen) -> None:
    """End a section's child and everything it started (its own session)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def summarize(report: dict[str, Any]) -> list[str]:
    """A few lines per section for the call's output tail."""
    lines = []
    for name, sec in report["sections"].items():
        lines.append(f"{name:9} {sec['status']:10} {sec['seconds']:7.1f} s  {sec.get('reason', '')}")
        res = sec.get("result") or {}
        if not res:
            continue
        if name == "tests" and "counts" in res:
            lines.append(f"          {res['counts']}" + (f" failed: {res['failed']}" if res.get("failed") else ""))
        if name == "search" and "wall_s" in res:
            lines.append(f"          wall {res['wall_s']} s (cpu reference: "
                         f"{(res.get('cpu_reference') or {}).get('wall_s', '-')} s), outcome "
                         f"{res.get('outcome', '-')}")
        if name == "gemm":
            lines.append(f"          {len(res.get('rows', []))} rows, {len(res.get('skipped', []))} skipped")
        if name == "validate" and "classes" in res:
            for c in res["classes"]:
                flag = "  DISAGREES" if c["disagrees"] else ""
                lines.append(f"          {c['choice']:18} {c['bound']:8} n={c['rows']:3} "
                             f"MAPE {c['mape']:.1%} mean {c['mean_error']:+.1%}{flag}")
        if name == "decode":
            for d in res.get("decode", []):
                what = f"{d['tokens_per_s']:.1f} tok/s" if "tokens_per_s" in d else d.get("error")
                lines.append(f"          {d['plan']:22} batch {d.get('batch', '-')}: {what}")
        if name == "stream" and "profile" in res:
            p = res["profile"]
            lines.append(f"          profile wall {p.get('wall_s')} s, peak GPU {p.get('peak_gpu_gib')} GiB")
    return lines


# ---------------------------------------------------------------- sections (child side)


class Section:
    """What a section child gets: its settings, deadline and a save() for partial results."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.name = args.run_section
        self.smoke = args.cpu_smoke
        self.device = "cpu" if args.cpu_smoke or args.cpu_reference else "cuda"
        self.out: Path = args.out
        self.path: Path = args.state / f"{self.name}.json"
        self.deadline = time.monotonic() + (args.box_s or 60) - 5  # 5 s to save and exit
        self.args = args
        self.result: dict[str, Any] = {}

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        _write_json(self.path, self.result)


def run_child(args: argparse.Namespace) -> int:
    sec = Section(args)
    try:
        globals()[f"section_{sec.name}"](sec)
    except Exception as err:  # noqa: BLE001 - the orchestrator records why, then goes on
        import traceback

        sec.result["error"] = one_line(err)
        sec.result["traceback"] = traceback.format_exc(limit=8)
        sec.save()
        return 1
    sec.save()
    return 0


def section_env(sec: Section) -> None:
    import importlib
    import importlib.metadata as md

    env: dict[str, Any] = {"python": platform.python_version(), "executable": sys.executable}
    sec.result.update(env=env, imports={})
    for mod in ("torch", "triton", "transformers", "numpy", "scipy", "accelerate",
                "safetensors", "onnx", "onnxruntime", "pytest", *KIT_MODULES, *AUTOPLAN_MODULES):
        try:
            m = importlib.import_module(mod)  # where from: the kit's folder, the image, here
            sec.result["imports"][mod] = (f"{getattr(m, '__version__', 'ok')} @ "
                                          f"{Path(m.__file__ or '?').parent}")
        except Exception as err:  # noqa: BLE001 - every missing import, not only the first
            sec.result["imports"][mod] = f"FAILED {one_line(err)}"
    sec.result["distributions"] = {d.metadata["Name"]: d.version for d in md.distributions()}
    sec.save()
    import torch
    from _common import machine_info

    env.update(machine=machine_info(), torch=torch.__version__, cuda=torch.version.cuda,
               cuda_available=torch.cuda.is_available())
    if sec.device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False: no GPU here (use --cpu-smoke)")
        props = torch.cuda.get_device_properties(0)
        env.update(device=torch.cuda.get_device_name(), capability=list(
            torch.cuda.get_device_capability()), memory_gib=round(props.total_memory / 2**30, 1),
            multiprocessors=props.multi_processor_count)
    failed = sorted(m for m, v in sec.result["imports"].items() if str(v).startswith("FAILED"))
    if failed:
        raise RuntimeError(f"imports failed: {', '.join(failed)} (see result.imports)")


class _TestRecorder:
    """A pytest plugin that saves every test's outcome as it lands (a time box keeps them)."""

    def __init__(self, sec: Section) -> None:
        self.sec = sec
        sec.result.update(counts={}, failed=[], skipped_reasons={})

    def pytest_runtest_logreport(self, report) -> None:
        if report.when != "call" and not (report.failed or report.skipped):
            return
        outcome = report.outcome
        counts = self.sec.result["counts"]
        counts[outcome] = counts.get(outcome, 0) + 1
        if report.failed:
            self.sec.result["failed"].append(
                {"test": report.nodeid, "when": report.when,
                 "message": str(report.longrepr).strip().splitlines()[-1][:400]})
        elif report.skipped and isinstance(report.longrepr, tuple):
            why = str(report.longrepr[2])[:200]
            self.sec.result["skipped_reasons"][why] = self.sec.result["skipped_reasons"].get(why, 0) + 1
        self.sec.save()


def section_tests(sec: Section) -> None:
    import pytest

    os.chdir(REPO)
    rec = _TestRecorder(sec)
    rc = pytest.main(["-q", "-p", "no:cacheprovider", "-m", "gpu", "tests/gpu",
                      "--timeout=90"] if _has_pytest_timeout() else
                     ["-q", "-p", "no:cacheprovider", "-m", "gpu", "tests/gpu"], plugins=[rec])
    sec.result["pytest_exit_code"] = int(rc)
    if sec.result["failed"] or int(rc) not in (0, 5):
        raise RuntimeError(f"{len(sec.result['failed'])} GPU test(s) failed (pytest exit {int(rc)})")


def _has_pytest_timeout() -> bool:
    import importlib.util

    return importlib.util.find_spec("pytest_timeout") is not None


def section_search(sec: Section) -> None:
    model = sec.args.search_model or SEARCH_MODEL
    if not model.is_file():
        raise RuntimeError(f"no search model at {model}: run benchmarks/gpu_kit.sh and carry "
                           ".gpu_model (docs/gpu.md)")
    trials = "200" if sec.smoke else "2000"  # 2000: the CLI's default, as search_walltime
    work = Path(tempfile.mkdtemp(prefix="gpu-search-"))
    plan = work / "plan.json"
    cmd = [sys.executable, "-m", "autoplan.cli", "search", "--model", str(model),
           "--target", "h200", "--device", sec.device, "--trials", trials, "--quiet",
           "--out", str(plan)]
    shown = ["autoplan", *cmd[3:]]
    shown[shown.index(str(model))] = model.name
    shown[shown.index(str(plan))] = "plan.json"
    sec.result.update(command=" ".join(shown), model=model.name,
                      cpu_reference=_read_json(CPU_SEARCH_REFERENCE))
    sec.save()
    env = dict(os.environ, AUTOPLAN_CACHE=str(work / "cache"))  # cold: conversion included
    sec.result["load_before"] = [round(x, 2) for x in os.getloadavg()]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False,
                              timeout=max(10.0, sec.left()))
    except subprocess.TimeoutExpired:
        sec.result["incomplete"] = f"the search did not finish in {time.perf_counter() - t0:.0f} s"
        return
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # the search's own CPU seconds
    sec.result.update(wall_s=round(time.perf_counter() - t0, 1), exit_code=proc.returncode,
                      process_cpu_s=round(usage.ru_utime + usage.ru_stime, 1),
                      load_after=[round(x, 2) for x in os.getloadavg()],
                      cpus=os.cpu_count())
    if proc.returncode != 0:
        sec.result["stderr_tail"] = proc.stderr[-3000:]
        raise RuntimeError(f"autoplan search exited {proc.returncode}: "
                           f"{(proc.stderr.strip().splitlines() or [''])[-1][:300]}")
    doc = json.loads(plan.read_text())
    s = doc["search"]
    sec.result.update(
        outcome=s["outcome"], trials=s["trials"], real_evaluations=s["real_evaluations"],
        gain_over_best_uniform=s["gain_over_best_uniform"], best_uniform=s["best_uniform"],
        measured_kl=doc["quality"]["kl"], budget=doc["budget"]["text"],
        plan_tokens_per_s_predicted=doc["predicted"]["plan"]["tokens_per_s"],
        baseline_tokens_per_s_predicted=doc["predicted"]["baseline"]["tokens_per_s"])
    if sec.args.cpu_reference:
        from _common import machine_info, write_result

        ref = {k: v for k, v in sec.result.items() if k != "cpu_reference"}
        write_result(CPU_SEARCH_REFERENCE, {**ref, "machine": machine_info(),
                                            "command_run": "python benchmarks/gpu_check.py "
                                                           "--cpu-reference"})


def section_gemm(sec: Section) -> None:
    import gpu_gemm
    from autoplan.backends import microbench as MB

    cfg = dict(models=gpu_gemm.MODELS, tokens=gpu_gemm.TOKENS, choices=gpu_gemm.CHOICES)
    if sec.smoke:
        cfg.update(gpu_gemm.SMOKE)
    repeats, warmup = (2, 1) if sec.smoke else (sec.args.repeats, 3)
    sec.result.update(models=cfg["models"], tokens=list(cfg["tokens"]),
                      choices=list(cfg["choices"]), repeats=repeats, rows=[], skipped=[])
    got: dict[str, Any] = {"rows": sec.result["rows"], "skipped": sec.result["skipped"]}

    def write_table() -> None:
        table = MB.cost_table(got["rows"], sec.device, got["skipped"])
        MB.write_cost_table(table, sec.out / "cost_table.json")

    def on_row() -> None:
        sec.save()
        if len(got["rows"]) % 20 == 0:
            write_table()

    done = gpu_gemm.sweep(cfg["models"], cfg["tokens"], cfg["choices"], sec.device, repeats,
                          warmup, sec.deadline - 3, on_row)
    got.update(done)
    sec.result.update(rows=done["rows"], skipped=done["skipped"])
    write_table()
    if done["stopped"]:
        sec.result["incomplete"] = done["stopped"]


def section_validate(sec: Section) -> None:
    table = sec.out / "cost_table.json"
    if not table.is_file():
        raise RuntimeError("no cost_table.json: the gemm section did not write one")
    cmd = [sys.executable, "-m", "autoplan.cli", "validate", "--cost-table", str(table),
           "--target", "h200", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False,
                          timeout=max(5.0, sec.left()))
    sec.result["command"] = "autoplan validate --cost-table cost_table.json --target h200 --json"
    if proc.returncode != 0:
        raise RuntimeError(f"autoplan validate exited {proc.returncode}: {proc.stderr.strip()[:300]}")
    doc = json.loads(proc.stdout)
    sec.result.update(mape=doc["mape"], threshold=doc["threshold"], classes=doc["classes"],
                      device=doc["device"], target=doc["target"],
                      rows=[{k: r[k] for k in ("m", "n", "k", "choice", "measured_us",
                                               "predicted_us", "error", "bound")}
                            for r in doc["rows"]])


def section_decode(sec: Section) -> None:
    import gpu_decode

    cfg = dict(gpu_decode.SMOKE if sec.smoke else gpu_decode.CONFIG, device=sec.device)
    sec.result.update(config={k: v for k, v in cfg.items() if k != "plans"},
                      plans=cfg["plans"], decode=[], notes=[])
    gpu_decode.run_decode(cfg, sec.deadline - 10, sec.result["decode"], sec.result["notes"],
                          sec.save)
    if sec.result["notes"]:
        sec.result["incomplete"] = "; ".join(sec.result["notes"])


def section_stream(sec: Section) -> None:
    out = Path(tempfile.mkdtemp(prefix="gpu-stream-")) / "stream.json"
    cmd = [sys.executable, str(HERE / "scale.py"), "--out", str(out), "--execution", "stream"]
    cmd += (["--shape", "smoke", "--device", "cpu", "--skip-search"] if sec.smoke
            else ["--gpu", "--shape", "llama-3.1-8b"])
    sec.result["command"] = "python benchmarks/scale.py " + " ".join(cmd[4:])
    sec.save()
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False,
                              timeout=max(10.0, sec.left()))
    except subprocess.TimeoutExpired as exc:
        sec.result.update(_read_json(out) or {})
        tail = (exc.stderr or b"")[-1500:]
        sec.result["log_tail"] = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        sec.result["incomplete"] = (f"the streamed profile did not finish in "
                                    f"{time.perf_counter() - t0:.0f} s (the issue-10 goal is "
                                    "300 s); a second call with --sections stream gives it more")
        return
    sec.result.update(_read_json(out) or {})
    sec.result["wall_s"] = round(time.perf_counter() - t0, 1)
    if proc.returncode != 0 or (sec.result.get("profile") or {}).get("rc"):
        sec.result["log_tail"] = proc.stderr[-1500:]
        raise RuntimeError(f"scale.py exited {proc.returncode}; see result.log_tail")


# ---------------------------------------------------------------- helpers


def _write_json(path: Path, doc: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))  # sections in the order they ran
    tmp.replace(path)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None



if __name__ == "__main__":
    sys.exit(main())
