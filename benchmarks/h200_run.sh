#!/usr/bin/env bash
# H200 runs in phases, each one device call under the 10-minute limit; logs and JSON under $OUT.
#
#   GIT_REV=$(git rev-parse --short HEAD) bash benchmarks/h200_run.sh PHASE [args...]
#
#   tests    GPU tests (TEST_WORKERS xdist workers, 8) and the plugin tests -> gpu_tests.log
#   kernels  the Triton score kernel's launch sweep, then the attention  -> score_sweep.json, attention_decode.json
#            step of all layers as the server runs it (~5 min; args go to attention_decode.py)
#   server   the SGLang server test: greedy equality, long contexts,    -> server_gpu.log, server logs
#            shared-prefix reuse (~3.5 min)
#   hicache  HiCache with LOCKS: a turn reloaded from host memory, tokens -> hicache_gpu.log, hicache/hicache_server.json,
#            as without HiCache, no stale summary, its TTFT against HiCache     hicache_summary_cost.json
#            without LOCKS; then rebuilding reloaded pages' summaries against copying them (~6 min)
#   build    summary-build benchmark, then the host time of a decode     -> summary_build.json, flush_host_time.log
#            step's summary flush
#   e2e      SGLang decode, FullKV vs --enable-locks (args go to         -> e2e_decode.json, e2e_logs/
#            e2e_decode.py, e.g. --case synthetic:llama8b:1; the whole plan needs ~20 min: split it;
#            run through e2e_host_times.py: the worker logs carry per-step host times)
#   shared   the attention step on shared-prefix batches (stock, cascade, -> attention_shared_prefix.json, ncu.csv,
#            LOCKS, LOCKS with shared runs scored once, prefiltered), then   score_shared_kernels.json,
#            the score kernels' DRAM bytes at Llama 32 x 96K from Nsight      ncu_locks*.csv
#            Compute, and each score launch's time in each mode (~3 min)
#   agents   server throughput under shared-prefix and agent load,       -> agent_serving.json, .png, agent_logs/
#            FullKV vs LOCKS (~8 min; args go to agent_serving.py)
#   soak     starts benchmarks/soak.py detached (it outlives the call:    -> soak_start.log
#            ~10 min with the server's start) and returns; run
#   soak-collect  in the next call, before the machine is given back:     -> soak.json, soak_server.log
#            it waits for the soak and collects it (args of soak go to soak.py, e.g. --mode fullkv)
#   suite    RULER-style long-context tasks on the tiny LM, FullKV vs     -> long_context_suite.json, .log, suite_logs/
#            LOCKS at budgets 256/1024/2048 (~6 min; args go to long_context_suite.py)
#   audit    the recall audit (--locks-audit-every 64) in a tiny-LM       -> audit_server.json, audit_logs/
#            server with CUDA graphs: /metrics shows it, greedy tokens
#            as without it, decode throughput with it vs off (~6 min; args go to audit_server.py)
# GIT_REV is recorded in the JSON headers (the device copy's git metadata can lag the tree).
set -o pipefail
phase=${1:?usage: h200_run.sh tests|kernels|server|hicache|build|e2e|shared|agents|suite|audit|soak|soak-collect [args...]}
shift
source .gpu-kit/install.sh .gpu-kit/kit.tar.xz .gpu-kit/jit-cache.tar.xz || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
export GIT_REV=${GIT_REV:?set GIT_REV to the revision being measured}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt"
case "$phase" in
tests)
    # Triton's JIT dominates a fresh machine: the GPU tests spread over pytest-xdist workers (the image has it);
    # the plugin tests (CPU stand-ins, one child pytest) beside them, their log appended
    python3 -m pytest -q -rs -p no:cacheprovider tests/test_plugin_*.py > "$OUT/plugin_tests.log" 2>&1 &
    plugin_tests=$!
    python3 -m pytest -q -rs -n "${TEST_WORKERS:-8}" tests --ignore-glob='tests/test_server_*gpu.py' \
        --ignore-glob='tests/test_plugin_*.py' 2>&1 | tee "$OUT/gpu_tests.log"
    status=$?; wait $plugin_tests || status=1
    cat "$OUT/plugin_tests.log" >> "$OUT/gpu_tests.log"; rm "$OUT/plugin_tests.log"; exit $status ;;
kernels)
    (cd benchmarks && python3 score_sweep.py --out "$OUT/score_sweep.json") 2>&1 | tee "$OUT/score_sweep.log"
    (cd benchmarks && python3 attention_decode.py --out "$OUT/attention_decode.json" "$@") 2>&1 \
        | tee "$OUT/attention_decode.log" ;;
server)
    mkdir -p "$OUT/server"
    OUT="$OUT/server" python3 -m pytest -q -rs tests/test_server_gpu.py 2>&1 | tee "$OUT/server_gpu.log" ;;
hicache)
    mkdir -p "$OUT/hicache"
    OUT="$OUT/hicache" python3 -m pytest -q -rs -s tests/test_server_hicache_gpu.py 2>&1 | tee "$OUT/hicache_gpu.log"
    python3 benchmarks/hicache_summary_cost.py --out "$OUT/hicache_summary_cost.json" 2>&1 | tee -a "$OUT/hicache_gpu.log" ;;
build)
    (cd benchmarks && python3 summary_build.py --out "$OUT/summary_build.json") 2>&1 | tee "$OUT/summary_build.log"
    python3 benchmarks/flush_host_time.py 2>&1 | tee "$OUT/flush_host_time.log" ;;
e2e)
    # e2e_decode.py, with each step's planning host time in the worker logs
    python3 benchmarks/e2e_host_times.py --out "$OUT/e2e_decode.json" --log-dir "$OUT/e2e_logs" "$@" 2>&1 | tee "$OUT/e2e_decode.log" ;;
shared)
    python3 benchmarks/attention_shared_prefix.py --out "$OUT/attention_shared_prefix.json" "$@" 2>&1 \
        | tee "$OUT/attention_shared_prefix.log"
    case=llama3.1-8b:32:96K:4K
    ncu --clock-control none --metrics dram__bytes_read.sum --kernel-name regex:_score_ --launch-count 2 --csv \
        --page raw --print-units base python3 benchmarks/attention_shared_prefix.py --profile-scoring --case $case \
        > "$OUT/ncu.csv" && python3 benchmarks/attention_shared_prefix.py --out "$OUT/attention_shared_prefix.json" \
        --ncu-csv "$OUT/ncu.csv" --case $case
    # each score launch's time and DRAM bytes in each mode's step (one eager step each)
    for mode in locks locks_shared locks_prefilter; do
        ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size \
            --kernel-name regex:_score_ --launch-count 6 --csv --page raw --print-units base python3 \
            benchmarks/attention_shared_prefix.py --profile-scoring --profile-mode $mode --case $case \
            > "$OUT/ncu_$mode.csv"
    done
    python3 benchmarks/attention_shared_prefix.py --out "$OUT/attention_shared_prefix.json" --case $case \
        --launches-out "$OUT/score_shared_kernels.json" --ncu-launches locks="$OUT/ncu_locks.csv" \
        --ncu-launches locks_shared="$OUT/ncu_locks_shared.csv" \
        --ncu-launches locks_prefilter="$OUT/ncu_locks_prefilter.csv" ;;
agents)
    python3 benchmarks/agent_serving.py --out "$OUT/agent_serving.json" --log-dir "$OUT/agent_logs" "$@" 2>&1 \
        | tee "$OUT/agent_serving.log"
    python3 benchmarks/agent_serving.py --plot "$OUT/agent_serving.json" ;;
soak)
    rm -rf /tmp/soak && mkdir -p /tmp/soak
    (cd benchmarks && setsid nohup python3 soak.py --model ../.gpu-kit/llama8b-dummy --duration 490 \
        --out /tmp/soak/soak.json --log-dir /tmp/soak "$@" > /tmp/soak/run.log 2>&1 < /dev/null &)
    sleep 5; cat /tmp/soak/run.log | tee "$OUT/soak_start.log" ;;
soak-collect)
    while pgrep -f "soak.py --model" > /dev/null; do sleep 5; done
    cp /tmp/soak/soak.json "$OUT/" 2>/dev/null || echo "no soak.json: see soak_run.log" >&2
    cp /tmp/soak/run.log "$OUT/soak_run.log"
    tail -n 400 /tmp/soak/server_soak_*.log > "$OUT/soak_server.log" ;;
suite)
    # one server per configuration; every LOCKS decode step sparse (the default would decode these short batches densely)
    locks="--enable-locks --locks-min-step-tokens 0 --locks-token-budget"
    python3 benchmarks/long_context_suite.py --model benchmarks/models/tiny-llama-pycode --styles ruler,python \
        --samples 12 --common-flags "--attention-backend flashinfer --page-size 16 --mem-fraction-static 0.5" \
        --config "dense=" --config "locks budget 256=$locks 256" --config "locks budget 1024=$locks 1024" \
        --config "locks budget 2048=$locks 2048" --out "$OUT/long_context_suite.json" --log-dir "$OUT/suite_logs" \
        "$@" 2>&1 | tee "$OUT/long_context_suite.log" ;;
audit)
    # the recall audit in a server (tiny LM, CUDA graphs): /metrics, greedy tokens and decode speed, N=64 vs off
    python3 -c "import prometheus_client" || { echo "audit: prometheus_client missing (--enable-metrics)" >&2; exit 1; }
    python3 benchmarks/audit_server.py --out "$OUT/audit_server.json" --log-dir "$OUT/audit_logs" "$@" 2>&1 \
        | tee "$OUT/audit_server.log" ;;
*)
    echo "unknown phase $phase" >&2; exit 2 ;;
esac
