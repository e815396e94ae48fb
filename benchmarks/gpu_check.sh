#!/usr/bin/env bash
# The prepared GPU check for a lent H200 (docs/gpu.md): one device call, sections ordered by
# value and time-boxed inside --budget-s (default 520 s, under the 600 s call limit; 1800 s
# with --cpu-smoke), results written after every section to $OUT/gpu_check.json (+
# cost_table.json, gpu_check.log).
# Usage: bash benchmarks/gpu_check.sh [--cpu-smoke] [--budget-s S] [--sections a,b,..]
# It installs nothing: the device command (benchmarks/gpu_kit.sh prints it) installs the kit
# (.whl/) into a --target folder and puts it on PYTHONPATH first. Runs from the source tree:
# autoplan is imported from here, with backends/ and search_spaces/ linked into autoplan/
# as setup.py maps them when no installed autoplan provides them.
set -u
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-./gpu_results}"
mkdir -p "$OUT_DIR"
PY="${PYTHON:-$(command -v python3 || command -v python)}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -c "import autoplan.backends, autoplan.search_spaces" 2>/dev/null; then
  for sub in backends search_spaces; do
    [ -e "autoplan/$sub" ] || ln -s "../$sub" "autoplan/$sub"
  done
fi
command -v nvidia-smi >/dev/null && nvidia-smi > "$OUT_DIR/nvidia-smi.txt" 2>&1

budget=520
case " $* " in *" --cpu-smoke "*) budget=1800 ;; esac  # gpu_check.py's defaults
prev=""
for a in "$@"; do
  [ "$prev" = "--budget-s" ] && budget="$a"
  prev="$a"
done
# The orchestrator keeps to the budget itself; this hard stop is the last resort.
timeout --signal=TERM --kill-after=15 "$(( ${budget%.*} + 30 ))" \
  "$PY" benchmarks/gpu_check.py --out "$OUT_DIR" "$@" 2>&1 | tee "$OUT_DIR/gpu_check.log"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 124 ] && echo "gpu_check hit its hard stop; partial results in $OUT_DIR/gpu_check.json"
exit "$rc"
