"""HiCache (--enable-hierarchical-cache) with LOCKS in the server on a GPU (the kit's dummy Llama-3.1-8B shape, CUDA
graphs on):

    OUT=DIR python -m pytest -q -rs tests/test_server_hicache_gpu.py      (benchmarks/h200_run.sh hicache)

A device KV pool of 48K tokens. Agent 0's first turn (a 19,200-token prefix and its question), then three other
agents of 16K tokens each, which push agent 0's pages out to host memory, then agent 0's second turn, whose radix
hit HiCache loads back. Four servers, one at a time: LOCKS with HiCache; LOCKS without it on a pool that holds
every agent, so that its second turn reads turn 1's KV as computed (the reference tokens: a reloaded page holds
the same bytes, and a recomputed one need not); LOCKS without HiCache on the 48K pool (it recomputes the prefix:
its time only); stock FlashInfer with HiCache (the baseline's time). LOCKS runs budget 2048 with every decode step
sparse, so the second turn is decoded from summaries of the reloaded pages: its tokens must equal the reference's,
no page may be scored from a stale summary (SGLANG_LOCKS_CHECK_STALE=1), and the reloaded pages are counted as
rebuilt, not reused. The second turn's time to first token and decode speed go to $OUT/hicache_server.json.
"""

import json
import os
import sys
import time

import pytest

pytestmark = pytest.mark.gpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from e2e_decode import header  # noqa: E402
from server_process import Server, random_prompts as prompts  # noqa: E402

MODEL = os.environ.get("LOCKS_GPU_MODEL", os.path.join(ROOT, ".gpu-kit", "llama8b-dummy"))
LOG_DIR = os.environ.get("OUT", "/tmp")
POOL_TOKENS, RESIDENT_POOL_TOKENS, PAGE = 48 * 1024, 128 * 1024, 16
COMMON = ["--model-path", MODEL, "--load-format", "dummy", "--skip-tokenizer-init", "--context-length", "40960",
          "--mem-fraction-static", "0.6", "--page-size", str(PAGE), "--cuda-graph-max-bs", "8",
          "--disable-prefill-cuda-graph"]
# io backend "direct": plain copies, no JIT kernel (the GPU machine compiles nothing it was not given).
HICACHE = ["--enable-hierarchical-cache", "--hicache-ratio", "4", "--hicache-io-backend", "direct"]
# Every decode step sparse: at the default --locks-min-step-tokens a batch of one 20K-token request decodes densely.
LOCKS = ["--enable-locks", "--locks-token-budget", "2048", "--locks-min-step-tokens", "0"]
STOCK = ["--attention-backend", "flashinfer"]

PREFIX = prompts(11, [PAGE * 1200])[0]
TURN1 = PREFIX + prompts(12, [300])[0]
OTHER_AGENTS = prompts(13, [16000, 16000, 16000])
TURN1_OUT, TURN2_OUT = 32, 64


def second_turn(reply):
    return TURN1 + reply + prompts(14, [200])[0]


def run_agents(server, locks: bool) -> dict:
    """Agent 0's first turn, the other agents, agent 0's second turn (timed); what the server reported."""
    turn1 = server.generate(TURN1, TURN1_OUT)["output_ids"]
    for p in OTHER_AGENTS:
        server.generate(p, 8)
    turn2 = second_turn(turn1)
    before = server.locks_counters() if locks else None
    t0 = time.perf_counter()
    first = server.generate(turn2, 1)
    ttft = time.perf_counter() - t0
    after_first = server.locks_counters() if locks else None
    t0 = time.perf_counter()
    out = server.generate(turn2, TURN2_OUT)  # now from the device cache: its time is prefill-free decode
    decode_s = time.perf_counter() - t0
    return dict(turn1=turn1, turn2=out["output_ids"], cached_tokens=first["meta_info"]["cached_tokens"],
                turn2_tokens=len(turn2), ttft_s=ttft, decode_tok_s=(TURN2_OUT - 1) / decode_s,
                before=before, after=after_first, final=server.locks_counters() if locks else None)


def serve(name, port, flags, env=None, pool_tokens=POOL_TOKENS):
    s = Server(name, port, [*COMMON, "--max-total-tokens", str(pool_tokens), *flags], LOG_DIR, env)
    try:
        return run_agents(s, "--enable-locks" in flags)
    finally:
        s.stop()


@pytest.fixture(scope="module")
def runs():
    check = {"SGLANG_LOCKS_CHECK_STALE": "1"}
    got = {"locks_hicache": serve("locks_hicache", 30031, [*LOCKS, *HICACHE], check),
           "locks_resident": serve("locks_resident", 30032, LOCKS, check, RESIDENT_POOL_TOKENS),
           "locks_recompute": serve("locks_recompute", 30034, LOCKS, check),
           "stock_hicache": serve("stock_hicache", 30033, [*STOCK, *HICACHE])}
    with open(os.path.join(LOG_DIR, "hicache_server.json"), "w") as f:
        head = dict(header([]), command="OUT=DIR python -m pytest -q -rs tests/test_server_hicache_gpu.py")
        json.dump({**head, **{k: {n: v for n, v in r.items() if n not in ("turn1", "turn2")} for k, r in got.items()}},
                  f, indent=1)
    return got


def test_second_turn_hits_the_host_cache_and_loads_the_prefix_back(runs):
    r = runs["locks_hicache"]
    assert r["cached_tokens"] >= len(PREFIX)
    loaded = r["after"]["loaded_pages"] - r["before"]["loaded_pages"]
    assert loaded >= 0.8 * len(PREFIX) // PAGE, loaded  # most of agent 0's pages had left the device pool
    # The turn's extend builds the loaded pages and its own sealed ones, nothing of the prefix still on the device.
    own_sealed = r["turn2_tokens"] // PAGE - r["cached_tokens"] // PAGE
    assert r["after"]["built_pages"] - r["before"]["built_pages"] == loaded + own_sealed


def test_tokens_equal_locks_without_hicache(runs):
    ref = runs["locks_resident"]
    assert ref["cached_tokens"] >= len(PREFIX) and ref["after"]["loaded_pages"] == 0  # turn 1's KV never left
    assert runs["locks_hicache"]["turn1"] == ref["turn1"]
    assert runs["locks_hicache"]["turn2"] == ref["turn2"]


def test_second_turn_decodes_from_the_reloaded_pages_summaries(runs):
    r = runs["locks_hicache"]
    assert r["final"]["locks_decode_steps"] - r["after"]["locks_decode_steps"] >= TURN2_OUT - 1
    assert r["final"]["dense_decode_steps"] == r["after"]["dense_decode_steps"]


def test_no_page_scored_from_a_stale_summary(runs):
    for name in ("locks_hicache", "locks_resident", "locks_recompute"):
        assert runs[name]["final"]["stale_scorable_pages"] == 0, name


def test_report_time_against_hicache_without_locks(runs):
    for name in ("locks_hicache", "stock_hicache", "locks_recompute"):
        r = runs[name]
        print(f"{name}: second turn of {r['turn2_tokens']} tokens, {r['cached_tokens']} cached: TTFT "
              f"{r['ttft_s'] * 1e3:.0f} ms, decode {r['decode_tok_s']:.1f} tok/s")
    assert runs["stock_hicache"]["cached_tokens"] >= len(PREFIX)  # the baseline reloaded too
