#!/usr/bin/env bash
# One prepared GPU check for a lent H200, sized to one device call (<= 570 s, under the 600 s
# per-call limit; a task's whole device budget is 15 min including the machine's start):
# layer microbenchmarks + decode speed (<= 300 s), then a streamed profile of an 8B shape
# (<= 250 s). Run the two halves in separate calls with --skip-stream / --stream-only.
# Usage: bash benchmarks/gpu_check.sh [--cpu-smoke] [--budget-s S] [--skip-stream|--stream-only]
# Results go to $OUT (the device runner's output folder) or ./gpu_results. Installs nothing:
# it needs torch with CUDA, triton and transformers already present, and reports what is missing.
set -u
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-./gpu_results}"
mkdir -p "$OUT_DIR"
PY="${PYTHON:-$(command -v python3 || command -v python)}"

echo "== imports"
"$PY" - <<'PYEOF' 2>&1 | tee "$OUT_DIR/imports.txt"
import importlib
for name in ("torch", "triton", "transformers"):
    try:
        mod = importlib.import_module(name)
        print(f"{name:13} {mod.__version__}")
    except Exception as err:  # report, let gpu_check.py decide what still runs
        print(f"{name:13} MISSING ({type(err).__name__}: {err})")
try:
    import torch
    print("cuda         ", torch.cuda.is_available(), torch.version.cuda,
          torch.cuda.get_device_name() if torch.cuda.is_available() else "")
except Exception as err:
    print("cuda          unknown:", err)
PYEOF
command -v nvidia-smi >/dev/null && nvidia-smi > "$OUT_DIR/nvidia-smi.txt" 2>&1

rc=0
case " $* " in
  *" --stream-only "*) echo "== gpu_check: skipped (--stream-only)" ;;
  *)
    echo "== gpu_check"
    # hard stop at 300 s: the script's own guard (280 s) should end it first; results are
    # written after every section, so a kill still leaves what was measured
    ARGS=()
    for a in "$@"; do [ "$a" != "--skip-stream" ] && ARGS+=("$a"); done
    timeout --signal=TERM --kill-after=10 300 "$PY" benchmarks/gpu_check.py --budget-s 280 \
      --out "$OUT_DIR" "${ARGS[@]}"
    rc=$?
    [ "$rc" -eq 124 ] && echo "gpu_check hit the 300 s hard limit; partial results in $OUT_DIR" ;;
esac

# Streamed profile of a Llama-3.1-8B-shaped random model on the GPU (issue 10 goal: <= 5 min,
# <= 40 GB GPU): builds the bf16 checkpoint on the GPU (~16 GB of disk), then times
# `autoplan profile --device cuda --execution stream` and reads its peak GPU memory.
# Skipped with --cpu-smoke or --skip-stream, or without a GPU.
case " $* " in
  *" --cpu-smoke "*|*" --skip-stream "*) echo "== stream 8b: skipped" ;;
  *)
    if "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
      echo "== stream 8b"
      timeout --signal=TERM --kill-after=10 250 "$PY" benchmarks/scale.py --gpu \
        --shape llama-3.1-8b --execution stream --out "$OUT_DIR/stream_8b.json" \
        2>&1 | tee "$OUT_DIR/stream_8b.log"
    else
      echo "== stream 8b: skipped (no CUDA device)"
    fi ;;
esac
exit "$rc"
