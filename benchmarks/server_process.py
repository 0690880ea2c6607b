"""One `sglang.launch_server` process on the loopback address, and the calls the GPU tests and benchmarks make.

Token ids in and out (the servers run with --skip-tokenizer-init), greedy
sampling unless told otherwise.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from typing import List, Optional

HOST = "127.0.0.1"


def random_prompts(seed: int, lengths) -> List[List[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, 120000) for _ in range(n)] for n in lengths]


class Server:
    def __init__(self, name: str, port: int, args: List[str], log_dir: str, env: Optional[dict] = None,
                 ready_timeout: float = 600):
        self.name, self.url = name, f"http://{HOST}:{port}"
        os.makedirs(log_dir, exist_ok=True)
        self.log = os.path.join(log_dir, f"server_{name}.log")
        cmd = [sys.executable, "-m", "sglang.launch_server", *args, "--host", HOST, "--port", str(port)]
        with open(self.log, "w") as log:
            log.write(" ".join(cmd) + "\n")
            log.flush()
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                         env={**os.environ, **(env or {})})
        t0 = time.time()
        while time.time() - t0 < ready_timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server {name} exited with {self.proc.returncode}; see {self.log}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        self.startup_s = time.time() - t0
                        return
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(2)
        self.stop()
        raise RuntimeError(f"server {name} not ready in {ready_timeout:.0f} s; see {self.log}")

    def post(self, path: str, body: dict, timeout: float = 600):
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        return urllib.request.urlopen(req, timeout=timeout)

    def generate(self, ids, max_new_tokens: int = 32, **extra):
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0,
                                                      "ignore_eos": True}, **extra}
        with self.post("/generate", body) as r:
            return json.loads(r.read())

    def generate_all(self, prompts, max_new_tokens: int = 32):
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            return list(pool.map(lambda p: self.generate(p, max_new_tokens), prompts))

    def server_info(self) -> dict:
        with urllib.request.urlopen(self.url + "/server_info", timeout=60) as r:
            return json.loads(r.read())

    def locks_counters(self) -> dict:
        return self.server_info()["internal_states"][0]["locks"]

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=60) as r:
            return r.read().decode()

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=60)
        except ProcessLookupError:  # the server's process group is gone already
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
