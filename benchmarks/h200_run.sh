#!/usr/bin/env bash
# One device call: GPU tests, summary-build and attention-step benchmarks; logs and JSON under $OUT.
# Usage on the H200 (see README): GIT_REV=<rev> bash benchmarks/h200_run.sh [attention_decode.py args...]
set -o pipefail
source .gpu-kit/install.sh .gpu-kit/kit.tar.xz .gpu-kit/jit-cache.tar.xz || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt"
python3 -m pytest -q -rs tests 2>&1 | tee "$OUT/gpu_tests.log"
python3 benchmarks/summary_build.py --out "$OUT/summary_build.json" 2>&1 | tee "$OUT/summary_build.log"
python3 benchmarks/attention_decode.py --out "$OUT/attention_decode.json" "$@" 2>&1 | tee "$OUT/attention_decode.log"
