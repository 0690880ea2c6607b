"""Soak test: one --enable-locks server under minutes of mixed, faulty load, on the loopback address.

    python benchmarks/soak.py --model .gpu-kit/llama8b-dummy --duration 480 --out $OUT/soak.json --log-dir $OUT

A deliberately small KV pool (--max-total-tokens) makes the radix cache evict.
Client threads send requests of 1K-128K tokens, some continuing shared
prefixes, some streamed and dropped mid-stream, some aborted through
/abort_request; /flush_cache is called during load (refused while busy) and
in quiet moments (done). SGLANG_LOCKS_CHECK_STALE=1 counts every page scored
from an invalid summary. Passes when no request failed other than the ones it
cut off, the stale counter is 0, a fixed probe prompt's greedy tokens are the
same at the start and the end (each after a flush, so both are fresh prefills)
and the server's GPU memory and host memory end where they started.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import subprocess
import threading
import time
import urllib.error
from collections import Counter

from server_process import Server, random_prompts

PROBE_LEN, PROBE_TOKENS = 40000, 64  # long enough for LOCKS's sparse steps at the default --locks-min-step-tokens
SHARED_PREFIX_LENS = (8192, 32768, 98304)
GPU_MEMORY_SLACK_MIB = 256  # allocator rounding; a leak of pages or graphs would be GiBs
HOST_MEMORY_SLACK = 0.10


def server_args(model: str, max_total_tokens: int, context: int, mode: str) -> list:
    """mode "locks": --enable-locks; "fullkv": stock SGLang on the same backend and page size (the control run)."""
    mode_flags = ["--enable-locks"] if mode == "locks" else ["--attention-backend", "flashinfer", "--page-size", "16"]
    return ["--model-path", model, "--load-format", "dummy", "--skip-tokenizer-init", *mode_flags,
            "--context-length", str(context), "--max-total-tokens", str(max_total_tokens),
            "--mem-fraction-static", "0.5", "--cuda-graph-max-bs", "16", "--disable-prefill-cuda-graph",
            "--enable-metrics"]


def gpu_memory_mib() -> int:
    """GPU memory used by all compute processes (the server's scheduler holds nearly all of it)."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    return sum(int(x) for x in out.split() if x.strip().isdigit())


def host_rss_mib(pid: int):
    """Resident memory of the server's process tree (None once it is gone)."""
    import psutil

    total = 0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return None
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:  # a child that exited meanwhile
            pass
    return round(total / 2**20)


def metric(text: str, name: str) -> float:
    """Sum of a Prometheus metric's samples (all label sets)."""
    return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


class Load:
    """Client threads and the flusher; counts every outcome."""

    def __init__(self, server: Server, seed: int, max_requests: int, context: int):
        self.server, self.rng, self.max_requests = server, random.Random(seed), max_requests
        self.max_prompt = context - 256
        self.prefixes = random_prompts(seed + 1, SHARED_PREFIX_LENS)
        self.counts: Counter = Counter()
        self.errors: list = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.paused = threading.Event()
        self.in_flight = 0

    def _count(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.counts[key] += n

    def _prompt(self, rng: random.Random):
        if rng.random() < 0.5:
            prefix = rng.choice(self.prefixes)
            return prefix + random_prompts(rng.randrange(1 << 30), [rng.randrange(1024, 4097)])[0], True
        n = int(math.exp(rng.uniform(math.log(1024), math.log(self.max_prompt))))  # log-uniform 1K-128K
        return random_prompts(rng.randrange(1 << 30), [n])[0], False

    def client(self, index: int) -> None:
        rng = random.Random(self.rng.randrange(1 << 30) + index)
        while not self.stop.is_set():
            if self.paused.is_set():
                time.sleep(0.2)
                continue
            with self.lock:
                if self.counts["sent"] >= self.max_requests:
                    return
                self.counts["sent"] += 1
                self.in_flight += 1
            ids, shared = self._prompt(rng)
            kind = rng.choices(["complete", "stream_dropped", "aborted"], [0.7, 0.15, 0.15])[0]
            try:
                getattr(self, kind)(ids, rng)
                self._count(kind)
                self._count("shared_prefix" if shared else "own_prompt")
                self._count("prompt_tokens", len(ids))
            except Exception as e:  # noqa: BLE001 - every failure is recorded and fails the soak
                with self.lock:
                    self.errors.append(f"{kind} of {len(ids)} tokens: {type(e).__name__}: {e}")
            finally:
                with self.lock:
                    self.in_flight -= 1

    def complete(self, ids, rng) -> None:
        n = rng.randrange(16, 129)
        out = self.server.generate(ids, max_new_tokens=n)
        if len(out["output_ids"]) != n:
            raise RuntimeError(f"{len(out['output_ids'])} of {n} tokens, finish {out['meta_info'].get('finish_reason')}")

    def stream_dropped(self, ids, rng) -> None:
        body = {"input_ids": ids, "stream": True,
                "sampling_params": {"max_new_tokens": 256, "temperature": 0, "ignore_eos": True}}
        with self.server.post("/generate", body) as r:
            for _ in range(rng.randrange(2, 6)):
                if not r.readline():
                    raise RuntimeError("stream ended early")
        # leaving the block closes the connection mid-stream: the server must abort the request itself

    def aborted(self, ids, rng) -> None:
        rid = f"soak-{rng.randrange(1 << 62)}"
        fired = threading.Event()

        def abort():
            fired.set()
            self.server.post("/abort_request", {"rid": rid}).close()

        timer = threading.Timer(rng.uniform(0.2, 3.0), abort)
        timer.start()
        try:
            out = self.server.generate(ids, max_new_tokens=512, rid=rid)
        except urllib.error.HTTPError:
            if not fired.is_set():
                raise
            self._count("abort_landed")  # SGLang answers an aborted non-streamed request with an HTTP error
            return
        finally:
            timer.cancel()
        reason = (out["meta_info"].get("finish_reason") or {}).get("type")
        self._count("abort_landed" if reason == "abort" else "abort_too_late")

    def flush(self) -> bool:
        try:
            with self.server.post("/flush_cache", {}) as r:
                return r.status == 200
        except Exception:  # noqa: BLE001 - 400 while requests run
            return False

    def idle(self, timeout: float = 300) -> None:
        t0 = time.time()
        while self.in_flight and time.time() - t0 < timeout:
            time.sleep(0.2)

    def flusher(self, busy_every: float, quiet_every: float) -> None:
        last_quiet = time.time()
        while not self.stop.wait(busy_every):
            self._count("flush_busy_done" if self.flush() else "flush_busy_refused")
            if time.time() - last_quiet >= quiet_every:
                self.paused.set()
                self.idle()
                self._count("flush_quiet_done" if self.flush() else "flush_quiet_refused")
                self.paused.clear()
                last_quiet = time.time()


def probe(server: Server, load: Load):
    load.flush()
    return server.generate(random_prompts(7, [PROBE_LEN])[0], max_new_tokens=PROBE_TOKENS)["output_ids"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--duration", type=float, default=480, help="seconds of load (>= 480 for the acceptance)")
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--max-requests", type=int, default=5000)
    ap.add_argument("--max-total-tokens", type=int, default=300000, help="KV pool size: small, so the cache evicts")
    ap.add_argument("--context-length", type=int, default=135168)
    ap.add_argument("--port", type=int, default=30021)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mode", choices=("locks", "fullkv"), default="locks",
                    help="fullkv: the same load on stock SGLang, to tell LOCKS's faults from the server's")
    ap.add_argument("--out", required=True)
    ap.add_argument("--log-dir", required=True)
    a = ap.parse_args()

    server = Server(f"soak_{a.mode}", a.port, server_args(a.model, a.max_total_tokens, a.context_length, a.mode),
                    a.log_dir, env={"SGLANG_LOCKS_CHECK_STALE": "1"})
    load = Load(server, a.seed, a.max_requests, a.context_length)
    end = {}  # what the end of the soak saw; empty where the server died under load
    samples = []
    try:
        server.generate_all(random_prompts(9, [2000, 50000]), max_new_tokens=8)  # warm-up: allocator, graphs
        probe_start = probe(server, load)
        memory_start = {"gpu_mib": gpu_memory_mib(), "host_rss_mib": host_rss_mib(server.proc.pid)}
        t0 = time.time()
        threads = [threading.Thread(target=load.client, args=(i,), daemon=True) for i in range(a.clients)]
        threads.append(threading.Thread(target=load.flusher, args=(45.0, 150.0), daemon=True))
        for t in threads:
            t.start()
        while (time.time() - t0 < a.duration and any(t.is_alive() for t in threads[:-1])
               and server.proc.poll() is None):
            time.sleep(10)
            samples.append({"t": round(time.time() - t0), "gpu_mib": gpu_memory_mib(),
                            "host_rss_mib": host_rss_mib(server.proc.pid), "in_flight": load.in_flight})
        load.stop.set()
        for t in threads:
            t.join(timeout=600)
        load_s = time.time() - t0
        if server.proc.poll() is None:
            end["probe"] = probe(server, load)
            end["memory"] = {"gpu_mib": gpu_memory_mib(), "host_rss_mib": host_rss_mib(server.proc.pid)}
            end["counters"] = server.locks_counters() if a.mode == "locks" else None
            end["metrics"] = server.metrics()
    finally:
        exit_code = server.proc.poll()
        server.stop()

    checks = {"server_alive": not exit_code, "no_request_failed": not load.errors, "ran_the_duration": load_s >= a.duration}
    if end:
        checks.update({
            "stale_scorable_pages_zero": a.mode == "fullkv" or end["counters"]["stale_scorable_pages"] == 0,
            "probe_tokens_equal": probe_start == end["probe"],
            "gpu_memory_flat": end["memory"]["gpu_mib"] - memory_start["gpu_mib"] <= GPU_MEMORY_SLACK_MIB,
            "host_memory_flat": end["memory"]["host_rss_mib"] <= memory_start["host_rss_mib"] * (1 + HOST_MEMORY_SLACK),
            "cache_evicted": metric(end["metrics"], "sglang:evicted_tokens_total") > 0,
        })
    with open(server.log) as f:
        server_log_tail = f.read().splitlines()[-60:] if exit_code else []
    result = {
        "command": "python benchmarks/soak.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items()),
        "git": os.environ.get("GIT_REV") or subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                                          capture_output=True, text=True).stdout.strip(),
        "gpu": subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True).stdout.strip(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "server_startup_s": round(server.startup_s, 1),
        "load_s": round(load_s, 1),
        "passed": all(checks.values()),
        "checks": checks,
        "requests": dict(load.counts),
        "errors": load.errors[:50],
        "server_exit_code": exit_code,
        "server_log_tail": server_log_tail,
        "evicted_tokens": metric(end["metrics"], "sglang:evicted_tokens_total") if end else None,
        "locks_counters": end.get("counters"),
        "probe_tokens": {"start": probe_start, "end": end.get("probe")},
        "memory": {"start": memory_start, "end": end.get("memory"), "samples": samples},
    }
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: result[k] for k in ("passed", "checks", "requests", "evicted_tokens", "load_s",
                                             "server_exit_code", "locks_counters")}, indent=1))


if __name__ == "__main__":
    main()
