"""Selectors on the tiny LM's learned attention: recall/error per layer and KV head, teacher-forced
loss with sparse decode attention, retrieval, and the page-local low-rank energy.

    python -m benchmarks.tiny_lm.measure --model DIR --out RESULT.json \
        [--contexts 8192,16384,32768] [--budgets 64,128,256,512,1024,2048] [--docs 2] [--parts recall,lowrank,loss,retrieval]

Per context, on --docs held-out documents (one package each, in turn):

recall    the queries at the last --queries positions against the keys before
          them (sglang_locks.evaluate's setting), per layer and KV head.
lowrank   lowrank.energy_fractions of each layer's keys, per KV head.
loss      the loss of the last --loss-tokens tokens, teacher-forced: the
          positions before them are prefilled densely, each of those positions
          then attends as a decode step would (sparse, every layer), per
          selector and budget; 'dense' is the same code path attending all keys.
retrieval retrieval.make_prompts at that context: dense prefill, then greedy
          decode steps attending densely (every template) and sparsely (the
          --sparse-template, per selector and budget). The first answer byte
          comes from the dense prefill, as on a server.

The JSON is rewritten after every part, so a run cut short keeps what it finished.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from . import retrieval
from .byte_tokenizer import decode as decode_bytes
from .capture_kv import capture
from .corpus import DEFAULT_EXTRA_ROOTS, default_roots, load_corpus
from .export import load_model
from .lowrank import energy_fractions
from .selector_metrics import recall_and_error
from .sparse_attention import DENSE, Policy, SparseDecodeAttend

PARTS = ("recall", "lowrank", "loss", "retrieval")


def _ints(text):
    return [int(x) for x in text.split(",") if x]


def _git_rev() -> str:
    if os.environ.get("GIT_REV"):
        return os.environ["GIT_REV"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"


def measure_recall(layers, selectors, budgets, ctx, docs) -> list:
    """Docs and layers folded into the head axis: one preparation per selector."""
    n_layers, (b, _, hkv, d) = len(layers), layers[0]["keys"].shape

    def fold(name):
        x = torch.stack([kv[name] for kv in layers])  # [L, B, T, H, d]
        return x.permute(2, 0, 1, 3, 4).reshape(x.shape[2], -1, d)

    keys, values, queries = fold("keys"), fold("values"), fold("queries")
    rows = []
    for spec in selectors:
        res = recall_and_error(spec, keys, queries, values, budgets)
        for budget, metrics in res.items():
            recall = metrics["recall"].view(n_layers, b, hkv).tolist()
            error = metrics["rel_error"].view(n_layers, b, hkv).tolist()
            for layer in range(n_layers):
                for i in range(b):
                    for h in range(hkv):
                        rows.append({"context": ctx, "doc": docs[i], "layer": layer, "kv_head": h, "selector": spec,
                                     "budget": budget, "recall": recall[layer][i][h], "rel_error": error[layer][i][h]})
    return rows


def summarize_recall(rows) -> list:
    groups = {}
    for r in rows:
        groups.setdefault((r["context"], r["selector"], r["budget"]), []).append(r)
    out = []
    for (ctx, spec, budget), rs in sorted(groups.items()):
        out.append({"context": ctx, "selector": spec, "budget": budget, "n": len(rs),
                    "recall_mean": sum(r["recall"] for r in rs) / len(rs),
                    "recall_min": min(r["recall"] for r in rs),
                    "rel_error_mean": sum(r["rel_error"] for r in rs) / len(rs)})
    return out


@torch.no_grad()
def measure_loss(model, ids, loss_tokens, policies) -> list:
    """ids [B, T + 1]: prefill T - loss_tokens positions, decode-attend the rest, score the last loss_tokens."""
    ctx = ids.shape[1] - 1
    n_prefix = ctx - loss_tokens
    cache: list = []
    model(ids[:, :n_prefix], cache=cache)
    chunk, targets = ids[:, n_prefix:ctx], ids[:, n_prefix + 1 :]
    rows = []
    for policy in policies:
        logits = model(chunk, attend=SparseDecodeAttend(policy), cache=list(cache), q_start=n_prefix)
        per_doc = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none").mean(1)
        rows.append({"context": ctx, "selector": policy.selector, "budget": None if policy.selector == DENSE else policy.budget,
                     "loss": per_doc.mean().item(), "loss_per_doc": per_doc.tolist()})
    dense = next(r["loss"] for r in rows if r["selector"] == DENSE)
    for r in rows:
        r["loss_delta"] = r["loss"] - dense
    return rows


@torch.no_grad()
def measure_retrieval(model, corpus, ctx, args, selectors, budgets, device) -> list:
    rows = []
    for template in args.templates.split(","):
        prompts = retrieval.make_prompts(corpus.held_out, ctx, args.retrieval_prompts, args.secrets, template, args.seed)
        ids = torch.stack([p["ids"] for p in prompts]).to(device)
        first, cache = retrieval.prefill(model, ids)
        runs = [(Policy(DENSE), None)]
        if template == args.sparse_template:
            runs += [(Policy(s, b), s) for s in selectors for b in budgets]
        prepared = {}  # prompt pages are the same for every budget: prepare once per selector and layer
        for policy, spec in runs:
            attend = SparseDecodeAttend(policy, shared_prefix=ctx, prepared=prepared)
            tokens = retrieval.decode(model, first, cache, ctx, retrieval.VALUE_LEN, attend)
            texts = [decode_bytes(t) for t in tokens]
            row = {"context": ctx, "template": template, "selector": policy.selector,
                   "budget": None if spec is None else policy.budget, **retrieval.score(prompts, texts)}
            if spec is None:
                row["examples"] = [{"answer": p["answer"], "got": t} for p, t in zip(prompts[:4], texts[:4])]
            rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tiny_lm.measure", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True, help="JSON file")
    ap.add_argument("--contexts", type=_ints, default=[8192, 16384, 32768])
    ap.add_argument("--budgets", type=_ints, default=[64, 128, 256, 512, 1024, 2048])
    ap.add_argument("--selectors", default="locks,locks:fp32,quest,shared,shared:32,oracle")
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--docs", type=int, default=2)
    ap.add_argument("--queries", type=int, default=64)
    ap.add_argument("--loss-tokens", type=int, default=512)
    ap.add_argument("--retrieval-prompts", type=int, default=8)
    ap.add_argument("--secrets", type=int, default=4)
    ap.add_argument("--templates", default="assign,print")
    ap.add_argument("--sparse-template", default="assign")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--extra-roots", default=",".join(DEFAULT_EXTRA_ROOTS))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    if set(parts) - set(PARTS):
        ap.error(f"--parts takes {PARTS}")
    selectors = [s for s in args.selectors.split(",") if s]
    device = torch.device(args.device)

    t0 = time.time()
    model = load_model(args.model, device, torch.bfloat16 if device.type == "cuda" else torch.float32)
    corpus = load_corpus(default_roots([r for r in args.extra_roots.split(",") if r]))
    result = {
        "command": "python -m benchmarks.tiny_lm.measure " + " ".join(argv if argv is not None else sys.argv[1:]),
        "git": _git_rev(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "model_config": model.config.hf_config(),
        "args": vars(args),
        "held_out_packages": sorted(corpus.held_out),
        "timings_s": {},
        **{p: [] for p in PARTS},
    }

    def save(part, ctx, started):
        result["timings_s"][f"{part}@{ctx}"] = round(time.time() - started, 2)
        if part == "recall":
            result["recall_summary"] = summarize_recall(result["recall"])
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"[measure] {part} @ {ctx}: {time.time() - started:.1f} s (total {time.time() - t0:.0f} s)", flush=True)

    for ctx in args.contexts:
        docs = corpus.held_out_documents(ctx + 1, args.docs)
        if not docs:
            print(f"[measure] no held-out text for {ctx} tokens, skipping", flush=True)
            continue
        doc_names = [f"{d['package']}@{d['offset']}" for d in docs]
        ids = torch.stack([d["ids"] for d in docs]).to(device)
        if "recall" in parts or "lowrank" in parts:
            started = time.time()
            layers = capture(model, ids[:, :ctx], args.queries)
            if "lowrank" in parts:
                for layer, kv in enumerate(layers):
                    for i, name in enumerate(doc_names):
                        result["lowrank"].append({"context": ctx, "doc": name, "layer": layer,
                                                  **energy_fractions(kv["keys"][i])})
                save("lowrank", ctx, started)
                started = time.time()
            if "recall" in parts:
                result["recall"] += measure_recall(layers, selectors, args.budgets, ctx, doc_names)
                save("recall", ctx, started)
            del layers
        policies = [Policy(DENSE)] + [Policy(s, b) for s in selectors for b in args.budgets]
        if "loss" in parts:
            started = time.time()
            result["loss"] += measure_loss(model, ids, args.loss_tokens, policies)
            save("loss", ctx, started)
        if "retrieval" in parts:
            started = time.time()
            result["retrieval"] += measure_retrieval(model, corpus, ctx, args, selectors, args.budgets, device)
            save("retrieval", ctx, started)
    print(f"[measure] done in {time.time() - t0:.0f} s -> {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
