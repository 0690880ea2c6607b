"""The GPU builds of the score, selection and sparse decode kernels (sm_90), checked on any machine with Triton's
bundled ptxas.

CI has no GPU: the Triton interpreter runs the kernels there, so the code that
only a GPU compiles (inline PTX conversions, the SFU log2) is built here for
the H200 in a child process without TRITON_INTERPRET.
"""

import os
import subprocess
import sys

import pytest

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
BUILD = """
import sys
sys.path.insert(0, {benchmarks!r})
import score_sass
module = score_sass.load_module(None)
for terms in ("full", "candidates", "estimate"):
    kernel = score_sass.compile_score_kernel(module, {group}, {kv_heads}, {conversion!r}, terms=terms,
                                             block_pages=module.score_launch({group}, True, terms, 2)[0])
    ptx, cubin = kernel.asm["ptx"], kernel.asm["cubin"]
    print("lg2.approx.f32" in ptx, "0xF0F0F0F0" in ptx, "0x64086408" in ptx, len(cubin) > 0)
"""


@pytest.mark.parametrize("group, kv_heads, conversion", [(4, 8, "int8"), (4, 8, "ptx"), (16, 2, "ptx"), (16, 2, "int8"),
                                                         (7, 4, "int8"), (5, 8, "ptx")])
def test_score_kernel_builds_for_sm90(group, kv_heads, conversion):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = BUILD.format(benchmarks=BENCHMARKS, group=group, kv_heads=kv_heads, conversion=conversion)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    launches = [line.split() for line in out.stdout.splitlines()]
    assert len(launches) == 3  # full, candidates, a rank-2 estimate
    for sfu_log2, int4_to_int8, int4_to_f16, built in launches:
        assert built == "True"
        assert sfu_log2 == "True"  # log2 on the SFU, not libdevice
        assert int4_to_int8 == str(conversion == "int8")  # the nibble shift in PTX on the int8 path only
        assert int4_to_f16 == str(conversion == "ptx")  # the magic-number conversion on the ptx path only


SELECT_COMPILE = """
import math
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from sglang_locks.kernels import page_selection as m


def build(index, **consts):
    # _select_kernel for sm_90: G = 4 and one PAGE_BLOCK tile unless consts say otherwise, writing the step's keys
    # and values (as in SGLang); seq_lens and request indices of type index
    consts = {**dict(HKV=8, G=4, BLOCK_N=128, BLOCK_SLICE=16, SPLIT=0, MASS=0, PAGE=16, BLOCK=m.PAGE_BLOCK,
                     SMALL=m.PAGE_BLOCK, TILES=1, PARTS_P2=8, MODE=0, PHASE=0, SYNC=True, STAGE=0, PDL=1,
                     WRITE_KV=1, D=128), **consts}
    consts.update(BLOCK_G=consts["G"], LOG_G=math.log(consts["G"]))
    names = m._select_kernel.arg_names
    floats = ("scores_ptr", "part_max_ptr", "part_sum_ptr", "slice_max_ptr", "slice_sum_ptr")
    sig = {n: "constexpr" if n in consts else "*fp32" if n in floats else "*fp64" if n == "mass_ptr"
           else index if n in ("seq_lens_ptr", "req_pool_ptr")
           else "*i32" if n.endswith("_ptr") else "i32" for n in names}
    src = ASTSource(fn=m._select_kernel, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=m.SELECT_WARPS))
"""

SELECT_BUILD_LOOP = """
import itertools
# pages to entries, to a candidate list; candidates to entries; with a small tile for short rows or not; a
# program's span in one tile or several; the score partials merged whole or in slices (a second barrier), or
# each head's mass from the score kernel
configs = [(*c, 0, 0) for c in itertools.product((0, 1, 2), (m.PAGE_BLOCK, m.PAGE_BLOCK // 4), (1, 2))]
for stage, small, tiles, split, mass in configs + [(0, m.PAGE_BLOCK // 4, 1, 1, 0), (1, m.PAGE_BLOCK, 2, 1, 0),
                                                   (0, m.PAGE_BLOCK, 1, 0, m.MASS_SLOTS)]:
    ptx = build({index!r}, SPLIT=split, MASS=mass, SMALL=small, TILES=tiles, STAGE=stage).asm["ptx"]
    print("atom.global.gpu.acq_rel.add" in ptx, "ld.global.gpu.acquire" in ptx, "ld.global.cg" in ptx,
          "griddepcontrol.wait" in ptx)
"""


@pytest.mark.parametrize("index", ["*i32", "*i64"])
def test_selection_kernel_builds_for_sm90_with_its_row_barrier(index):
    """The spin barrier only exists in the GPU build (the interpreter runs the phases as launches). int64: SGLang's
    seq_lens and request indices."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = SELECT_COMPILE + SELECT_BUILD_LOOP.format(index=index)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    builds = [line.split() for line in out.stdout.splitlines()]
    assert len(builds) == 15
    for release, acquire, l2_loads, waits in builds:
        assert waits == "True"  # programmatic dependent launch: nothing read before the scores are complete
        assert release == "True"  # arrival publishes the program's stores at GPU scope (and acquires the others')
        assert acquire == "True"  # the wait reads the counter with acquire semantics
        assert l2_loads == "True"  # other programs' histograms are read from L2, not a stale L1


SELECT_REGISTERS = SELECT_COMPILE + """
import re, subprocess, tempfile
from triton import knobs
for group, tile, split, mass in ((1, 512, 0, 0), (1, 1024, 0, 0), (1, 2048, 0, 0), (2, 2048, 0, 0), (4, 512, 0, 0),
                                 (4, 1024, 0, 0), (4, 2048, 0, 0), (8, 512, 0, 0), (16, 512, 1, 0), (16, 512, 0, 0),
                                 (16, 512, 0, m.MASS_SLOTS)):
    for stage in (0, 2):
        k = build("*i64", G=group, SPLIT=split, MASS=mass, BLOCK=tile, SMALL=tile if group >= 8 else tile // 4,
                  PARTS_P2=32, STAGE=stage)
        with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
            f.write(k.asm["ptx"])
            f.flush()
            info = subprocess.run([knobs.nvidia.ptxas.path, "-arch=sm_90a", "-v", f.name, "-o", "/dev/null"],
                                  capture_output=True, text=True, check=True).stderr
        regs = int(re.search(r"Used (\\d+) registers", info).group(1))
        print(group, tile, split, stage, regs, m.resident_programs(tile, group))
"""


def test_selection_programs_fit_the_sm_as_resident_programs_says():
    """selection_parts sizes the grid by resident_programs: at the registers ptxas gives each tile (allocated per
    warp in steps of 8 per thread), that many programs of SELECT_WARPS warps fit in an SM's 64K registers."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", SELECT_REGISTERS], env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    builds = [list(map(int, line.split())) for line in out.stdout.splitlines()]
    assert len(builds) == 22
    for group, tile, split, stage, regs, resident in builds:
        assert -(-regs // 8) * 8 * 32 * 4 * resident <= 65536, (group, tile, split, stage, regs, resident)


GLUON_BUILD = """
import sys
sys.path.insert(0, {benchmarks!r})
import score_sass
k = score_sass.compile_gluon_kernel({group}, 8 if {group} <= 4 else 2, {index!r}, {heads_on_rows})
ptx = k.asm["ptx"]
stores = [line for line in ptx.splitlines() if "st.global" in line]
print("cp.async.cg.shared.global" in ptx, "m16n8k32" in ptx and ".s32.s8.s8.s32" in ptx, len(k.asm["cubin"]) > 0,
      ptx.index("cp.async") < ptx.index("griddepcontrol.wait") < ptx.index("st.global"),
      "griddepcontrol.launch_dependents" in ptx,
      bool(stores) and all("L2::cache_hint" in line for line in stores), "createpolicy.fractional.L2::evict_last" in ptx,
      ("atom.global.gpu.relaxed.add.f64" in ptx) == ({group} >= 8))
"""


@pytest.mark.parametrize("group, heads_on_rows", [(4, False), (16, False), (16, True)])
@pytest.mark.parametrize("index", ["*i32", "*i64"])
def test_gluon_score_kernel_builds_for_sm90(group, heads_on_rows, index):
    """score_pages_gluon (and at G = 16 score_pages_gluon_heads) for the H200, with int32 lengths and with SGLang's
    int64 seq_lens and request indices (which once made a shared-memory stage index int64, rejected by Gluon at
    CUDA-graph capture)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = GLUON_BUILD.format(benchmarks=BENCHMARKS, group=group, index=index, heads_on_rows=heads_on_rows)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    # 16-byte cp.async staging, int8 mma, a cubin; programmatic dependent launch: its first summaries are in
    # flight before it waits, and it waits before any store (and before it reads q: test_gpu's chained layers
    # fail otherwise) and lets the selection launch; its outputs (scores, partials) stored evict-last in L2
    # (_triton.L2_KEEP); each query head's mass added up in float64 atomics from 8 query heads per KV head
    # (scoring.MASS_MIN_GROUP)
    assert out.stdout.split() == ["True"] * 8


ATTEND_BUILD = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from sglang_locks.kernels import sparse_attend as m
d = {head_dim}
dp = max(16, triton.next_power_of_2(d))
for fn, consts in ((m._attend_part, dict(HKV=8, G={group}, GP=max(16, {group}), D=d, DP=dp, PAGES=8, SPLITS=32,
                                         DOT_F32=False, PDL=1, KEEP="evict_last")),
                   (m._merge_parts, dict(G={group}, D=d, DP=dp, SPLITS=32, PDL=1))):
    names = fn.arg_names
    sig = {{n: "constexpr" if n in consts else "fp32" if n in ("qk_scale", "v_scale") else {kv!r} if n in ("k_ptr",
           "v_ptr") else "*bf16" if n in ("q_ptr", "out_ptr") else "*fp32" if n.startswith("part") else "*i32"
           for n in names}}
    src = ASTSource(fn=fn, signature=sig, constexprs={{(names.index(k),): v for k, v in consts.items()}},
                    attrs={{(names.index(n),): [["tt.divisibility", 16]] for n in names if sig[n].startswith("*")}})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4)).asm["ptx"]
    attend = fn is m._attend_part
    parts = [line for line in ptx.splitlines() if "st.global" in line]
    print("mma.sync" in ptx or not attend, "cp.async.cg.shared.global" in ptx or not attend,
          ptx.index("griddepcontrol.wait") < ptx.index("ld.global"),
          all("L2::cache_hint" in line for line in parts) == attend)
"""


@pytest.mark.parametrize("group, head_dim, kv", [(1, 128, "*bf16"), (4, 128, "*bf16"), (16, 128, "*bf16"),
                                                (4, 96, "*bf16"), (4, 128, "*fp8e4nv"), (16, 64, "*fp8e4nv")])
def test_sparse_attend_kernels_build_for_sm90(group, head_dim, kv):
    """The split-page sparse decode and its merge for the H200: products on the tensor cores, K and V gathered in
    16-byte asynchronous copies (also at head_dim 96, padded to 128 in registers, and from an fp8 cache), the parts
    stored evict-last in L2 for the merge (which stores its output with the default policy)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", ATTEND_BUILD.format(group=group, head_dim=head_dim, kv=kv)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True"] * 8


SEGMENTS_BUILD = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from sglang_locks.kernels import score_segments as m

kernel = m._score_segments_kernel
for group, heads, mb in ((4, 8, 16), (4, 8, 4), (16, 2, 4), (16, 2, 1), (7, 4, 8)):
    consts = dict(HKV=heads, G=group, GQ=triton.next_power_of_2(group), MB=mb, D=128, R=8, RP=8, PAGE=16,
                  BLOCK_P=16, QUANT=True, CVT=2, BIG=False)
    names = kernel.arg_names
    ptrs = dict(q_ptr="*bf16", mu_ptr="*i8", mu_scale_ptr="*fp32", basis_ptr="*u8", coef_ptr="*i8",
                coef_scale_ptr="*fp32", scores_ptr="*fp32", part_max_ptr="*fp32", part_sum_ptr="*fp32")
    sig = {n: "constexpr" if n in consts else ptrs.get(n, "*i32" if n.endswith("_ptr") else
                                                       "fp32" if n == "scale_log2" else "i32") for n in names}
    src = ASTSource(fn=kernel, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()})
    built = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, num_stages=2))
    ptx = built.asm["ptx"]
    print(group, mb, "mma" in ptx, "0x64086408" in ptx, len(built.asm["cubin"]) > 0)
"""


def test_segment_score_kernel_builds_for_sm90():
    """The shared-run score kernel's tiles (16 to 64 query rows) compile for the H200, on tensor cores, with the
    PTX conversion of the int4 basis."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", SEGMENTS_BUILD], env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line.split() for line in out.stdout.splitlines()]
    assert len(lines) == 5 and all(l[2:] == ["True", "True", "True"] for l in lines), lines
