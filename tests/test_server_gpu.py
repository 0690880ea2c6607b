"""The server end to end on a GPU (H200, gpu-kit's dummy Llama-3.1-8B shape, CUDA graphs on).

    source .gpu-kit/install.sh .gpu-kit/kit.tar.xz .gpu-kit/jit-cache.tar.xz
    pip install --no-deps --no-build-isolation -e .
    python -m pytest -q -rs tests/test_server_gpu.py          # LOCKS_GPU_TP=2: both servers on 2 GPUs; LOCKS_GPU_MODEL=DIR: another model
    # LOCKS_GPU_KV_CACHE_DTYPE=fp8_e4m3: both servers on an fp8 KV cache (stock FlashInfer's the baseline)

Two servers (about a minute each to start): stock FlashInfer (page size 16)
and --enable-locks --locks-token-budget 2048 with a 40K context, whose decode
steps of fewer than 1024 KV tokens in all run FlashInfer's dense decode
(--locks-min-step-tokens 1024), so both decode graphs of each batch size serve.
"""

import os
import sys
import time

import pytest

pytestmark = pytest.mark.gpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from server_process import Server, random_prompts as prompts  # noqa: E402

MODEL = os.environ.get("LOCKS_GPU_MODEL", os.path.join(ROOT, ".gpu-kit", "llama8b-dummy"))
LOG_DIR = os.environ.get("OUT", "/tmp")
BUDGET, CONTEXT, MIN_STEP_TOKENS = 2048, 40960, 1024
# LOCKS_GPU_TP=N runs both servers with tensor parallelism over N GPUs (each rank scores its own KV heads).
TP = os.environ.get("LOCKS_GPU_TP", "1")
KV_CACHE_DTYPE = os.environ.get("LOCKS_GPU_KV_CACHE_DTYPE", "auto")
COMMON = ["--model-path", MODEL, "--load-format", "dummy", "--skip-tokenizer-init", "--context-length", str(CONTEXT),
          "--mem-fraction-static", "0.6", "--cuda-graph-max-bs", "8", "--disable-prefill-cuda-graph",
          "--tp-size", TP, "--kv-cache-dtype", KV_CACHE_DTYPE]


def start_server(name, port, flags, env=None):
    return Server(name, port, [*COMMON, *flags], LOG_DIR, env)


EQUALITY_PROMPTS = prompts(1, [17, 300, 1000, 1555, 1990])  # + 32 new tokens: within the 2048-token budget
# One batch over a shared 1208-token prefix (75.5 pages: the sharing ends mid-page), own parts of mixed lengths;
# every request within the budget, the batch's KV far past --locks-min-step-tokens: LOCKS steps, all pages kept.
SHARED_PREFIX = prompts(5, [1208])[0]
SHARED_BATCH = [SHARED_PREFIX + own for own in prompts(6, [9, 150, 401, 777, 33, 620])]


@pytest.fixture(scope="module")
def stock_outputs():
    """Greedy tokens of the stock server (stopped before the LOCKS server starts: one GPU)."""
    s = start_server("stock", 30011, ["--attention-backend", "flashinfer", "--page-size", "16"])
    try:
        single = [r["output_ids"] for r in s.generate_all(EQUALITY_PROMPTS)]
        s.generate(SHARED_PREFIX, max_new_tokens=1)  # the prefix cached first, as in the LOCKS server's run
        return single, [r["output_ids"] for r in s.generate_all(SHARED_BATCH)]
    finally:
        s.stop()


@pytest.fixture(scope="module")
def locks(stock_outputs):
    s = start_server("locks", 30012, ["--enable-locks", "--locks-token-budget", str(BUDGET),
                                "--locks-min-step-tokens", str(MIN_STEP_TOKENS)],
               env={"SGLANG_LOCKS_CHECK_STALE": "1"})
    yield s
    s.stop()


def assert_same_tokens(batch, want, got):
    for n, w, g in zip(map(len, batch), want, got):
        first = next((i for i, (a, b) in enumerate(zip(w, g)) if a != b), min(len(w), len(g)))
        assert g == w, f"prompt of {n} tokens: first difference at {first}"


def test_greedy_tokens_equal_stock_when_budget_covers_the_context(stock_outputs, locks):
    got = [r["output_ids"] for r in locks.generate_all(EQUALITY_PROMPTS)]
    assert_same_tokens(EQUALITY_PROMPTS, stock_outputs[0], got)


def test_shared_prefix_batch_equals_stock_when_budget_covers_the_context(stock_outputs, locks):
    """Six requests on one cached prefix decode in one batch (a CUDA graph), each scoring the shared pages."""
    locks.generate(SHARED_PREFIX, max_new_tokens=1)
    before = locks.locks_counters()
    got = [r["output_ids"] for r in locks.generate_all(SHARED_BATCH)]
    after = locks.locks_counters()
    assert after["reused_pages"] - before["reused_pages"] >= len(SHARED_BATCH) * (len(SHARED_PREFIX) // 16)
    assert after["locks_decode_steps"] - before["locks_decode_steps"] >= 31
    assert_same_tokens(SHARED_BATCH, stock_outputs[1], got)


@pytest.mark.parametrize("index, variant", [(0, "dense"), (3, "locks")])
def test_each_step_takes_its_variant_and_matches_stock(stock_outputs, locks, index, variant):
    """A request alone: 17 + 32 tokens decode through the dense graphs, 1555 + 32 through LOCKS's."""
    before = locks.locks_counters()
    got = locks.generate(EQUALITY_PROMPTS[index])["output_ids"]
    after = locks.locks_counters()
    steps = {v: after[f"{v}_decode_steps"] - before[f"{v}_decode_steps"] for v in ("dense", "locks")}
    other = "locks" if variant == "dense" else "dense"
    assert steps[variant] >= 31 and steps[other] == 0, steps
    assert got == stock_outputs[0][index]


def test_long_contexts_served_concurrently_with_budget_2048(locks):
    batch = prompts(2, [32768, 33000, 36000, 40000 - 64])
    t0 = time.time()
    out = locks.generate_all(batch, max_new_tokens=48)
    assert [len(r["output_ids"]) for r in out] == [48] * 4
    print(f"4 concurrent requests of 32K-40K tokens, 48 new tokens each: {time.time() - t0:.1f} s")
    assert locks.locks_counters()["stale_scorable_pages"] == 0


def test_shared_prefix_reuses_summaries(locks):
    shared_pages = 300
    prefix = prompts(3, [shared_pages * 16])[0]
    a, b = (prefix + p for p in prompts(4, [100, 50]))
    before = locks.locks_counters()
    ra = locks.generate(a, max_new_tokens=8)
    rb = locks.generate(b, max_new_tokens=8)
    after = locks.locks_counters()
    assert rb["meta_info"]["cached_tokens"] == shared_pages * 16
    assert after["reused_pages"] - before["reused_pages"] == shared_pages
    # Every sealed page summarised once: a's pages, then only b's own (decode seals included).
    sealed_a, sealed_b = (len(a) + 7) // 16, (len(b) + 7) // 16
    built = after["built_pages"] + after["dropped_released_pages"] - before["built_pages"] - before["dropped_released_pages"]
    assert built == sealed_a + sealed_b - shared_pages
    assert after["stale_scorable_pages"] == 0
    assert ra["meta_info"]["cached_tokens"] == 0
