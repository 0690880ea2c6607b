"""The recall audit (--locks-audit-every) in a real server: /metrics shows it, greedy tokens stay the same, and
what it costs in decode throughput.

    GIT_REV=$(git rev-parse --short HEAD) python3 benchmarks/audit_server.py --out $OUT/audit_server.json \
        [--model benchmarks/models/tiny-llama-pycode] [--load-format dummy] [--every 64] [--rounds 2] [--reps 5] \
        [--log-dir DIR]

Servers one at a time on one GPU, CUDA graphs on, all with --enable-locks
--locks-min-step-tokens 0 (every decode step through LOCKS) --enable-metrics
--disable-radix-cache; "off" without the audit, "audit" with
--locks-audit-every EVERY, alternating for --rounds rounds. Each server
greedily decodes the equality prompts one at a time (Python source of this
repository, longer than the budget), then times --reps repetitions of a
batch of --batch prompts decoded to --short and to --short + --decode new
tokens: decode throughput = batch * decode / (long - short) seconds, the
prefill cancelling out (no radix cache, so every repetition prefills the
same). The audit server's /metrics must show the recall histogram; the JSON
holds its per-layer-group means, the tokens' equality, and each mode's
median throughput and their ratio. Exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from e2e_decode import header  # noqa: E402
from server_process import Server  # noqa: E402

RECALL = re.compile(r'^sglang:locks_audit_recall_(sum|count)\{([^}]*)\} (\S+)$')


def source_prompts(lengths, seed_offset: int = 0):
    """Byte-level token ids (the tiny LM's tokenizer: bos 256, then the bytes) of this repository's Python files."""
    text = b"".join(open(p, "rb").read() for p in sorted(glob.glob(os.path.join(ROOT, "**", "*.py"), recursive=True)))
    prompts = []
    for i, n in enumerate(lengths):
        start = (seed_offset + i) * 7919 % max(1, len(text) - n)
        prompts.append([256] + list(text[start : start + n - 1]))
    return prompts


def recall_means(metrics_text: str) -> dict:
    """layer_group -> {count, mean} of sglang:locks_audit_recall on /metrics."""
    sums, counts = {}, {}
    for line in metrics_text.splitlines():
        m = RECALL.match(line)
        if m:
            group = re.search(r'layer_group="([^"]*)"', m.group(2)).group(1)
            (sums if m.group(1) == "sum" else counts)[group] = float(m.group(3))
    return {g: {"count": counts[g], "mean": sums.get(g, 0.0) / counts[g]} for g in counts if counts[g]}


def decode_throughput(server: Server, prompts, short: int, decode: int, reps: int):
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        server.generate_all(prompts, short)
        t1 = time.perf_counter()
        server.generate_all(prompts, short + decode)
        t2 = time.perf_counter()
        rates.append(len(prompts) * decode / ((t2 - t1) - (t1 - t0)))
    return rates


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default=os.path.join(ROOT, "benchmarks", "models", "tiny-llama-pycode"))
    ap.add_argument("--load-format", default="auto", help="'dummy' for a config-only model such as the kit's "
                    "llama8b-dummy (the cost of the audit is measurable there, its recall is not meaningful)")
    ap.add_argument("--every", type=int, default=64)
    ap.add_argument("--budget", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=8192)
    ap.add_argument("--short", type=int, default=16)
    ap.add_argument("--decode", type=int, default=512)
    ap.add_argument("--equality-lengths", default="3000,6000,9000")
    ap.add_argument("--equality-tokens", type=int, default=160, help="new tokens: >= 2 audits at the default --every")
    ap.add_argument("--port", type=int, default=30021)
    ap.add_argument("--log-dir", default=None)
    args = ap.parse_args(argv)
    log_dir = args.log_dir or os.path.join(os.path.dirname(os.path.abspath(args.out)), "audit_logs")
    common = ["--model-path", args.model, "--load-format", args.load_format, "--skip-tokenizer-init",
              "--context-length",
              str(max(args.prompt_tokens, *map(int, args.equality_lengths.split(","))) + 1024),
              "--mem-fraction-static", "0.5", "--cuda-graph-max-bs", "8", "--disable-prefill-cuda-graph",
              "--disable-radix-cache", "--enable-metrics", "--enable-locks", "--locks-min-step-tokens", "0",
              "--locks-token-budget", str(args.budget)]
    modes = {"off": [], "audit": ["--locks-audit-every", str(args.every)]}
    equality = source_prompts([int(n) for n in args.equality_lengths.split(",")])
    batch = source_prompts([args.prompt_tokens] * args.batch, seed_offset=100)
    result = {**header(argv), "command": " ".join(["python3", "benchmarks/audit_server.py", *argv]),
              "every": args.every, "budget": args.budget, "batch": args.batch,
              "prompt_tokens": args.prompt_tokens, "decode_tokens": args.decode, "rounds": []}
    tokens = {}
    for round_ in range(args.rounds):
        for mode, flags in modes.items():
            t0 = time.time()
            server = Server(f"audit_{mode}_{round_}", args.port, common + flags, log_dir)
            try:
                outs = [server.generate(p, args.equality_tokens)["output_ids"] for p in equality]
                tokens.setdefault(mode, outs)
                row = {"mode": mode, "round": round_, "startup_s": round(server.startup_s, 1),
                       "tokens_equal_first_round": outs == tokens[mode],
                       "decode_tok_s": decode_throughput(server, batch, args.short, args.decode, args.reps)}
                if mode == "audit":
                    row["recall"] = recall_means(server.metrics())
                    row["locks_counters"] = server.locks_counters()
            finally:
                server.stop()
            result["rounds"].append(row)
            print(f"audit_server: {mode} round {round_}: {statistics.median(row['decode_tok_s']):.0f} tok/s, "
                  f"{row.get('recall', '')} ({time.time() - t0:.0f} s)", flush=True)
    medians = {m: statistics.median([r for row in result["rounds"] if row["mode"] == m for r in row["decode_tok_s"]])
               for m in modes}
    audited = [row for row in result["rounds"] if row["mode"] == "audit"]
    result.update(
        tokens_equal=tokens["off"] == tokens["audit"],
        recall_on_metrics=all(row["recall"] for row in audited),
        median_decode_tok_s=medians,
        audit_over_off=medians["audit"] / medians["off"],
    )
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: result[k] for k in ("tokens_equal", "recall_on_metrics", "median_decode_tok_s",
                                             "audit_over_off")}), flush=True)
    return 0 if result["tokens_equal"] and result["recall_on_metrics"] else 1


if __name__ == "__main__":
    sys.exit(main())
