#!/usr/bin/env bash
# Rehearse the GPU check here, the way a lent H200 runs it (docs/gpu.md):
#   1. a Python 3.12 env holding only the device image's packages (benchmarks/gpu_image.txt),
#      at the image's versions where known: torch 2.11.0 from PyPI (the CUDA 13 build, which
#      runs on CPU; no CPU build of 2.11 is reachable here), triton 3.6.0, transformers 5.17.0;
#      cached under $AUTOPLAN_REHEARSAL_CACHE (default ~/.cache/autoplan-gpu-rehearsal);
#   2. the kit (benchmarks/gpu_kit.sh: .whl/ and .gpu_model/);
#   3. a copy of the working tree as the device gets it (tracked + untracked-not-ignored files
#      + the carried folders), in which the exact device command runs with --cpu-smoke:
#      `pip install --no-index --no-deps --target .site .whl/*.whl`, PYTHONPATH, gpu_check.sh.
# Passes when every section ran on CPU and gpu_check.json says so.
# Usage: bash benchmarks/gpu_rehearsal.sh [--env-only] [--keep]
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${AUTOPLAN_REHEARSAL_CACHE:-$HOME/.cache/autoplan-gpu-rehearsal}
PY312=${PYTHON312:-}
if [ -z "$PY312" ]; then  # a pyenv shim may exist and still refuse: ask it for its version
  for c in python3.12 "$HOME/.pyenv/versions/3.12.1/bin/python"; do
    if "$c" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
      PY312=$(command -v "$c"); break
    fi
  done
fi
ENV_ONLY=0 KEEP=0
for a in "$@"; do
  case "$a" in
    --env-only) ENV_ONLY=1 ;;
    --keep) KEEP=1 ;;
    *) echo "error: unknown option $a (use --env-only or --keep)" >&2; exit 2 ;;
  esac
done
[ -n "$PY312" ] && [ -x "$PY312" ] || { echo "error: no Python 3.12 found; set PYTHON312=/path/to/python3.12" >&2; exit 2; }
t_start=$(date +%s)

# What autoplan and the check import from the image (the rest of the image is not needed to
# rehearse). Versions come from gpu_image.txt where it knows them; pip picks the others.
NEEDED="torch triton transformers tokenizers huggingface-hub safetensors accelerate numpy scipy
onnx onnxruntime click rich ml-dtypes psutil pytest pytest-timeout nvidia-ml-py pyyaml requests tqdm packaging
jinja2 markupsafe sympy networkx filelock fsspec regex typer"
pins=()
for name in $NEEDED; do
  pin=$(sed 's/ *#.*//' "$REPO/benchmarks/gpu_image.txt" | grep -E "^$name(==|$)" || true)
  [ -n "$pin" ] || { echo "error: $name is not in benchmarks/gpu_image.txt: the image lacks it" >&2; exit 1; }
  pins+=("$pin")
done
key=$( (printf '%s\n' "${pins[@]}"; "$PY312" --version) | sha256sum | cut -c1-12)
ENV="$CACHE/env-$key"
if [ ! -f "$ENV/.complete" ]; then
  echo "== building the rehearsal env $ENV (first time: ~3 GB of wheels, several minutes)"
  rm -rf "$ENV"
  mkdir -p "$CACHE"
  "$PY312" -m venv "$ENV"
  "$ENV/bin/python" -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
  "$ENV/bin/python" -m pip install -q "${pins[@]}" 2>&1 | grep -v "^WARNING: Location" || true
  "$ENV/bin/python" -c "import torch, triton, transformers; print('torch', torch.__version__)"
  # Only the image's packages: anything pip pulled in that the image lacks fails the rehearsal.
  "$ENV/bin/python" -I - "$REPO/benchmarks/gpu_image.txt" <<'PY'
import importlib.metadata as m, re, sys
image = {l.split("#")[0].strip().split("==")[0] for l in open(sys.argv[1]) if l.split("#")[0].strip()}
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
extra = sorted({norm(d.metadata["Name"]) for d in m.distributions()} - {norm(n) for n in image}
               - {"pip", "setuptools", "wheel"})
if extra:
    sys.exit(f"error: the rehearsal env holds packages the device image lacks: {extra}")
PY
  touch "$ENV/.complete"
fi
echo "== rehearsal env: $ENV ($("$ENV/bin/python" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)'))"
[ "$ENV_ONLY" = 1 ] && exit 0

# The kit, with the same interpreter the device has (3.12).
PYTHON="$ENV/bin/python" bash "$REPO/benchmarks/gpu_kit.sh" --quiet

# The working tree as the device receives it: tracked and untracked-not-ignored files, plus
# the carried folders; then the device command, verbatim but for --cpu-smoke.
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-rehearsal.XXXXXX")
trap '[ "$KEEP" = 1 ] || rm -rf "$WORK"' EXIT
(cd "$REPO" && { git ls-files -co --exclude-standard -z; printf '%s\0' .whl .gpu_model; } \
  | tar --null -T - -cf - ) | (mkdir -p "$WORK/tree" && cd "$WORK/tree" && tar -xf -)
mkdir -p "$WORK/out"
cmd=$(bash "$REPO/benchmarks/gpu_kit.sh" --print-command .site --cpu-smoke)
echo "== device command: $cmd"
t_check=$(date +%s)
# the device's plain python3 is its torch env's: here the rehearsal env's bin/ comes first
(cd "$WORK/tree" && env -i HOME="$HOME" PATH="$ENV/bin:/usr/bin:/bin" OUT="$WORK/out" \
   bash -c "$cmd") 2>&1 | tee "$WORK/device.log" | tail -40
echo "== checking $WORK/out/gpu_check.json"
"$ENV/bin/python" - "$WORK/out/gpu_check.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
bad = {n: s.get("reason", s["status"]) for n, s in doc["sections"].items() if s["status"] != "ok"}
print({n: s["status"] for n, s in doc["sections"].items()})
if bad or not doc.get("complete"):
    sys.exit(f"rehearsal FAILED: {bad or 'the check did not finish'}")
PY
t_end=$(date +%s)
echo "rehearsal passed: check $((t_end - t_check)) s, total $((t_end - t_start)) s (out: $WORK/out)"
[ "$KEEP" = 1 ] && echo "kept: $WORK"
exit 0
