"""Compile the score kernel for sm_90 on any machine (no GPU) and count its SASS.

    python benchmarks/score_sass.py [--shape llama3.1-8b|glm4-9b-1m] [--int-conversion int8|ptx]
        [--num-warps 2] [--num-stages 3] [--maxnreg N] [--module PATH] [--lines 20]
    python benchmarks/score_sass.py --gluon [--shape ...] [--lines 20]

Triton's bundled ptxas and nvdisasm build and disassemble the kernel as the
GPU would run it (pointer arguments 16-byte aligned, as Triton specialises
them at launch). Prints registers, shared memory, the static instruction
count of the page loop's body (one warp, one block of pages) by opcode and by
source line. The kernel is instruction-issue bound on the H200
(docs/performance.md), so the loop's instruction count is a
first check of a change before it is timed there. --module: another
revision's score_pages.py (git show REV:kernels/score_pages.py > FILE). --gluon: the Gluon kernel
the launcher uses on the GPU (score_pages_gluon, at G = 16 score_pages_gluon_heads; one warp, one step
of 2 * STEP_PAIRS pages). GLM-4-9B-1M at 9f093c7: 837 instructions a step, 105 per (page, KV head), 88
of them MUFU (exponentials and logarithms).
"""

import argparse
import collections
import importlib.util
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from attention_decode import SHAPES

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
POINTERS = dict(q_ptr="*bf16", mu_ptr="*i8", mu_scale_ptr="*fp32", basis_ptr="*u8", coef_ptr="*i8",
                coef_scale_ptr="*fp32", req_to_token_ptr="*i32", req_pool_ptr="*i32", seq_lens_ptr="*i32",
                cand_pages_ptr="*i32", cand_slots_ptr="*i32", est_ptr="*fp32", scores_ptr="*fp32", part_max_ptr="*fp32", part_sum_ptr="*fp32",
                mass_ptr="*fp64")
ALIGNED = set(POINTERS) | {"stride_qb", "stride_qh", "stride_rt"}


def load_module(path):
    if path is None:
        import sglang_locks.kernels.score_pages as module
        return module
    spec = importlib.util.spec_from_file_location("sglang_locks.kernels._score_pages_sass", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compile_score_kernel(module, group, kv_heads, conversion, num_warps=2, num_stages=3, maxnreg=None, block_pages=None,
                         terms="full"):
    """The score kernel for sm_90 (int8-int4-int8 summaries, head_dim 128, rank 8); conversion: ptx or int8;
    terms: what a launch scores (score_pages.TERMS), in revisions that have it."""
    fn = module._score_pages_kernel
    idot = conversion == "int8"
    names = fn.arg_names
    consts = dict(HKV=kv_heads, G=group, D=128, R=8, RP=8, PAGE=16, BLOCK_P=block_pages or module.BLOCK_PAGES, QUANT=True,
                  CVT=module.CONVERSIONS[conversion], BIG=False, IDOT=idot)
    padded = triton.next_power_of_2(group)
    if "GQ" in names:  # revisions that pad G to a power of two
        consts["GQ"] = padded
    if "GP" in names:  # revisions whose launcher passes the dot's row count
        consts["GP"] = max(16, 2 * padded) if idot else 16
    if "TERMS" in names:
        consts["TERMS"] = module.TERMS[terms]
    if "RS" in names:  # ranks stored; an estimate launch uses the first 2 (the default prefilter rank)
        consts["RS"] = 8
        consts["R"] = 2 if terms == "estimate" else 8
        consts["RP"] = consts["R"]
    sig = {n: "constexpr" if n in consts else POINTERS.get(n, "fp32" if n == "scale_log2" else "i32") for n in names}
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()},
                    attrs={(names.index(n),): [["tt.divisibility", 16]] for n in names if n in ALIGNED})
    options = dict(num_warps=num_warps, num_stages=num_stages, **({"maxnreg": maxnreg} if maxnreg else {}))
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def compile_gluon_kernel(group, kv_heads, index="*i32", heads_on_rows=None):
    """The Gluon score kernel for sm_90 as the decode step launches it (int8-int4-int8, head_dim 128, rank 8,
    adding up each query head's mass from scoring.MASS_MIN_GROUP query heads per KV head): score_pages_gluon, or
    at 16 query heads per KV head (heads_on_rows None: as the launcher picks) score_pages_gluon_heads; seq_lens
    and request indices of type index."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from sglang_locks.kernels import score_pages_gluon as m, score_pages_gluon_heads as heads
    from sglang_locks.kernels.page_selection import MASS_SLOTS
    from sglang_locks.scoring import MASS_MIN_GROUP

    heads_on_rows = group == 16 if heads_on_rows is None else heads_on_rows
    fn = heads._score_pages_heads_kernel if heads_on_rows else m._score_pages_gluon_kernel
    names = fn.arg_names
    consts = dict(HKV=kv_heads, D=128, PAGE=16, PAIRS=m.STEP_PAIRS, STAGES=m.SMEM_STAGES, PDL=1, KEEP="evict_last",
                  MASS=MASS_SLOTS if group >= MASS_MIN_GROUP else 0, num_warps=1)
    if not heads_on_rows:
        consts.update(G=group, NC=max(8, 2 * group))
    ptrs = dict(POINTERS, req_pool_ptr=index, seq_lens_ptr=index)
    ptrs = {n: ptrs[n] for n in names if n in ptrs}
    sig = {n: "constexpr" if n in consts else ptrs.get(n, "fp32" if n == "scale_log2" else "i32") for n in names}
    src = GluonASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()},
                         attrs={(names.index(n),): [["tt.divisibility", 16]] for n in ptrs})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=1))


def loop_body(sass: str):
    """(source line, instruction) of the longest backward-branch loop."""
    body, labels, where = [], {}, None
    for line in sass.splitlines():
        m = re.search(r'File "(.*)", line (\d+)', line)
        if m:
            where = (os.path.basename(m.group(1)), int(m.group(2)))
            continue
        m = re.match(r"\.L_x_(\d+):", line.strip())
        if m:
            labels[m.group(1)] = len(body)
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s*(.*)", line)
        if m:
            body.append((where, m.group(1).split(";")[0].strip()))
    best = (0, 0, -1)
    for i, (_, ins) in enumerate(body):
        m = re.search(r"BRA.*\.L_x_(\d+)", ins)
        if m and labels.get(m.group(1), i + 1) <= i and i - labels[m.group(1)] + 1 > best[0]:
            best = (i - labels[m.group(1)] + 1, labels[m.group(1)], i)
    return body[best[1]:best[2] + 1]


def opcode(ins: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0].split(".")[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="llama3.1-8b", choices=sorted(SHAPES))
    ap.add_argument("--int-conversion", default="int8", choices=["int8", "ptx"])
    ap.add_argument("--num-warps", type=int, help="default (and --num-stages, --maxnreg): the launcher's")
    ap.add_argument("--num-stages", type=int)
    ap.add_argument("--maxnreg", type=int, help="0: no cap")
    ap.add_argument("--block-pages", type=int, default=None, help="default: the module's BLOCK_PAGES")
    ap.add_argument("--module", help="a score_pages.py to compile instead of the installed one")
    ap.add_argument("--lines", type=int, default=20, help="source lines to list")
    ap.add_argument("--gluon", action="store_true", help="the Gluon score kernel instead of the Triton one")
    args = ap.parse_args()
    _, kv_heads, q_heads, _ = SHAPES[args.shape]
    group = q_heads // kv_heads
    conversion = args.int_conversion
    if args.gluon:
        from sglang_locks.kernels.score_pages_gluon import STEP_PAIRS

        kernel = compile_gluon_kernel(group, kv_heads)
        conversion, args.num_warps, args.num_stages, args.maxnreg = "gluon", 1, None, 0
        args.block_pages = 2 * STEP_PAIRS
    else:
        module = load_module(args.module)
        if hasattr(module, "default_launch"):  # older revisions: 2 warps, 3 stages, no cap
            warps, stages, maxnreg = module.default_launch(group, conversion == "int8")
        else:
            warps, stages, maxnreg = 2, 3, 0
        args.num_warps = args.num_warps or warps
        args.num_stages = args.num_stages or stages
        args.maxnreg = maxnreg if args.maxnreg is None else args.maxnreg
        kernel = compile_score_kernel(module, group, kv_heads, conversion, args.num_warps, args.num_stages,
                                      args.maxnreg, args.block_pages)
        args.block_pages = args.block_pages or module.BLOCK_PAGES
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        with open(cubin, "wb") as f:
            f.write(kernel.asm["cubin"])
        usage = subprocess.run([os.path.join(BIN, "cuobjdump"), "--dump-resource-usage", cubin],
                               capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([os.path.join(BIN, "nvdisasm"), "-c", "--print-line-info", cubin],
                              capture_output=True, text=True, check=True).stdout
    regs = re.search(r"REG:(\d+)", usage).group(1)
    loop = loop_body(sass)
    pages = args.block_pages
    print(f"{args.shape} G={group} {conversion} block_pages={pages} warps={args.num_warps} stages={args.num_stages}"
          f"{f' maxnreg={args.maxnreg}' if args.maxnreg else ''}: "
          f"{regs} registers, {kernel.metadata.shared} B shared; loop body {len(loop)} instructions per warp per "
          f"{pages} pages = {len(loop) * args.num_warps / pages:.0f} per (page, KV head)")
    print("  " + " ".join(f"{k}:{v}" for k, v in collections.Counter(opcode(i) for _, i in loop).most_common(16)))
    per_line = collections.Counter(w for w, _ in loop)
    kernels = os.path.dirname(os.path.abspath(kernel_module_file(args)))
    for where, n in per_line.most_common(args.lines):
        path = os.path.join(kernels, where[0]) if where else ""
        text = open(path).read().splitlines()[where[1] - 1].strip()[:80] if os.path.exists(path) else str(where)
        print(f"  {n:5d}  {where[0] if where else '-'}:{where[1] if where else '-'}  {text}")


def kernel_module_file(args) -> str:
    """The source file whose folder holds the compiled kernel's lines (the kernels folder, or --module's)."""
    if args.module and not args.gluon:
        return args.module
    from sglang_locks.kernels import score_pages
    return score_pages.__file__


if __name__ == "__main__":
    main()
