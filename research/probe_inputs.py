"""Inputs the H200 probes in this folder share (run from the repository root)."""

import importlib.util
import json
import os
import sys

import torch

sys.path.insert(0, "benchmarks")
from attention_decode import SHAPES, graph_ms, random_summaries  # noqa: E402
from sglang_locks.scoring import locks_scores_triton  # noqa: E402


def load_kernel_version(name: str, path: str):
    """A version of a kernels/ module from a file, imported as sglang_locks.kernels.NAME (its relative imports
    resolve against this tree's package)."""
    spec = importlib.util.spec_from_file_location(f"sglang_locks.kernels.{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def score_inputs(shape: str, bsz: int, context: int, sets: int):
    """(summaries [sets of random ones, rotated between launches so that they come from HBM, not L2], (req_to_token,
    req_pool_indices, seq_lens) of bsz requests of context tokens on sequential pages, q [bsz, Hq, d], bytes a
    launch must move)."""
    _, hkv, hq, d = SHAPES[shape]
    pages = context // 16
    sums = [random_summaries(bsz * pages + 2, hkv, d, 8) for _ in range(sets)]
    req_to_token = (torch.arange(bsz * context, device="cuda", dtype=torch.int32) + 16).view(bsz, context)
    tables = (req_to_token, torch.arange(bsz, device="cuda", dtype=torch.int32),
              torch.full((bsz,), context, device="cuda", dtype=torch.int32))
    q = torch.randn(bsz, hq, d, device="cuda", dtype=torch.bfloat16)
    moved = bsz * hkv * pages * sums[0].bytes_per_page_per_head() + bsz * pages * 4 * (1 + hq)
    return sums, tables, q, moved


def random_selection(wrapper, bsz: int, hkv: int, context: int, seed: int = 0) -> int:
    """Fill a planned SparseDecodeWrapper's page entries: per row random sealed pages (sorted) and the tail page of
    request b, whose tokens start at slot b * context. Returns the number of entries."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    n = int(wrapper.indptr[-1])
    per_row = n // (bsz * hkv)
    entries = []
    for r in range(bsz * hkv):
        b, h = divmod(r, hkv)
        pages = torch.randperm(context // 16, generator=g)[: per_row - 1].sort().values
        first = torch.cat([pages * 16, torch.tensor([context // 16 * 16])]) + b * context
        entries.append(first * hkv + h)
    wrapper.indices[:n] = torch.cat(entries).int().cuda()
    return n


def attend_inputs(hkv: int, hq: int, bsz: int, inner: int, kernel: str = "flashinfer"):
    """Sparse decode inputs at budget 2048 (128 random sealed pages and a 9-token tail per row, 128K contexts):
    (q, views [inner distinct (K, V) caches, rotated between launches so that pages come from HBM, not L2],
    a CUDA-graph SparseDecodeWrapper of `kernel` planned and filled with random_selection, entries)."""
    from sglang_locks import sparse_decode as sd

    ctx = 131072 + 9
    slots = bsz * ctx + 64
    d = 128
    k = torch.randn(inner * slots, hkv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q = torch.randn(bsz, hq, d, device="cuda", dtype=torch.bfloat16)
    views = [(k[i * slots:(i + 1) * slots], v[i * slots:(i + 1) * slots]) for i in range(inner)]
    ws = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
    w = sd.SparseDecodeWrapper(ws, hq, hkv, d, bsz, bsz * hkv * 130, use_cuda_graph=True, kernel=kernel)
    w.plan(torch.full((bsz,), ctx, dtype=torch.int32), 128, torch.bfloat16, torch.bfloat16, d ** -0.5)
    return q, views, w, random_selection(w, bsz, hkv, ctx)


class ChainStep:
    """The LOCKS attention step of every layer of one shape on random inputs (pdl_ab.py, chain_profile.py,
    select_ab.py): requests of lens tokens on sequential slots, K/V of as many layers as fit in 40 GiB
    and 8 sets of summaries (both rotated over the layers, so that they come from HBM), a CUDA-graph
    LocksDecode planned with score buffers max_pages wide (default: the longest request's). run() writes each
    layer's output into out, so out holds the last layer's."""

    def __init__(self, shape: str, lens: list, max_pages: int = None):
        from sglang_locks.config import LocksConfig
        from sglang_locks.decode import LocksDecode

        cfg = LocksConfig()
        self.layers, hkv, hq, d = SHAPES[shape]
        bsz, longest = len(lens), max(lens)
        slots = bsz * longest + 16
        self.n_kv = max(1, min(self.layers, int(40 * 2**30 // (slots * hkv * d * 4))))
        self.ks = [torch.empty(slots, hkv, d, device="cuda", dtype=torch.bfloat16).normal_() for _ in range(self.n_kv)]
        self.vs = [torch.empty(slots, hkv, d, device="cuda", dtype=torch.bfloat16).normal_() for _ in range(self.n_kv)]
        self.sums = [random_summaries(slots // 16, hkv, d, cfg.rank) for _ in range(min(self.layers, 8))]
        lens_cpu = torch.tensor(lens, dtype=torch.int32)
        self.tables = ((torch.arange(bsz * longest, device="cuda", dtype=torch.int32) + 16).view(bsz, longest),
                       torch.arange(bsz, device="cuda", dtype=torch.int32), lens_cpu.cuda())
        self.q = torch.randn(bsz, hq, d, device="cuda", dtype=torch.bfloat16)
        self.workspace = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
        self.dec = LocksDecode(cfg, self.workspace, hq, hkv, d, bsz, use_cuda_graph=True)
        self.dec.plan(lens_cpu, torch.bfloat16, torch.bfloat16, d**-0.5, max_pages)
        self.rows, self.group = bsz * hkv, hq // hkv
        self.out = torch.empty_like(self.q)

    def run(self) -> None:
        for layer in range(self.layers):
            self.dec.select(self.q, self.sums[layer % len(self.sums)], *self.tables)
            self.dec.sparse.run(self.q, self.ks[layer % self.n_kv], self.vs[layer % self.n_kv], out=self.out)

    def score(self, layer: int) -> None:
        """The score kernel of one layer alone (its mass slots left for the selection that does not follow)."""
        dec = self.dec
        locks_scores_triton(self.q, self.sums[layer % len(self.sums)], *self.tables, dec.max_pages, dec.sm_scale,
                            dec.config, dec.selection_state, dec.candidates)

    def every_layer(self, fns, after_layer=None):
        """A step running fns(layer) for each layer in turn (then after_layer(), if given)."""
        def run():
            for layer in range(self.layers):
                for fn in fns:
                    fn(layer)
                if after_layer is not None:
                    after_layer()
        return run

    def alternate(self, runs: dict, rounds: int, reps: int = 30):
        """CUDA-graph times (ms) of each step in runs, alternated rounds times, the mass slots zeroed after each
        (steps without the selection leave them unread): (times per step, median us a layer per step)."""
        times = {name: [] for name in runs}
        for _ in range(rounds):
            for name, run in runs.items():
                times[name].append(graph_ms(run, reps))
                self.dec.selection_state.mass.zero_()
        return times, {m: round(sorted(t)[rounds // 2] * 1e3 / self.layers, 2) for m, t in times.items()}


def save_rows(out_path: str, command: str, rows: list, **extra) -> None:
    """A trial's JSON: the GPU, GIT_REV and DATE from the environment, its command, rows and any extra fields."""
    with open(out_path, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "git": os.environ.get("GIT_REV", ""),
                   "date": os.environ.get("DATE", ""), "command": command, **extra, "rows": rows}, f, indent=1)
