#!/usr/bin/env bash
# Issue 4 on one H200, one phase per device call (each stays under the 10-minute command limit).
#
#   bash benchmarks/tiny_lm/run_h200.sh train     # ~9 min: corpus, training (TRAIN_MINUTES=8), held-out loss,
#                                                 # dense retrieval check
#       -> $OUT/tiny-llama-pycode.tar.gz (model dir: weights, tokenizer, card, train_log.json), $OUT/train.log
#   (on the CPU machine: tar -xzf tiny-llama-pycode.tar.gz -C benchmarks/models/, so the next phases carry it)
#   bash benchmarks/tiny_lm/run_h200.sh measure   # ~3-4 min: recall/error, loss, retrieval, low-rank
#       -> $OUT/tiny_lm_measure.json, $OUT/measure.log
#   bash benchmarks/tiny_lm/run_h200.sh serve     # ~3 min: transformers load check, retrieval via SGLang server
#       -> $OUT/check_hf.json, $OUT/retrieval_server.json, $OUT/serve.log.tar.gz
#
# Env: OUT (default /tmp/out), MODEL (default benchmarks/models/tiny-llama-pycode), TRAIN_MINUTES,
# TRAIN_ARGS / MEASURE_ARGS / SERVE_ARGS (more flags), MEASURE_TIMEOUT (s), LOCKS_BUDGETS (serve: e.g. 256,2048
# once --enable-locks exists). Without nvidia-smi (a CPU smoke run) the GPU kit is not installed.
set -o pipefail
phase=${1:?usage: run_h200.sh train|measure|serve}
OUT=${OUT:-/tmp/out}
NAME=tiny-llama-pycode
MODEL=${MODEL:-benchmarks/models/$NAME}
WORK=${WORK:-/tmp/tiny_lm_work}
mkdir -p "$OUT" "$WORK"
t0=$(date +%s)
say() { echo "[run_h200 +$(( $(date +%s) - t0 ))s] $*"; }

if command -v nvidia-smi >/dev/null; then
    source .gpu-kit/install.sh .gpu-kit/kit.tar.xz .gpu-kit/jit-cache.tar.xz || exit 1
    python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
fi
say "phase $phase, git ${GIT_REV:-$(git rev-parse --short HEAD 2>/dev/null)}"

case "$phase" in
train)
    {
        python3 -m benchmarks.tiny_lm.train --out "$WORK" --name "$NAME" --minutes "${TRAIN_MINUTES:-8}" $TRAIN_ARGS \
            && tar -C "$WORK" -czf "$OUT/$NAME.tar.gz" "$NAME" \
            && ls -l "$WORK/$NAME"
    } 2>&1 | tee "$OUT/train.log"
    ;;
measure)
    timeout "${MEASURE_TIMEOUT:-540}" python3 -m benchmarks.tiny_lm.measure --model "$MODEL" \
        --out "$OUT/tiny_lm_measure.json" $MEASURE_ARGS 2>&1 | tee "$OUT/measure.log"
    say "measure exit ${PIPESTATUS[0]}" | tee -a "$OUT/measure.log"
    ;;
serve)
    mkdir -p "$WORK/serve"
    python3 -m benchmarks.tiny_lm.check_hf --model "$MODEL" 2>&1 | tee "$OUT/check_hf.json"
    say "transformers check exit ${PIPESTATUS[0]}"
    python3 -m benchmarks.tiny_lm.retrieval_server --model "$MODEL" --out "$OUT/retrieval_server.json" \
        --log-dir "$WORK/serve" --locks-budgets "${LOCKS_BUDGETS:-}" $SERVE_ARGS 2>&1 | tee "$WORK/serve/client.log"
    say "server retrieval exit ${PIPESTATUS[0]}" | tee -a "$WORK/serve/client.log"
    tar -C "$WORK" -czf "$OUT/serve.log.tar.gz" serve
    ;;
*)
    echo "unknown phase $phase (train|measure|serve)" >&2
    exit 2
    ;;
esac
say "done"
