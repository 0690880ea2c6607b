# H200: one e2e_decode.py case with this tree's package against a copy of it whose named files are replaced
# (earlier versions of kernels), installed in turn: base, head, base, head. Run from the repository root:
#
#   bash research/e2e_kernels_ab.sh OUT_DIR CASE kernels/FILE=VERSION_FILE [...]
#
# e.g. CASE synthetic:glm4-9b-1m:1:1047552 or interleaved:glm4-9b-1m:1:1047552. Each run writes
# OUT_DIR/e2e_{base,head}_N.json (GIT_REV names the head; the base is labelled "GIT_REV-base").
set -e
out=$1 case=$2
shift 2
root=$(pwd)
rm -rf /tmp/e2e_base && mkdir -p /tmp/e2e_base "$out"
tar --exclude=./.gpu-kit -cf - . | tar -xf - -C /tmp/e2e_base
for swap in "$@"; do cp "${swap#*=}" "/tmp/e2e_base/${swap%%=*}"; done
n=0
for v in base head base head; do
  n=$((n + 1))
  dir=$root; rev=$GIT_REV
  if [ $v = base ]; then dir=/tmp/e2e_base; rev=$GIT_REV-base; fi
  (cd "$dir" && python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1)
  GIT_REV=$rev timeout 120 python3 benchmarks/e2e_decode.py --out "$out/e2e_${v}_$n.json" --log-dir "/tmp/e2e_logs_$n" \
    --timeout 100 --case "$case" 2>&1 | grep -E "e2e_decode: (synthetic|interleaved)" | sed "s/^/$v /" || true
done
(cd "$root" && python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1)
