r"""Attention step of all layers for decode batches sharing one prefix (own lengths differing, seeded): stock
FlashInfer tensor-core decode over each request's whole page table (page size 16), FlashInfer's
MultiLevelCascadeAttentionWrapper (shared pages once + own pages; FA2 and FA3 levels) and LOCKS (LocksDecode; the
requests' tables point at the same physical pages, so one set of summaries serves all). Each step is one CUDA
graph, the modes alternated; rows add each mode's analytic bytes, the copy-bandwidth floor and the overlap of the
requests' selected pages. On the H200, from the repository root (the last two: the scoring's DRAM bytes):
    source .gpu-kit/install.sh .gpu-kit/kit.tar.xz .gpu-kit/jit-cache.tar.xz
    python3 -m pip install -q --no-deps --no-build-isolation -e .
    GIT_REV=$(git rev-parse --short HEAD) python3 benchmarks/attention_shared_prefix.py --out $OUT/asp.json
    ncu --clock-control none --metrics dram__bytes_read.sum --kernel-name regex:_score_pages --launch-count 1 \
        --csv --page raw --print-units base \
        python3 benchmarks/attention_shared_prefix.py --profile-scoring --case llama3.1-8b:32:96K:4K > $OUT/ncu.csv
    python3 benchmarks/attention_shared_prefix.py --out $OUT/asp.json --ncu-csv $OUT/ncu.csv \
        --case llama3.1-8b:32:96K:4K
Each score launch's time, DRAM bytes and grid per mode: ncu with --metrics gpu__time_duration.sum,dram__bytes_read.sum,
launch__grid_size around --profile-scoring --profile-mode MODE, then --ncu-launches MODE=CSV (repeatable) writes
results/score_shared_kernels.json (benchmarks/h200_run.sh's shared phase runs all of it).
(--out defaults to benchmarks/results/attention_shared_prefix.json; $OUT is the device's folder that comes back.)
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import json
import os
import random
import re
import subprocess
import sys
import time
from typing import List

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_decode import GIB, SHAPES, copy_bandwidth_gbs, median_ms, random_summaries  # noqa: E402

from sglang_locks.config import PAGE_SIZE, LocksConfig  # noqa: E402
from sglang_locks.selection import pages_per_request, selected_lengths  # noqa: E402
from sglang_locks.summaries import PageSummaries  # noqa: E402

DEFAULT_CASES = ("llama3.1-8b:32:96K:4K", "llama3.1-8b:16:96K:4K", "llama3.1-8b:8:96K:4K", "llama3.1-8b:32:32K:4K",
                 "glm4-9b-1m:32:96K:4K")
DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "attention_shared_prefix.json")
DEFAULT_LAUNCHES_OUT = os.path.join(os.path.dirname(DEFAULT_OUT), "score_shared_kernels.json")
CASCADE_BACKENDS = ("fa2", "fa3")
# FA2 levels at GLM-4-9B-1M 32 x 96K need 264 MiB of temporaries (256 MiB failed to plan).
CASCADE_WORKSPACE_BYTES = 1 << 30
NCU_METRIC = "dram__bytes_read.sum"
# ncu's units row, to base units (bytes, seconds; "" for counts)
NCU_UNITS = {"": 1, "byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12, "KB": 1e3, "MB": 1e6,
             "GB": 1e9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "ns": 1e-9, "nsecond": 1e-9, "us": 1e-6,
             "usecond": 1e-6, "ms": 1e-3, "msecond": 1e-3, "s": 1, "second": 1}
# what each profiled score launch of a mode's layer is, in launch order (profile_scoring)
LAUNCH_ROLES = {"locks": ("per_request",), "locks_shared": ("shared_run", "own_pages"),
                "locks_prefilter": ("estimate", "candidates")}
# ncu metric (base units) -> the row's key and its value there
LAUNCH_METRICS = {"gpu__time_duration.sum": ("gpu_time_us", lambda seconds: seconds * 1e6),
                  NCU_METRIC: ("dram_bytes", float), "launch__grid_size": ("grid_size", int)}


# ---------------------------------------------------------------------------------------------- cases (CPU)
@dataclasses.dataclass(frozen=True)
class Case:
    shape: str
    requests: int
    shared_tokens: int
    own_tokens: int

    @property
    def key(self) -> str:
        return f"{self.shape}:{self.requests}:{self.shared_tokens}:{self.own_tokens}"


def parse_tokens(text: str, field: str) -> int:
    """'4096', '96K' or '96k' (x 1024) -> tokens."""
    m = re.fullmatch(r"(\d+)([kK]?)", text.strip())
    if not m:
        raise ValueError(f"--case field {field} must be a token count such as 4096 or 96K, got {text!r}")
    return int(m.group(1)) * (1024 if m.group(2) else 1)


def parse_case(text: str) -> Case:
    """'shape:requests:shared_tokens:own_tokens', e.g. 'llama3.1-8b:32:96K:4K'."""
    parts = text.split(":")
    if len(parts) != 4:
        raise ValueError(f"--case must be shape:requests:shared_tokens:own_tokens, got {text!r}")
    shape, requests, shared, own = parts
    if shape not in SHAPES:
        raise ValueError(f"--case shape must be one of {sorted(SHAPES)}, got {shape!r}")
    if not requests.isdigit() or int(requests) < 1:
        raise ValueError(f"--case requests must be an integer >= 1, got {requests!r}")
    case = Case(shape, int(requests), parse_tokens(shared, "shared_tokens"), parse_tokens(own, "own_tokens"))
    if case.shared_tokens < PAGE_SIZE:
        raise ValueError(f"--case shared_tokens must be >= {PAGE_SIZE} (one shared page), got {case.shared_tokens}")
    if case.own_tokens < 1:
        raise ValueError(f"--case own_tokens must be >= 1, got {case.own_tokens}")
    return case


def own_lengths(own_tokens: int, requests: int, spread: int, seed: int) -> List[int]:
    """Each request's own tokens: own_tokens + a seeded uniform integer in [-spread, spread]."""
    if not 0 <= spread < own_tokens:
        raise ValueError(f"--own-spread must be in [0, own_tokens - 1 = {own_tokens - 1}], got {spread}")
    rng = random.Random(seed)
    return [own_tokens + rng.randint(-spread, spread) for _ in range(requests)]


# ---------------------------------------------------------------------------------------------- page tables (CPU)
@dataclasses.dataclass
class SharedPrefixBatch:
    """Requests' 16-token pages in one KV pool (physical page p holds slots 16p..16p+15; page 0 unused, as in
    SGLang). The first shared_pages of every request are the same physical pages; the rest are its own."""

    shared_pages: List[int]
    request_pages: List[List[int]]  # each request's pages in logical order, the shared ones first
    seq_lens: List[int]
    num_pages: int  # pages in the pool, page 0 included

    @property
    def requests(self) -> int:
        return len(self.seq_lens)

    def last_page_lens(self) -> List[int]:
        return [n - PAGE_SIZE * (len(p) - 1) for n, p in zip(self.seq_lens, self.request_pages)]

    def req_to_token(self) -> torch.Tensor:
        """[requests, longest] int32 token slots (SGLang's req_to_token; zero past a request's length)."""
        out = torch.zeros(self.requests, max(self.seq_lens), dtype=torch.int32)
        for b, (pages, n) in enumerate(zip(self.request_pages, self.seq_lens)):
            slots = torch.tensor(pages, dtype=torch.int32)[:, None] * PAGE_SIZE + torch.arange(PAGE_SIZE)
            out[b, :n] = slots.reshape(-1)[:n]
        return out

    def stock_tables(self):
        """FlashInfer page table of each request's whole context: (indptr, indices, last_page_len), int32."""
        indptr = _indptr([len(p) for p in self.request_pages])
        indices = torch.tensor([p for pages in self.request_pages for p in pages], dtype=torch.int32)
        return indptr, indices, torch.tensor(self.last_page_lens(), dtype=torch.int32)

    def cascade_tables(self):
        """MultiLevelCascadeAttentionWrapper's per-level (qo_indptr, kv_indptr, kv_indices, last_page_len) lists:
        level 0 all queries against the shared pages, level 1 each query against its own pages."""
        s, bsz = len(self.shared_pages), self.requests
        own = [pages[s:] for pages in self.request_pages]
        qo = [torch.tensor([0, bsz], dtype=torch.int32), torch.arange(bsz + 1, dtype=torch.int32)]
        kv_indptr = [_indptr([s]), _indptr([len(p) for p in own])]
        kv_indices = [torch.tensor(self.shared_pages, dtype=torch.int32),
                      torch.tensor([p for pages in own for p in pages], dtype=torch.int32)]
        last = [torch.tensor([PAGE_SIZE], dtype=torch.int32), torch.tensor(self.last_page_lens(), dtype=torch.int32)]
        return qo, kv_indptr, kv_indices, last


def _indptr(counts: List[int]) -> torch.Tensor:
    return torch.tensor([0] + counts, dtype=torch.int32).cumsum(0, dtype=torch.int32)


def shared_prefix_batch(shared_tokens: int, own_lens: List[int]) -> SharedPrefixBatch:
    """The shared prefix's full pages are shared; a partial last page of it is, as with SGLang's radix cache at
    page size 16, each request's own (its tokens then start the request's own pages)."""
    shared = list(range(1, shared_tokens // PAGE_SIZE + 1))
    rest = shared_tokens % PAGE_SIZE
    next_page, request_pages = len(shared) + 1, []
    for own in own_lens:
        n_own = -(-(rest + own) // PAGE_SIZE)
        request_pages.append(shared + list(range(next_page, next_page + n_own)))
        next_page += n_own
    return SharedPrefixBatch(shared, request_pages, [shared_tokens + n for n in own_lens], next_page)


# ---------------------------------------------------------------------------------------------- bytes (CPU)
def summary_bytes_per_page_head(head_dim: int, config: LocksConfig) -> int:
    return PageSummaries.allocate(1, 1, head_dim, config.rank, config.summary_precision).bytes_per_page_per_head()


def step_bytes(shape: str, batch: SharedPrefixBatch, config: LocksConfig) -> dict:
    """Bytes each mode must read in one decode step of all layers (bf16 KV).

    stock: every request's K+V; cascade: the shared pages' K+V once + each request's own; locks: every sealed
    page's summary per (request, KV head) as today's score kernel requests them, or (summary_bytes_once) the
    shared pages' once + the own pages', plus page ids, the selected pages' K+V and their page entries (written
    by the selection, read by the sparse decode). score_intermediates (scores and keys written and read back)
    are reported but left out of the totals, as attention_decode.py does."""
    layers, hkv, hq, d = SHAPES[shape]
    kv_token = hkv * d * 2 * 2
    shared_tokens = len(batch.shared_pages) * PAGE_SIZE
    own_tokens = sum(batch.seq_lens) - batch.requests * shared_tokens
    sealed = sum(n // PAGE_SIZE for n in batch.seq_lens)
    sealed_once = sealed - (batch.requests - 1) * len(batch.shared_pages)
    per_summary = summary_bytes_per_page_head(d, config)
    selected_tokens = int(selected_lengths(torch.tensor(batch.seq_lens), hkv, config.budget_pages).sum())
    entries = hkv * sum(pages_per_request(batch.seq_lens, config.budget_pages))
    parts = {
        "summaries": layers * hkv * sealed * per_summary,
        "summaries_once": layers * hkv * sealed_once * per_summary,
        "page_ids": layers * sealed * 4,
        "selected_kv": layers * selected_tokens * d * 2 * 2,
        "entries": layers * entries * 4 * 2,
        "score_intermediates": layers * sealed * 4 * (2 * hq + 2 * hkv),
    }
    common = parts["page_ids"] + parts["selected_kv"] + parts["entries"]
    return {
        "stock": layers * sum(batch.seq_lens) * kv_token,
        "cascade": layers * (shared_tokens + own_tokens) * kv_token,
        "locks": parts["summaries"] + common,
        "locks_once": parts["summaries_once"] + common,
        "locks_parts": parts,
    }


# ---------------------------------------------------------------------------------------------- overlap (CPU)
def selection_overlap(indptr: torch.Tensor, indices: torch.Tensor, num_kv_heads: int, shared_pages) -> dict:
    """How much one layer's selected pages (rows request * H_kv + head; entry slot * H_kv + head, slot the page's
    first token, as selected_indices_triton writes them) lie in the shared prefix, and how many distinct shared pages
    the requests select per KV head against the sum over requests: what attending each selected shared page
    once per step would save."""
    indptr, indices = indptr.long().cpu(), indices.long().cpu()
    rows = indptr.numel() - 1
    row_of = torch.repeat_interleave(torch.arange(rows), indptr[1:] - indptr[:-1])
    head = indices % num_kv_heads
    if not torch.equal(head, row_of % num_kv_heads):
        raise ValueError("selected page entries of a row hold another KV head than the row's")
    page = indices // num_kv_heads // PAGE_SIZE
    shared = torch.isin(page, torch.as_tensor(list(shared_pages), dtype=torch.long))
    total, in_shared = indices.numel(), int(shared.sum())
    distinct = sum(int(torch.unique(page[shared & (head == h)]).numel()) for h in range(num_kv_heads))
    return {
        "selected_pages": total,
        "selected_shared_pages": in_shared,
        "shared_fraction": in_shared / max(total, 1),
        "distinct_shared_pages": distinct,
        "shared_once_fraction": distinct / max(in_shared, 1),  # distinct / sum over requests
        "selected_kv_saved_fraction": (in_shared - distinct) / max(total, 1),
    }


# ---------------------------------------------------------------------------------------------- ncu (CPU)
def ncu_launches(text: str, kernel_regex: str = "score", metrics=(NCU_METRIC,)) -> List[dict]:
    """One dict per launch of a kernel matching kernel_regex in ncu's `--csv --page raw` output: "kernel" and
    the value of each of metrics that the table has, in base units (NCU_UNITS); other lines, such as ==PROF==
    messages, and other columns are skipped."""
    rows = list(csv.reader(text.splitlines()))
    at = next((i for i, r in enumerate(rows) if "Kernel Name" in r and NCU_METRIC in r), None)
    if at is None:
        raise ValueError(f"--ncu-csv holds no table with a {NCU_METRIC} column (ncu --metrics {NCU_METRIC} "
                         f"--csv --page raw)")
    header = rows[at]
    name = header.index("Kernel Name")
    columns = [header.index(m) for m in metrics if m in header]
    scales = {i: 1.0 for i in columns}
    launches = []
    for r in rows[at + 1:]:
        if len(r) != len(header):
            continue
        if not r[0].strip():  # the units row: no launch ID
            for i in columns:
                unit = r[i].strip()
                if unit not in NCU_UNITS:
                    raise ValueError(f"--ncu-csv: unit {unit!r} of {header[i]} is not one of {sorted(NCU_UNITS)}")
                scales[i] = NCU_UNITS[unit]
            continue
        if not re.search(kernel_regex, r[name]):
            continue
        launch = {"kernel": r[name]}
        for i in columns:
            try:
                launch[header[i]] = float(r[i].replace(",", "").strip()) * scales[i]
            except ValueError:
                raise ValueError(f"--ncu-csv: {header[i]} of {r[name]} is {r[i]!r}, not a number") from None
        launches.append(launch)
    if not launches:
        raise ValueError(f"--ncu-csv holds no launch of a kernel matching {kernel_regex!r}")
    return launches


def parse_ncu_csv(text: str, kernel_regex: str = "score"):
    """(dram__bytes_read.sum summed over the launches of kernels matching kernel_regex, launches)."""
    launches = ncu_launches(text, kernel_regex)
    return sum(launch[NCU_METRIC] for launch in launches), len(launches)


def score_launch_rows(mode: str, text: str, kernel_regex: str = "_score_") -> List[dict]:
    """score_shared_kernels.json's rows of mode's profiled score launches (ncu_launches of text): each with its
    role (LAUNCH_ROLES, in launch order) and LAUNCH_METRICS' values (None where ncu was not asked for one)."""
    if mode not in LAUNCH_ROLES:
        raise ValueError(f"--ncu-launches: mode {mode!r} is not one of {sorted(LAUNCH_ROLES)}")
    roles = LAUNCH_ROLES[mode]
    rows = []
    for i, launch in enumerate(ncu_launches(text, kernel_regex, tuple(LAUNCH_METRICS))):
        row = {"mode": mode, "launch": roles[i % len(roles)], "kernel": launch["kernel"]}
        for metric, (key, convert) in LAUNCH_METRICS.items():
            value = launch.get(metric)
            row[key] = None if value is None else convert(value)
        rows.append(row)
    return rows


def merge_scoring_dram(results: dict, case: Case, own_spread: int, seed: int, dram_bytes: float,
                       launches: int) -> dict:
    """Write the scoring's DRAM bytes (the profiled launches' mean, one launch scoring one layer of the batch,
    times the layers) into results' row of case; returns the row."""
    rows = [r for r in results["rows"]
            if r["case"] == case.key and r["own_spread"] == own_spread and r["seed"] == seed]
    if len(rows) != 1:
        have = sorted({(r["case"], r["own_spread"], r["seed"]) for r in results["rows"]})
        raise ValueError(f"--case {case.key} with --own-spread {own_spread} --seed {seed} matches {len(rows)} "
                         f"rows of --out; it holds (case, own_spread, seed) {have}")
    row = rows[0]
    per_layer = dram_bytes / launches
    row.update({
        "scoring_dram_bytes": per_layer * row["layers"],
        "scoring_dram_bytes_per_layer": per_layer,
        "scoring_dram_launches": launches,
        "scoring_dram_vs_summary_once": per_layer * row["layers"] / row["summary_bytes_once"],
        "scoring_dram_vs_summary_per_request": per_layer * row["layers"] / row["summary_bytes"],
    })
    return row


# ---------------------------------------------------------------------------------------------- GPU
class DeviceInputs:
    """A batch's KV pool and summaries on the GPU: as many distinct layers as the caps allow (each layer's
    buffers far larger than L2, so cycling them still streams from HBM; rows record how many), random values
    (timing does not depend on them), and the LOCKS tables."""

    def __init__(self, shape: str, batch: SharedPrefixBatch, config: LocksConfig, kv_cap_gib: float,
                 summary_cap_gib: float, device="cuda"):
        self.device = device
        self.layers, self.hkv, self.hq, self.d = SHAPES[shape]
        slots = batch.num_pages * PAGE_SIZE
        kv_layer = slots * self.hkv * self.d * 2 * 2
        sum_layer = batch.num_pages * self.hkv * summary_bytes_per_page_head(self.d, config)
        self.n_kv = max(1, min(self.layers, int(kv_cap_gib * GIB // kv_layer)))
        self.n_sum = max(1, min(self.layers, int(summary_cap_gib * GIB // sum_layer)))
        self.kv_pool_gib = self.n_kv * kv_layer / GIB

        def cache():
            return torch.empty(slots, self.hkv, self.d, device=device, dtype=torch.bfloat16).normal_()

        self.ks = [cache() for _ in range(self.n_kv)]
        self.vs = [cache() for _ in range(self.n_kv)]
        self.sums = [random_summaries(batch.num_pages, self.hkv, self.d, config.rank) for _ in range(self.n_sum)]
        self.seq_lens_cpu = torch.tensor(batch.seq_lens, dtype=torch.int32)
        self.tables = (batch.req_to_token().to(device), torch.arange(batch.requests, dtype=torch.int32, device=device),
                       self.seq_lens_cpu.to(device))
        self.q = torch.randn(batch.requests, self.hq, self.d, device=device, dtype=torch.bfloat16)
        self.sm_scale = self.d**-0.5

    def paged(self, layer: int):
        """Layer's (K, V) as FlashInfer NHD pages of 16 tokens."""
        i = layer % self.n_kv
        return self.ks[i].view(-1, PAGE_SIZE, self.hkv, self.d), self.vs[i].view(-1, PAGE_SIZE, self.hkv, self.d)

    def locks(self, config: LocksConfig, shared: bool = False):
        """A planned CUDA-graph LocksDecode and its step of all layers (shared: each group's shared run scored
        once for all its members, LocksDecode.share_runs)."""
        from sglang_locks.decode import LocksDecode
        from sglang_locks.shared_prefix import shared_runs

        workspace = torch.zeros(256 << 20, dtype=torch.uint8, device=self.device)
        dec = LocksDecode(config, workspace, self.hq, self.hkv, self.d, self.q.shape[0], use_cuda_graph=True)
        dec.plan(self.seq_lens_cpu, torch.bfloat16, torch.bfloat16, self.sm_scale)
        if shared:
            dec.share_runs(shared_runs(*self.tables, dec.max_pages))

        def step():
            for layer in range(self.layers):
                dec.run(self.q, self.ks[layer % self.n_kv], self.vs[layer % self.n_kv], self.sums[layer % self.n_sum],
                        *self.tables)
        return dec, step

    def scoring(self, shared: bool):
        """The score launches of a step of all layers alone: today's (score_pages_full, each request's pages) or,
        shared, score_pages_shared (each group's shared run once for all its members, after shared_runs once a
        step); and layer 0's scores [B, Hq, P] of it."""
        from sglang_locks.scoring import score_pages_full, score_pages_shared
        from sglang_locks.shared_prefix import shared_runs

        max_pages = int(self.seq_lens_cpu.max()) // PAGE_SIZE

        def layer_scores(layer, runs):
            args = (self.q, self.sums[layer % self.n_sum], *self.tables, max_pages, self.sm_scale)
            return score_pages_shared(*args, runs)[0] if shared else score_pages_full(*args)[0]

        def step():
            runs = shared_runs(*self.tables, max_pages) if shared else None
            for layer in range(self.layers):
                layer_scores(layer, runs)
        return step, layer_scores(0, shared_runs(*self.tables, max_pages) if shared else None)


def stock_step(inputs: DeviceInputs, batch: SharedPrefixBatch):
    """FlashInfer's tensor-core batch decode over each request's whole page table (faster than its CUDA-core
    decode at every shape of results/attention_decode.json) and its step of all layers."""
    from flashinfer import BatchDecodeWithPagedKVCacheWrapper

    indptr, indices, last = batch.stock_tables()
    w = BatchDecodeWithPagedKVCacheWrapper(
        torch.zeros(256 << 20, dtype=torch.uint8, device="cuda"), "NHD", use_cuda_graph=True, use_tensor_cores=True,
        paged_kv_indptr_buffer=torch.empty_like(indptr, device="cuda"),
        paged_kv_indices_buffer=torch.empty_like(indices, device="cuda"),
        paged_kv_last_page_len_buffer=torch.empty_like(last, device="cuda"))
    w.plan(indptr, indices, last, inputs.hq, inputs.hkv, inputs.d, PAGE_SIZE, q_data_type=torch.bfloat16,
           kv_data_type=torch.bfloat16, sm_scale=inputs.sm_scale)
    out = torch.empty_like(inputs.q)

    def step():
        for layer in range(inputs.layers):
            w.run(inputs.q, inputs.paged(layer), out=out)
    return w, step


def cascade_step(inputs: DeviceInputs, batch: SharedPrefixBatch, backend: str):
    """MultiLevelCascadeAttentionWrapper (2 levels) with its levels' prefill kernels of backend, and its step.
    The wrapper takes no backend: its level wrappers' is set before plan. (FA3, which "auto" picks on the H200,
    gives the shared level, one request of all the queries, one CTA per query head, each over the whole prefix;
    FA2 splits the prefix's KV over CTAs. Both are measured.)"""
    from flashinfer import MultiLevelCascadeAttentionWrapper

    qo, kv_indptr, kv_indices, last = batch.cascade_tables()
    on_gpu = [[torch.empty_like(t, device="cuda") for t in level] for level in (qo, kv_indptr, kv_indices, last)]
    w = MultiLevelCascadeAttentionWrapper(2, torch.zeros(CASCADE_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda"), "NHD",
                                          use_cuda_graph=True, qo_indptr_buf_arr=on_gpu[0],
                                          paged_kv_indptr_buf_arr=on_gpu[1], paged_kv_indices_buf_arr=on_gpu[2],
                                          paged_kv_last_page_len_buf_arr=on_gpu[3])
    for level in w._batch_prefill_wrappers:
        level._backend = backend
    w.plan(qo, kv_indptr, kv_indices, last, inputs.hq, inputs.hkv, inputs.d, PAGE_SIZE, causal=False,
           sm_scale=inputs.sm_scale, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)

    def step():
        for layer in range(inputs.layers):
            w.run(inputs.q, inputs.paged(layer))
    return w, step


def capture(step) -> torch.cuda.CUDAGraph:
    step()  # compiles and warms up outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def alternate(graphs: dict, rounds: int, reps: int) -> dict:
    """mode -> per-round medians (ms) of reps replays of its graph, the modes taking turns each round."""
    times = {mode: [] for mode in graphs}
    for _ in range(rounds):
        for mode, graph in graphs.items():
            times[mode].append(median_ms(graph.replay, reps))
    return times


def median(values):
    return sorted(values)[len(values) // 2]


def selected_entries(dec, inputs: DeviceInputs, batch: SharedPrefixBatch, q: torch.Tensor):
    """(indptr, indices) on the CPU of layer 0's selection: LocksDecode.run leaves the rows' page entries in
    dec.sparse (selected_indices_triton writes them, the sparse decode reads them)."""
    dec.run(q, inputs.ks[0], inputs.vs[0], inputs.sums[0], *inputs.tables)
    rows = batch.requests * inputs.hkv
    indptr = dec.sparse.indptr[: rows + 1].cpu()
    return indptr, dec.sparse.indices[: int(indptr[-1])].cpu()


def bench_case(case: Case, own_lens: List[int], config: LocksConfig, reps: int, rounds: int, kv_cap_gib: float,
               summary_cap_gib: float, prefiltered: LocksConfig = None) -> dict:
    """prefiltered: a config with the prefilter on, timed as mode locks_prefilter beside the others (None: not)."""
    batch = shared_prefix_batch(case.shared_tokens, own_lens)
    inputs = DeviceInputs(case.shape, batch, config, kv_cap_gib, summary_cap_gib)
    graphs, cascades, errors = {}, {}, {}
    stock, step = stock_step(inputs, batch)
    graphs["stock"] = capture(step)
    for backend in CASCADE_BACKENDS:
        # A backend that fails to plan, JIT-compile (the merge kernel is not in the kit's cache) or run (capture's
        # eager warm-up) this batch is recorded and the run goes on.
        try:
            w, step = cascade_step(inputs, batch, backend)
            graphs[f"cascade_{backend}"] = capture(step)
            cascades[backend] = w
        except Exception as e:  # noqa: BLE001
            errors[backend] = f"{type(e).__name__}: {e}"
    # A graph holds no reference to the buffers its kernels read: each decoder lives as long as its graph.
    decoders = {}
    variants = [("locks", config, False), ("locks_shared", config, True)]
    if prefiltered is not None:
        variants.append(("locks_prefilter", prefiltered, False))
    for name, cfg, shared in variants:
        decoders[name], step = inputs.locks(cfg, shared)
        graphs[name] = capture(step)
    scores = {}
    for name, shared in (("score_per_request", False), ("score_shared", True)):
        step, scores[name] = inputs.scoring(shared)
        graphs[name] = capture(step)
    sealed = torch.isfinite(scores["score_per_request"]) & torch.isfinite(scores["score_shared"])
    score_diff = (scores["score_per_request"] - scores["score_shared"])[sealed].abs().max().item()
    times = alternate(graphs, rounds, reps)
    del graphs
    ms = {mode: median(t) for mode, t in times.items()}
    cascade_ms = {b: ms[f"cascade_{b}"] for b in cascades}

    # Stock and cascade attend the same pages: their outputs agree up to rounding (checks the cascade's tables).
    ref = stock.run(inputs.q, inputs.paged(0)).float()
    ref_max = ref.abs().max().item()
    cascade_diff = {b: (w.run(inputs.q, inputs.paged(0)).float() - ref).abs().max().item() for b, w in cascades.items()}
    # Random inputs: independent queries give the overlap of unrelated selections, one query repeated for every
    # request about the most that sharing a prefix could give; real queries lie between.
    overlap = {name: selection_overlap(*selected_entries(decoders["locks"], inputs, batch, q), inputs.hkv,
                                       batch.shared_pages)
               for name, q in (("independent_queries", inputs.q),
                               ("identical_queries", inputs.q[:1].expand_as(inputs.q).contiguous()))}

    nbytes = step_bytes(case.shape, batch, config)
    best_cascade = min(cascade_ms.values()) if cascade_ms else None
    return {
        "case": case.key, "shape": case.shape, "layers": inputs.layers, "requests": case.requests,
        "shared_tokens": case.shared_tokens, "shared_pages": len(batch.shared_pages),
        "own_tokens": sum(own_lens) / len(own_lens), "own_tokens_list": own_lens,
        "budget": config.token_budget, "page_size": PAGE_SIZE,
        "stock_ms": ms["stock"], "cascade_ms": best_cascade, "cascade_ms_by_backend": cascade_ms,
        "cascade_errors": errors, "locks_ms": ms["locks"], "ms_rounds": times,
        "locks_shared_ms": ms["locks_shared"],
        "locks_prefilter_ms": ms.get("locks_prefilter"),
        "prefilter": 0 if prefiltered is None else prefiltered.prefilter,
        "prefilter_rank": 0 if prefiltered is None else prefiltered.prefilter_rank,
        "locks_prefilter_vs_cascade": (None if best_cascade is None or prefiltered is None
                                       else best_cascade / ms["locks_prefilter"]),
        "locks_shared_vs_cascade": None if best_cascade is None else best_cascade / ms["locks_shared"],
        "score_per_request_ms": ms["score_per_request"], "score_shared_ms": ms["score_shared"],
        "score_shared_max_abs_diff": score_diff,
        "locks_vs_cascade": None if best_cascade is None else best_cascade / ms["locks"],
        "locks_vs_stock": ms["stock"] / ms["locks"],
        "bytes_stock": nbytes["stock"], "bytes_cascade": nbytes["cascade"], "bytes_locks": nbytes["locks"],
        "bytes_locks_once": nbytes["locks_once"], "bytes_locks_parts": nbytes["locks_parts"],
        "summary_bytes": nbytes["locks_parts"]["summaries"],
        "summary_bytes_once": nbytes["locks_parts"]["summaries_once"],
        "selected_kv_bytes": nbytes["locks_parts"]["selected_kv"],
        "scoring_dram_bytes": None,  # from ncu: --profile-scoring, then --ncu-csv
        "cascade_vs_stock_max_abs_diff": cascade_diff, "stock_max_abs_output": ref_max,
        "selected_overlap_layer0": overlap,
        "distinct_kv_layers": inputs.n_kv, "distinct_summary_layers": inputs.n_sum, "kv_pool_gib": inputs.kv_pool_gib,
    }


def add_floors(row: dict, copy_gbs: float) -> None:
    """Each mode's bytes per measured time, against the copy bandwidth, and the time that bandwidth gives."""
    for mode, bytes_key in (("stock", "bytes_stock"), ("cascade", "bytes_cascade"), ("locks", "bytes_locks")):
        ms = row[f"{mode}_ms"]
        row[f"floor_{mode}_ms"] = row[bytes_key] / copy_gbs / 1e6
        row[f"{mode}_gbs"] = None if ms is None else row[bytes_key] / ms / 1e6
        row[f"{mode}_copy_fraction"] = None if ms is None else row[f"{mode}_gbs"] / copy_gbs
    row["floor_locks_once_ms"] = row["bytes_locks_once"] / copy_gbs / 1e6


PROFILE_MODES = ("locks", "locks_shared", "locks_prefilter")


def profile_scoring(case: Case, own_lens: List[int], config: LocksConfig, mode: str = "locks",
                    prefiltered: LocksConfig = None) -> None:
    """One step of all layers of mode (PROFILE_MODES; locks_prefilter runs prefiltered), eagerly, for ncu to
    profile its score launches (one distinct layer of KV and summaries: ncu flushes the caches before each
    profiled launch)."""
    batch = shared_prefix_batch(case.shared_tokens, own_lens)
    inputs = DeviceInputs(case.shape, batch, config, kv_cap_gib=0, summary_cap_gib=0)
    if mode == "locks_prefilter" and prefiltered is None:
        raise ValueError("--profile-mode locks_prefilter needs --prefilter > 0")
    _, step = inputs.locks(prefiltered if mode == "locks_prefilter" else config, shared=mode == "locks_shared")
    step()
    torch.cuda.synchronize()
    print(f"profiled one LOCKS step of {case.key} ({inputs.layers} score launches)", file=sys.stderr)


def git_rev() -> str:
    # GIT_REV first: the device machine's copy of the checkout can carry stale git metadata.
    return os.environ.get("GIT_REV") or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                                       text=True).stdout.strip() or "unknown"


def _mode_and_file(spec: str):
    mode, sep, path = spec.partition("=")
    if not sep or mode not in LAUNCH_ROLES or not path:
        raise ValueError(f"--ncu-launches takes MODE=CSV with MODE one of {sorted(LAUNCH_ROLES)}, got {spec!r}")
    return mode, path


def write_score_launches(args) -> None:
    """--ncu-launches: the profiled launches of each mode as rows, under the header of the run they belong to."""
    with open(args.out) as f:
        run = json.load(f)
    rows = []
    for mode, path in args.ncu_launches:
        with open(path) as f:
            rows += score_launch_rows(mode, f.read())
    header = {key: run[key] for key in ("gpu", "git", "date")}
    case = args.cases[0]
    header.update(command=" ".join(["python"] + sys.argv),
                  case=case.key, own_spread=args.own_spread, seed=args.seed,
                  note="one layer's score launches in one eager step of each mode (--profile-scoring --profile-mode "
                       "MODE under ncu --clock-control none); ncu flushes the caches before each profiled launch, "
                       "so DRAM bytes are a cold layer's")
    with open(args.launches_out, "w") as f:
        json.dump({**header, "rows": rows}, f, indent=1)
    print(f"wrote {len(rows)} launches to {args.launches_out}")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help="result JSON (read and updated by --ncu-csv)")
    ap.add_argument("--case", action="append", dest="cases",
                    help=f"shape:requests:shared_tokens:own_tokens, repeatable (default: {' '.join(DEFAULT_CASES)}); "
                         f"shapes {sorted(SHAPES)}; tokens like 4096 or 96K")
    ap.add_argument("--own-spread", type=int, default=1000,
                    help="each request's own tokens: own_tokens + a seeded uniform integer in [-spread, spread]")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget", type=int, default=2048, help="LOCKS token budget")
    ap.add_argument("--prefilter", type=int, default=8,
                    help="also time LOCKS with --locks-prefilter F (mode locks_prefilter; 0: not)")
    ap.add_argument("--prefilter-rank", type=int, default=2, help="its --locks-prefilter-rank")
    ap.add_argument("--reps", type=int, default=10, help="graph replays timed per mode and round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the modes taking turns")
    ap.add_argument("--kv-cap-gib", type=float, default=48, help="KV of at most this many GiB (layers cycle past it)")
    ap.add_argument("--summary-cap-gib", type=float, default=16)
    ap.add_argument("--time-limit", type=float, default=200, help="seconds; later cases are skipped")
    ap.add_argument("--profile-scoring", action="store_true",
                    help="run one LOCKS step of the one --case eagerly (wrap in ncu; see above) and exit")
    ap.add_argument("--profile-mode", choices=PROFILE_MODES, default="locks", help="the step --profile-scoring runs")
    ap.add_argument("--ncu-csv", help="ncu --csv --page raw output of --profile-scoring: add its scoring DRAM bytes "
                                      "to the --out row of the one --case, and exit")
    ap.add_argument("--ncu-kernel-regex", default="score", help="kernels of --ncu-csv counted as the scoring")
    ap.add_argument("--ncu-launches", action="append", metavar="MODE=CSV", default=[],
                    help=f"ncu --csv --page raw output of --profile-mode MODE ({', '.join(LAUNCH_ROLES)}), "
                         f"repeatable: write each score launch's time, DRAM bytes and grid to --launches-out, "
                         f"under --out's gpu, git and date, and exit")
    ap.add_argument("--launches-out", default=DEFAULT_LAUNCHES_OUT, help="where --ncu-launches writes")
    args = ap.parse_args(argv)
    try:
        args.cases = [parse_case(c) for c in (args.cases or DEFAULT_CASES)]
        args.ncu_launches = [_mode_and_file(spec) for spec in args.ncu_launches]
        if (args.profile_scoring or args.ncu_csv or args.ncu_launches) and len(args.cases) != 1:
            raise ValueError("--profile-scoring, --ncu-csv and --ncu-launches take exactly one --case")
        for name in ("reps", "rounds"):
            if getattr(args, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(args, name)}")
        args.own_lens = [own_lengths(c.own_tokens, c.requests, args.own_spread, args.seed) for c in args.cases]
        try:
            args.config = LocksConfig(token_budget=args.budget)
        except ValueError as e:
            raise ValueError(f"--budget: {e}") from None
        args.prefiltered = None
        if args.prefilter:
            try:
                args.prefiltered = dataclasses.replace(args.config, prefilter=args.prefilter,
                                                       prefilter_rank=args.prefilter_rank)
            except ValueError as e:
                raise ValueError(f"--prefilter / --prefilter-rank: {e}") from None
    except ValueError as e:
        ap.error(str(e))
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.ncu_launches:
        write_score_launches(args)
        return
    if args.ncu_csv:
        with open(args.out) as f:
            results = json.load(f)
        with open(args.ncu_csv) as f:
            dram, launches = parse_ncu_csv(f.read(), args.ncu_kernel_regex)
        row = merge_scoring_dram(results, args.cases[0], args.own_spread, args.seed, dram, launches)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
        print(f"{row['case']}: scoring {row['scoring_dram_bytes'] / 1e9:.3f} GB DRAM a step, "
              f"{row['scoring_dram_vs_summary_once']:.2f}x the summaries read once")
        return
    if args.profile_scoring:
        profile_scoring(args.cases[0], args.own_lens[0], args.config, args.profile_mode, args.prefiltered)
        return
    import flashinfer

    t0 = time.time()
    header = {
        "gpu": torch.cuda.get_device_name(), "git": git_rev(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python"] + sys.argv), "torch": torch.__version__, "flashinfer": flashinfer.__version__,
        "copy_bandwidth_gbs": copy_bandwidth_gbs(),
    }
    rows, skipped = [], []
    for case, own_lens in zip(args.cases, args.own_lens):
        if time.time() - t0 > args.time_limit:
            skipped.append(case.key)
            continue
        t_case = time.time()
        row = bench_case(case, own_lens, args.config, args.reps, args.rounds, args.kv_cap_gib, args.summary_cap_gib,
                         args.prefiltered)
        torch.cuda.empty_cache()  # the case's buffers, freed on return
        row.update(own_spread=args.own_spread, seed=args.seed)
        add_floors(row, header["copy_bandwidth_gbs"])
        rows.append(row)
        ov = row["selected_overlap_layer0"]["independent_queries"]
        print(f"{case.key}: stock {row['stock_ms']:.2f} ms, cascade {row['cascade_ms_by_backend']} ms, "
              f"locks {row['locks_ms']:.2f} ms (locks {row['locks_vs_cascade'] or float('nan'):.2f}x cascade, "
              f"{row['locks_vs_stock']:.1f}x stock); selected pages {ov['shared_fraction']:.0%} shared, "
              f"{ov['shared_once_fraction']:.0%} distinct; locks with shared runs scored once "
              f"{row['locks_shared_ms']:.2f} ms; with the prefilter {row['locks_prefilter_ms'] or float('nan'):.2f} ms; "
              f"scoring alone {row['score_per_request_ms']:.2f} ms, "
              f"shared runs once {row['score_shared_ms']:.2f} ms (max diff {row['score_shared_max_abs_diff']:.1e}); "
              f"{time.time() - t_case:.0f} s", flush=True)
        with open(args.out, "w") as f:
            json.dump({**header, "rows": rows, "skipped": skipped}, f, indent=1)
    with open(args.out, "w") as f:
        json.dump({**header, "rows": rows, "skipped": skipped}, f, indent=1)


if __name__ == "__main__":
    main()
