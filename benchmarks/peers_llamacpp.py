"""llama.cpp's own tools and the measurements every GGUF side of benchmarks/peers.py shares.

* `llama_tools`: `llama-quantize` and `llama-imatrix`, which llama-cpp-python does not ship
  (its wheel holds the shared libraries only, and `llama_model_quantize`'s imatrix parameter is
  a C++ map no Python binding can fill), built once from the very sdist the llama.cpp engine
  was compiled from (same llama.cpp commit) under `$AUTOPLAN_CACHE/peers/llama.cpp-tools/`.
* `eval_quality`: KL(P_original || P_side) and perplexity through llama.cpp's own logits on
  autoplan's evaluation blocks, the original Q4_1 file as the reference.
* `time_sides`: decode and prefill tok/s, every side loaded in its own llama.cpp worker and
  run once per round on the same prompt, rounds interleaved, medians over rounds.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import tarfile
from pathlib import Path

from peers_common import PeerError, peers_dir, run

# The llama.cpp mixes compared here (llama-quantize's own names).
MIXES = ("Q4_K_M", "Q5_K_M", "Q4_K_S", "Q6_K")


def engine_llamacpp_version() -> str:
    from autoplan.engines import engine_python
    from peers_common import versions

    got = versions(engine_python("llama.cpp"), ["llama_cpp_python"]).get("llama_cpp_python")
    if not got:
        raise PeerError("the llama.cpp engine has no llama-cpp-python: rebuild it with "
                        "`autoplan engines install llama.cpp --force`")
    return got


def _sdist(version: str) -> Path:
    """The unpacked llama-cpp-python sdist of ``version`` (pip download, once)."""
    src = peers_dir() / "src" / "llama-cpp-python"
    if (src / "vendor" / "llama.cpp" / "tools" / "quantize").is_dir() and \
            f'__version__ = "{version}"' in (src / "llama_cpp" / "__init__.py").read_text():
        return src
    dl = peers_dir() / "src" / "download"
    run([os.environ.get("PIP", "pip"), "download", "--no-deps", "--no-binary", ":all:",
         f"llama-cpp-python=={version}", "-d", str(dl)], "pip download llama-cpp-python sdist")
    archive = next(dl.glob(f"llama_cpp_python-{version}.tar.gz"))
    with tarfile.open(archive) as tar:
        tar.extractall(dl, filter="data")
    (dl / f"llama_cpp_python-{version}").rename(src)
    return src


def llama_tools(log=print, *, build: bool = True) -> dict[str, Path] | None:  # noqa: ANN001
    """Paths of llama-quantize and llama-imatrix at the engine's llama.cpp commit (built once,
    statically linked, about 15-25 min on 2 quiet cores; None when not built and ``build`` is
    off)."""
    version = engine_llamacpp_version()
    root = peers_dir() / "llama.cpp-tools"
    build_dir, stamp = root / "build", root / "version.txt"
    tools = {"quantize": build_dir / "bin" / "llama-quantize",
             "imatrix": build_dir / "bin" / "llama-imatrix"}
    if all(p.is_file() for p in tools.values()) and (
            not stamp.is_file() or stamp.read_text().strip() == version):
        stamp.write_text(version)
        return tools
    if not build:
        return None
    src = _sdist(version) / "vendor" / "llama.cpp"
    log(f"building llama-quantize and llama-imatrix from llama-cpp-python {version}'s llama.cpp")
    run(["cmake", "-S", str(src), "-B", str(build_dir), "-G", "Ninja",
         "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_EXAMPLES=OFF",
         "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_CURL=OFF",
         "-DLLAMA_OPENSSL=OFF", "-DBUILD_SHARED_LIBS=OFF"], "cmake configure llama.cpp tools")
    run(["cmake", "--build", str(build_dir), "--target", "llama-quantize", "llama-imatrix",
         "-j", str(os.cpu_count() or 2)], "cmake build llama-quantize llama-imatrix")
    stamp.write_text(version)
    return tools


# llama-quantize's type names -> llama_ftype, for the library path (llama_model_quantize)
FTYPES = {"F32": 0, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18}
_QUANTIZE_API = (
    "import sys, llama_cpp.llama_cpp as c\n"
    "p = c.llama_model_quantize_default_params()\n"
    "p.nthread, p.ftype, p.allow_requantize = int(sys.argv[4]), int(sys.argv[3]), True\n"
    "sys.exit(c.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p))\n")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def quantize(tools: dict[str, Path] | None, src: Path, dst: Path, ftype: str, *, threads: int,
             imatrix: Path | None = None) -> tuple[str, dict]:
    """``llama-quantize [--imatrix F] --allow-requantize SRC DST FTYPE``: the command as run (with
    portable names) and what the tool reported (fallback tensors). Without the tool (not built),
    the same library call it makes, llama_model_quantize, through the engine's Python."""
    from autoplan.engines import engine_python

    if tools is None and imatrix is not None:
        raise PeerError("llama-imatrix / llama-quantize are not built here: run "
                        "`python benchmarks/peers.py llamacpp` without --no-tool-build")
    if tools is None:
        cmd = [str(engine_python("llama.cpp")), "-c", _QUANTIZE_API, str(src), str(dst),
               str(FTYPES[ftype]), str(threads)]
        shown = (f"llama_model_quantize({src.name}, {dst.name}, ftype={ftype}, "
                 "allow_requantize=True)  # what llama-quantize calls")
    else:
        cmd = [str(tools["quantize"]), "--allow-requantize",
               *(["--imatrix", str(imatrix)] if imatrix else []), str(src), str(dst), ftype,
               str(threads)]
        shown = " ".join(["llama-quantize", *[Path(c).name if "/" in c else c for c in cmd[1:]]])
    log = dst.with_suffix(".log")
    if not dst.is_file():
        tmp = dst.with_suffix(".part")
        run([c if c != str(dst) else str(tmp) for c in cmd], f"llama-quantize {ftype}", log=log)
        tmp.rename(dst)
    text = log.read_text() if log.is_file() else ""
    return shown, {"fallback_tensors": sum("falling back to" in x for x in text.splitlines())}


def compute_imatrix(tools: dict[str, Path], model: Path, text_file: Path, out: Path, *,
                    ctx: int, chunks: int, threads: int) -> tuple[str, dict]:
    """``llama-imatrix`` over the calibration text: the command and the chunks it used."""
    cmd = [str(tools["imatrix"]), "-m", str(model), "-f", str(text_file), "-o", str(out), "-c",
           str(ctx), "--chunks", str(chunks), "-t", str(threads), "--no-ppl"]
    if not out.is_file():
        run(cmd, "llama-imatrix", log=out.with_suffix(".log"))
    text = out.with_suffix(".log").read_text() if out.with_suffix(".log").is_file() else ""
    used = [line for line in text.splitlines() if "tokenizing the input" in line or
            "computing over" in line or "tokenization took" in line]
    shown = ["llama-imatrix", *[Path(c).name if "/" in c else c for c in cmd[1:]]]
    return " ".join(shown), {"log": used[-2:]}


def tensor_types(path: Path) -> dict[str, int]:
    """How many 2-D weight tensors of each GGUF type the file holds."""
    from collections import Counter

    from gguf import GGUFReader

    return dict(Counter(t.tensor_type.name for t in GGUFReader(str(path)).tensors
                        if t.name.endswith(".weight") and len(t.shape) == 2))


def linear_bits(path: Path) -> float:
    """Average bits per weight over the file's linear layers (embedding and norms excluded;
    output.weight counted when the file has one), from the stored bytes."""
    from gguf import GGUFReader

    n, nbytes = 0, 0
    for t in GGUFReader(str(path)).tensors:
        if len(t.shape) == 2 and t.name.endswith(".weight") and not t.name.startswith("token_embd"):
            n += int(t.n_elements)
            nbytes += int(t.n_bytes)
    return 8 * nbytes / n


def eval_quality(files: dict[str, Path], reference: Path, tokens,  # noqa: ANN001
                 threads: int) -> dict:
    """KL to the reference file and perplexity, through llama.cpp's logits, per side; cached
    in `$AUTOPLAN_CACHE/peers/llamacpp_quality.json` by the files' and tokens' content."""
    import json

    from autoplan.atomic import write_text_atomic
    from autoplan.engines.llamacpp_quality import llamacpp_quality, llamacpp_reference

    cache_path = peers_dir() / "llamacpp_quality.json"
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    base = hashlib.sha256(sha256(reference).encode() + tokens.numpy().tobytes()).hexdigest()
    keys = {name: hashlib.sha256((base + sha256(path)).encode()).hexdigest()
            for name, path in files.items()}
    missing = {n: p for n, p in files.items() if keys[n] not in cache}
    if missing:
        ref = llamacpp_reference(reference, tokens, threads=threads)
        for name, path in missing.items():
            cache[keys[name]] = llamacpp_quality(path, ref, threads=threads)
            write_text_atomic(cache_path, json.dumps(cache))
    return {name: cache[keys[name]] for name in files}


def time_sides(files: dict[str, Path], prompts: list, *, threads: int, output_len: int,
               log=print) -> dict:  # noqa: ANN001
    """Interleaved greedy generation, one prompt per round on every side; medians."""
    from autoplan.engines.llamacpp import LlamaCppWorker

    n_ctx = max(p.shape[1] for p in prompts) + output_len + 8
    workers = {}
    try:
        for name, path in files.items():
            workers[name] = LlamaCppWorker(path, threads=threads, n_ctx=n_ctx)
        for w in workers.values():
            w.generate(prompts[0][:, :8], 4)  # warm-up: page the weights in
        runs: dict[str, dict[str, list]] = {n: {"decode": [], "prefill": []} for n in files}
        loads = []
        for i, prompt in enumerate(prompts):
            loads.append(os.getloadavg()[0])
            order = list(workers.items())
            order = order[i % len(order):] + order[:i % len(order)]  # rotate who goes first
            for name, w in order:
                res = w.generate(prompt, output_len)
                runs[name]["decode"].append(1 / res.tpot_s)
                runs[name]["prefill"].append(prompt.shape[1] / res.ttft_s)
            log(f"round {i + 1}/{len(prompts)} (load {loads[-1]:.1f})")
    finally:
        for w in workers.values():
            w.close()
    out = {name: {"decode_tok_s": statistics.median(r["decode"]),
                  "prefill_tok_s": statistics.median(r["prefill"]),
                  "decode_tok_s_runs": r["decode"], "prefill_tok_s_runs": r["prefill"],
                  "peak_rss_mb": workers[name].peak_rss_bytes / 2**20}
           for name, r in runs.items()}
    return {"sides": out, "load_avg_1m_per_round": loads}


def prompts(tokenizer, n: int, input_len: int, seed: int) -> list:  # noqa: ANN001
    """``n`` held-out prompts of ``input_len`` tokens ([1, len] int64 arrays)."""
    from autoplan.quality.text import load_text_dataset

    data = load_text_dataset(None, tokenizer=tokenizer, seq_len=input_len, n_calib=n, n_eval=0,
                             seed=seed + 1)
    return [block[None].numpy() for block in data.calib]


__all__ = ["MIXES", "compute_imatrix", "engine_llamacpp_version", "eval_quality",
           "linear_bits", "llama_tools", "prompts", "quantize", "sha256", "tensor_types",
           "time_sides"]
