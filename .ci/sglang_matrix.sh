#!/usr/bin/env bash
# CI, CPU only: the plugin tests and the hook check on every SGLang release the plugin supports
# (sglang_locks/plugin/compat.py) other than the default one, which .ci/run tests. One venv per release, installed
# as .ci/run installs (SGLang and its CPU pins without their dependencies). Ends with one line "N passed, M failed"
# (releases); exits 1 if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
WORK=${SGLANG_MATRIX_DIR:-${TMPDIR:-/tmp}/sglang-matrix}
PINS=tests/requirements-sglang-cpu.txt
TESTS=(tests/test_plugin_args.py tests/test_plugin_store.py tests/test_plugin_hicache.py tests/test_plugin_load.py tests/test_plugin_memory.py
       tests/test_plugin_graph_variants.py tests/test_plugin_versions.py)

DEFAULT=$(sed -n 's/^sglang==//p' "$PINS")
VERSIONS=$(python3 -c '
import importlib.util as u
spec = u.spec_from_file_location("compat", "sglang_locks/plugin/compat.py")
compat = u.module_from_spec(spec)
spec.loader.exec_module(compat)
print(*compat.SUPPORTED_SGLANG_VERSIONS)')

# The default pins with this release'\''s own lines (tests/requirements-sglang-cpu-V.txt, where its pins differ)
# in place of the same packages' lines.
pins_for() {
    python3 - "$PINS" "tests/requirements-sglang-cpu-$1.txt" "$1" <<'EOF'
import os, re, sys

def name(line):
    return re.sub(r"[-_.]+", "-", line.split("==")[0]).lower()

def pins(path):
    with open(path) as f:
        return [l.strip() for l in f if l.strip() and not l.startswith("#")]

default, own, version = sys.argv[1:]
override = {name(l): l for l in (pins(own) if os.path.exists(own) else [f"sglang=={version}"])}
print("\n".join(override.get(name(l), l) for l in pins(default)))
EOF
}

HOOK_CHECK='
import sys; sys.path.insert(0, "tests")
import sglang_cpu_env; sglang_cpu_env.install()
from sglang.srt.plugins import load_plugins
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang_locks.plugin import HOOKS, optional_hooks
load_plugins()
targets = [t for t, _, _ in (*HOOKS, *optional_hooks())]
missing = [t for t in targets if t not in HookRegistry._patched]
print(f"hooks: {len(targets) - len(missing)} of {len(targets)} applied", *missing, sep="\n  ")
sys.exit(1 if missing else 0)'

# One venv installed as .ci/run installs it (the default SGLang and pins); each release's venv starts as hard links
# to it (pip replaces files, it never writes into one) and gets its own SGLang and the pins that differ.
BASE=$WORK/base
rm -rf "$BASE" && mkdir -p "$WORK" &&
python3 -m venv "$BASE" &&
"$BASE/bin/python" -m pip install -q --upgrade pip &&
"$BASE/bin/python" -m pip install -q torch==2.13.0 -e '.[test]' &&
"$BASE/bin/python" -m pip install -q --no-deps -r "$PINS" || { echo "base venv: install failed"; exit 1; }

passed=0 failed=0
for v in $VERSIONS; do
    [ "$v" = "$DEFAULT" ] && continue
    echo "=== SGLang $v"
    start=$SECONDS
    venv=$WORK/$v
    rm -rf "$venv"
    if cp -al "$BASE" "$venv" && pins_for "$v" > "$WORK/pins-$v.txt" &&
        "$venv/bin/python" -m pip install -q --no-deps -r "$WORK/pins-$v.txt" &&
        "$venv/bin/python" -W ignore -c "$HOOK_CHECK" &&
        SGLANG_LOCKS_TEST_ENV=sglang "$venv/bin/python" -m pytest -q -rf -p no:cacheprovider --disable-warnings \
            "${TESTS[@]}"; then
        passed=$((passed + 1)); echo "SGLang $v: passed ($((SECONDS - start)) s)"
    else
        failed=$((failed + 1)); echo "SGLang $v: FAILED ($((SECONDS - start)) s)"
    fi
    rm -rf "$venv"
done
echo "$passed passed, $failed failed"
[ $failed = 0 ]
