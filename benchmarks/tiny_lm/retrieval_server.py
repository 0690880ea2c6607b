"""The retrieval task (retrieval.make_prompts) through an SGLang server, greedy, per configuration.

    python -m benchmarks.tiny_lm.retrieval_server --model benchmarks/models/tiny-llama-pycode --out RESULT.json \
        [--contexts 8192,16384,32768] [--prompts 8] [--locks-budgets 256,2048] [--log-dir DIR]

Starts ``python -m sglang.launch_server`` once densely and once per
--locks-budgets entry with ``--enable-locks --locks-token-budget B`` (the
plugin of issue 3), sends the same prompts as token ids to /generate with
temperature 0, scores the first 6 answer bytes and stops the server. With
--url it uses a running server instead (one configuration, labelled --label).
The prompts are those of ``measure.py --parts retrieval`` (same seed), so the
torch-path numbers there compare one to one.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

from . import retrieval
from .byte_tokenizer import decode as decode_bytes
from .corpus import DEFAULT_EXTRA_ROOTS, default_roots, load_corpus


def _post(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_ready(base: str, proc, timeout: float) -> float:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=5) as r:
                if r.status == 200:
                    return time.time() - t0
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"server not ready after {timeout:.0f} s")


def run_prompts(base: str, prompt_sets: dict) -> list:
    rows = []
    for (ctx, template), prompts in prompt_sets.items():
        t0 = time.time()
        out = _post(base + "/generate", {
            "input_ids": [p["ids"].tolist() for p in prompts],
            "sampling_params": {"max_new_tokens": retrieval.VALUE_LEN, "temperature": 0.0},
        }, timeout=600)
        texts = [decode_bytes(o["output_ids"]) for o in out]
        rows.append({"context": ctx, "template": template, **retrieval.score(prompts, texts),
                     "seconds": round(time.time() - t0, 2),
                     "examples": [{"answer": p["answer"], "got": t, "server_text": o.get("text")}
                                  for p, t, o in zip(prompts[:4], texts[:4], out[:4])]})
        print(f"[retrieval_server]   ctx {ctx} {template}: accuracy {rows[-1]['accuracy']:.2f} "
              f"({rows[-1]['seconds']:.1f} s)", flush=True)
    return rows


def serve_and_run(args, extra: list, label: str, prompt_sets: dict) -> dict:
    port = args.port
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", args.model, "--host", "127.0.0.1",
           "--port", str(port), "--context-length", str(max(args.contexts) + 64), "--attention-backend", "flashinfer",
           "--mem-fraction-static", "0.5", "--disable-radix-cache", *args.server_args.split(), *extra]
    log_path = os.path.join(args.log_dir, f"server-{label}.log")
    print(f"[retrieval_server] {label}: {' '.join(cmd[1:])}", flush=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        ready = wait_ready(f"http://127.0.0.1:{port}", proc, args.server_wait)
        print(f"[retrieval_server] {label}: ready after {ready:.0f} s", flush=True)
        rows = run_prompts(f"http://127.0.0.1:{port}", prompt_sets)
        return {"label": label, "server_flags": extra, "ready_s": round(ready, 1), "log": log_path, "rows": rows}
    except (RuntimeError, OSError) as e:
        return {"label": label, "server_flags": extra, "error": str(e), "log": log_path}
    finally:
        stop(proc)


def stop(proc) -> None:
    """SIGTERM the server's process group (it forks workers), SIGKILL after a minute."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tiny_lm.retrieval_server", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--contexts", type=lambda t: [int(x) for x in t.split(",") if x], default=[8192, 16384, 32768])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--secrets", type=int, default=4)
    ap.add_argument("--templates", default="assign,print")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--locks-budgets", default="", help="one LOCKS server per budget, after the dense one")
    ap.add_argument("--server-args", default="", help="more launch_server flags, one string")
    ap.add_argument("--url", help="use this running server (one configuration) instead of starting servers")
    ap.add_argument("--label", default="external")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--server-wait", type=float, default=300)
    ap.add_argument("--log-dir", default=".")
    ap.add_argument("--extra-roots", default=",".join(DEFAULT_EXTRA_ROOTS))
    args = ap.parse_args(argv)

    corpus = load_corpus(default_roots([r for r in args.extra_roots.split(",") if r]))
    prompt_sets = {(ctx, t): retrieval.make_prompts(corpus.held_out, ctx, args.prompts, args.secrets, t, args.seed)
                   for ctx in args.contexts for t in args.templates.split(",")}
    os.makedirs(args.log_dir, exist_ok=True)
    if args.url:
        wait_ready(args.url, None, args.server_wait)
        runs = [{"label": args.label, "url": args.url, "rows": run_prompts(args.url, prompt_sets)}]
    else:
        configs = [("dense", [])] + [(f"locks-{b}", ["--enable-locks", "--locks-token-budget", b])
                                     for b in args.locks_budgets.split(",") if b]
        runs = [serve_and_run(args, extra, label, prompt_sets) for label, extra in configs]
    with open(args.out, "w") as f:
        json.dump({"command": " ".join(sys.argv), "model": args.model, "runs": runs}, f, indent=1)
    print(f"[retrieval_server] -> {args.out}", flush=True)
    return 0 if all("error" not in r for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
