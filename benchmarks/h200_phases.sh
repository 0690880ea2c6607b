#!/usr/bin/env bash
# Several h200_run.sh phases in one device call, each under its own time limit, their outputs in one tarball
# (a device call brings back at most 8 files; phases write more):
#
#   GIT_REV=$(git rev-parse --short HEAD) bash benchmarks/h200_phases.sh "PHASE [args...]" LIMIT_S ["PHASE ..." LIMIT_S ...]
#
# A phase is read as a shell reads a command line: "agents --agentic-concurrency ''" passes an empty value.
#
# Phase i writes under $OUT/work/pI_PHASE/ (its output in phase.log); after each phase $OUT/results.tgz holds all
# of them so far, so a call cut short still returns the finished phases; $OUT/phases.txt lists each one's exit
# status and seconds. Keep the limits' sum inside the call's.
set -u
final=${OUT:?set OUT}
mkdir -p "$final/work"
i=0
while [ $# -ge 2 ]; do
    spec=$1 limit=$2
    shift 2
    i=$((i + 1))
    dir="$final/work/p${i}_${spec%% *}"
    mkdir -p "$dir"
    start=$(date +%s)
    # a phase's words as a shell reads them: quotes inside it hold (e.g. --agentic-concurrency '')
    OUT="$dir" eval "timeout \"\$limit\" bash benchmarks/h200_run.sh $spec" > "$dir/phase.log" 2>&1
    echo "phase $i: $spec: rc=$? in $(( $(date +%s) - start )) s" | tee -a "$final/work/phases.txt"
    tail -n 5 "$dir/phase.log"
    tar czf "$final/results.tgz.tmp" -C "$final" work && mv "$final/results.tgz.tmp" "$final/results.tgz"
done
[ $# -eq 0 ] || echo "h200_phases.sh: '$1' has no time limit: not run" >&2
cp "$final/work/phases.txt" "$final/phases.txt"
rm -rf "$final/work"
