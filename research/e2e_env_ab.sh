# H200: one e2e_decode.py case in four processes in a row, alternating this tree's default settings (head) with
# environment settings NAME=VALUE ... (base): head, base, head, base. Run from the repository root:
#
#   GIT_REV=REV bash research/e2e_env_ab.sh OUT_DIR CASE NAME=VALUE [...]
#
# e.g. ... OUT interleaved:llama8b:1:131072,262144 SGLANG_LOCKS_PDL=attend,merge. Each run writes
# OUT_DIR/e2e_{head,base}_N.json.
out=$1 case=$2
shift 2
mkdir -p "$out"
n=0
for v in head base head base; do
  n=$((n + 1))
  settings=()
  if [ $v = base ]; then settings=("$@"); fi
  env "${settings[@]}" GIT_REV="$GIT_REV-$v" timeout 135 python3 benchmarks/e2e_decode.py \
    --out "$out/e2e_${v}_$n.json" --log-dir "/tmp/e2e_logs_$n" --timeout 125 --case "$case" 2>&1 \
    | grep -E "e2e_decode: (synthetic|interleaved)" | sed "s/^/$v $n /"
done
