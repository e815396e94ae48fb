"""Which KV-cache dtypes the installed vLLM CPU build serves on this machine: its own
attention backend's check (`_get_attn_isa` in vllm/v1/attention/backends/cpu_attn.py, what
`vllm serve --kv-cache-dtype X` runs at load) asked for each dtype, and its answer or its
own error recorded, beside this CPU's AVX-512 / AMX flags.

    python benchmarks/vllm_cpu_kv.py [--out FILE]

The default file is named by the CPU's widest vector unit, since the answer depends on it:
benchmarks/results/vllm_cpu_kv_{amx,avx512,avx2}.json.

Needs `autoplan engines install vllm`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import cpu_flags, start_run, write_result  # noqa: E402

DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")
# vLLM's CPU attention backend picks its kernel (and refuses what it cannot serve) from the
# model dtype, block size, head size and KV dtype: asked with a bf16 model, block 128,
# head_dim 64 (the embedded model's)
PROBE = """
import json, torch
from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
out = {}
for kv in %r:
    try:
        out[kv] = {"ok": True, "kernel": _get_attn_isa(torch.bfloat16, 128, 64, kv)}
    except Exception as e:
        out[kv] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
print("RESULT " + json.dumps(out))
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    info, command = start_run(0, argv)
    from autoplan.engines import engine_python
    from autoplan.errors import AutoplanError

    try:
        exe = engine_python("vllm")
    except AutoplanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    run = subprocess.run([str(exe), "-c", PROBE % (DTYPES,)], capture_output=True, text=True,
                         timeout=600)
    line = next((x for x in run.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        print(f"error: the probe failed: {run.stderr.strip().splitlines()[-1:]}",
              file=sys.stderr)
        return 1
    answers = json.loads(line[len("RESULT "):])
    version = subprocess.run([str(exe), "-c", "import vllm; print(vllm.__version__)"],
                             capture_output=True, text=True, timeout=600).stdout.strip()
    flags = cpu_flags()
    isa = "amx" if flags.get("amx_tile") else "avx512" if flags.get("avx512f") else "avx2"
    out = args.out or f"benchmarks/results/vllm_cpu_kv_{isa}.json"
    doc = {"what": "KV-cache dtypes vLLM's CPU build serves here (its own check, MEASURED)",
           "machine": {**info, "cpu_flags": flags}, "command": command,
           "vllm": version.splitlines()[-1] if version else None,
           "serves": sorted(k for k, v in answers.items() if v["ok"]),
           "refuses": {k: v["error"] for k, v in answers.items() if not v["ok"]},
           "answers": answers}
    write_result(out, doc)
    for k, v in answers.items():
        print(f"  --kv-cache-dtype {k}: " + (f"served ({v['kernel']} kernel)" if v["ok"]
                                              else v["error"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
