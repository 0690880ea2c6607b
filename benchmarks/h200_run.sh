#!/usr/bin/env bash
# H200 runs in phases, each one device call under the 10-minute limit; logs and JSON under $OUT.
#
#   GIT_REV=$(git rev-parse --short HEAD) bash benchmarks/h200_run.sh PHASE [args...]
#
#   tests    GPU tests of the core library (~3 min)                     -> gpu_tests.log
#   kernels  score-kernel sweep, then the attention step of all layers  -> score_sweep.json, attention_decode.json
#            with each shape's fastest score kernel (~5 min; args go to attention_decode.py)
#   server   the SGLang server test: greedy equality, long contexts,    -> server_gpu.log, server logs
#            shared-prefix reuse (~3.5 min)
#   build    summary-build benchmark, then the host time of a decode     -> summary_build.json, flush_host_time.log
#            step's summary flush
#   e2e      SGLang decode, FullKV vs --enable-locks (args go to         -> e2e_decode.json, e2e_logs/
#            e2e_decode.py, e.g. --case synthetic:llama8b:1; the whole plan needs ~20 min: split it;
#            run through e2e_host_times.py: the worker logs carry per-step host times)
# GIT_REV is recorded in the JSON headers (the device copy's git metadata can lag the tree).
set -o pipefail
phase=${1:?usage: h200_run.sh tests|kernels|server|build|e2e [args...]}
shift
source .gpu-kit/install.sh .gpu-kit/kit.tar.xz .gpu-kit/jit-cache.tar.xz || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
export GIT_REV=${GIT_REV:?set GIT_REV to the revision being measured}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt"
case "$phase" in
tests)
    python3 -m pytest -q -rs tests --ignore=tests/test_server_gpu.py 2>&1 | tee "$OUT/gpu_tests.log" ;;
kernels)
    (cd benchmarks && python3 score_sweep.py --out "$OUT/score_sweep.json") 2>&1 | tee "$OUT/score_sweep.log"
    (cd benchmarks && python3 attention_decode.py --out "$OUT/attention_decode.json" \
        --score-options-from "$OUT/score_sweep.json" "$@") 2>&1 | tee "$OUT/attention_decode.log" ;;
server)
    mkdir -p "$OUT/server"
    OUT="$OUT/server" python3 -m pytest -q -rs tests/test_server_gpu.py 2>&1 | tee "$OUT/server_gpu.log" ;;
build)
    (cd benchmarks && python3 summary_build.py --out "$OUT/summary_build.json") 2>&1 | tee "$OUT/summary_build.log"
    python3 benchmarks/flush_host_time.py 2>&1 | tee "$OUT/flush_host_time.log" ;;
e2e)
    # e2e_decode.py, with each step's planning host time in the worker logs
    python3 benchmarks/e2e_host_times.py --out "$OUT/e2e_decode.json" --log-dir "$OUT/e2e_logs" "$@" 2>&1 | tee "$OUT/e2e_decode.log" ;;
*)
    echo "unknown phase $phase" >&2; exit 2 ;;
esac
