"""The server end to end on a GPU (H200, gpu-kit's dummy Llama-3.1-8B shape, CUDA graphs on).

    source .gpu-kit/install.sh .gpu-kit/kit.tar.xz .gpu-kit/jit-cache.tar.xz
    pip install --no-deps --no-build-isolation -e .
    python -m pytest -q -rs tests/test_server_gpu.py          # LOCKS_GPU_TP=2: both servers on 2 GPUs; LOCKS_GPU_MODEL=DIR: another model

Two servers (about a minute each to start): stock FlashInfer (page size 16)
and --enable-locks --locks-token-budget 2048 with a 40K context, whose decode
steps of fewer than 1024 KV tokens in all run FlashInfer's dense decode
(--locks-min-step-tokens 1024), so both decode graphs of each batch size serve.
"""

import concurrent.futures
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

pytestmark = pytest.mark.gpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.environ.get("LOCKS_GPU_MODEL", os.path.join(ROOT, ".gpu-kit", "llama8b-dummy"))
LOG_DIR = os.environ.get("OUT", "/tmp")
BUDGET, CONTEXT, MIN_STEP_TOKENS = 2048, 40960, 1024
# LOCKS_GPU_TP=N runs both servers with tensor parallelism over N GPUs (each rank scores its own KV heads).
TP = os.environ.get("LOCKS_GPU_TP", "1")
COMMON = ["--model-path", MODEL, "--load-format", "dummy", "--skip-tokenizer-init", "--context-length", str(CONTEXT),
          "--mem-fraction-static", "0.6", "--cuda-graph-max-bs", "8", "--disable-prefill-cuda-graph",
          "--host", "127.0.0.1", "--tp-size", TP]


class Server:
    def __init__(self, name, port, flags, env=None):
        self.url = f"http://127.0.0.1:{port}"
        os.makedirs(LOG_DIR, exist_ok=True)
        self.log = os.path.join(LOG_DIR, f"server_{name}.log")
        cmd = [sys.executable, "-m", "sglang.launch_server", *COMMON, "--port", str(port), *flags]
        with open(self.log, "w") as log:
            log.write(" ".join(cmd) + "\n")
            log.flush()
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                         env={**os.environ, **(env or {})})
        t0 = time.time()
        while time.time() - t0 < 600:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server {name} exited with {self.proc.returncode}; see {self.log}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(2)
        raise RuntimeError(f"server {name} not ready in 600 s; see {self.log}")

    def generate(self, ids, max_new_tokens=32):
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0,
                                                      "ignore_eos": True}}
        req = urllib.request.Request(self.url + "/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())

    def generate_all(self, prompts, max_new_tokens=32):
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            return list(pool.map(lambda p: self.generate(p, max_new_tokens), prompts))

    def locks_counters(self):
        with urllib.request.urlopen(self.url + "/server_info", timeout=60) as r:
            return json.loads(r.read())["internal_states"][0]["locks"]

    def stop(self):
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=60)
        except Exception:  # noqa: BLE001
            os.killpg(self.proc.pid, signal.SIGKILL)


def prompts(seed, lengths):
    rng = random.Random(seed)
    return [[rng.randrange(100, 120000) for _ in range(n)] for n in lengths]


EQUALITY_PROMPTS = prompts(1, [17, 300, 1000, 1555, 1990])  # + 32 new tokens: within the 2048-token budget


@pytest.fixture(scope="module")
def stock_outputs():
    """Greedy tokens of the stock server (stopped before the LOCKS server starts: one GPU)."""
    s = Server("stock", 30011, ["--attention-backend", "flashinfer", "--page-size", "16"])
    try:
        return [r["output_ids"] for r in s.generate_all(EQUALITY_PROMPTS)]
    finally:
        s.stop()


@pytest.fixture(scope="module")
def locks(stock_outputs):
    s = Server("locks", 30012, ["--enable-locks", "--locks-token-budget", str(BUDGET),
                                "--locks-min-step-tokens", str(MIN_STEP_TOKENS)],
               env={"SGLANG_LOCKS_CHECK_STALE": "1"})
    yield s
    s.stop()


def test_greedy_tokens_equal_stock_when_budget_covers_the_context(stock_outputs, locks):
    got = [r["output_ids"] for r in locks.generate_all(EQUALITY_PROMPTS)]
    for n, w, g in zip(map(len, EQUALITY_PROMPTS), stock_outputs, got):
        assert g == w, f"prompt of {n} tokens: first difference at {next(i for i, (a, b) in enumerate(zip(w, g)) if a != b)}"


@pytest.mark.parametrize("index, variant", [(0, "dense"), (3, "locks")])
def test_each_step_takes_its_variant_and_matches_stock(stock_outputs, locks, index, variant):
    """A request alone: 17 + 32 tokens decode through the dense graphs, 1555 + 32 through LOCKS's."""
    before = locks.locks_counters()
    got = locks.generate(EQUALITY_PROMPTS[index])["output_ids"]
    after = locks.locks_counters()
    steps = {v: after[f"{v}_decode_steps"] - before[f"{v}_decode_steps"] for v in ("dense", "locks")}
    other = "locks" if variant == "dense" else "dense"
    assert steps[variant] >= 31 and steps[other] == 0, steps
    assert got == stock_outputs[index]


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
