"""PNGs from measure.py's JSON (and train.py's log for the loss curve).

    python -m benchmarks.tiny_lm.plot --measure RESULT.json [--train-log train_log.json] --out-dir DIR

Writes tiny_lm_recall.png (mean recall and output error vs budget per context),
tiny_lm_recall_heads.png (recall per layer and KV head at one budget),
tiny_lm_loss.png (teacher-forced loss delta vs dense), tiny_lm_retrieval.png,
tiny_lm_lowrank.png and, with --train-log, tiny_lm_train.png.
"""

from __future__ import annotations

import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _by_context(rows):
    out = {}
    for r in rows:
        out.setdefault(r["context"], []).append(r)
    return dict(sorted(out.items()))


def _lines(ax, rows, key, selectors):
    for spec in selectors:
        pts = sorted((r["budget"], r[key]) for r in rows if r["selector"] == spec and r.get("budget") is not None)
        if pts:
            ax.plot(*zip(*pts), marker="o", label=spec)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("token budget")


def _selectors(rows):
    return list(dict.fromkeys(r["selector"] for r in rows if r["selector"] != "dense"))


def plot_recall(res, path):
    groups = _by_context(res["recall_summary"])
    fig, axes = plt.subplots(2, len(groups), figsize=(4.5 * len(groups), 7), squeeze=False)
    for col, (ctx, rows) in enumerate(groups.items()):
        _lines(axes[0, col], rows, "recall_mean", _selectors(rows))
        _lines(axes[1, col], rows, "rel_error_mean", _selectors(rows))
        axes[0, col].set_title(f"context {ctx}")
        axes[0, col].set_ylabel("attention-mass recall (mean over layers, heads)")
        axes[1, col].set_ylabel("attention output relative error")
        axes[1, col].set_yscale("log")
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_recall_heads(res, path, budget):
    rows = [r for r in res["recall"] if r["budget"] == budget]
    contexts = sorted({r["context"] for r in rows})
    selectors = _selectors(rows)
    fig, axes = plt.subplots(1, len(contexts), figsize=(5 * len(contexts), 4), squeeze=False)
    for ax, ctx in zip(axes[0], contexts):
        heads = sorted({(r["layer"], r["kv_head"]) for r in rows if r["context"] == ctx})
        for spec in selectors:
            vals = []
            for layer, h in heads:
                rs = [r["recall"] for r in rows if r["context"] == ctx and r["selector"] == spec
                      and r["layer"] == layer and r["kv_head"] == h]
                vals.append(sum(rs) / len(rs))
            ax.plot(range(len(heads)), vals, marker="o", label=spec)
        ax.set_xticks(range(len(heads)), [f"L{l}H{h}" for l, h in heads], rotation=90, fontsize=7)
        ax.set_title(f"recall per layer/KV head, budget {budget}, context {ctx}")
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _context_panels(groups, path, draw):
    """One panel per context: draw(ax, ctx, rows) for each of groups {context: rows}, then save."""
    fig, axes = plt.subplots(1, max(1, len(groups)), figsize=(4.5 * max(1, len(groups)), 3.8), squeeze=False)
    for ax, (ctx, rows) in zip(axes[0], groups.items()):
        draw(ax, ctx, rows)
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_loss(res, path):
    def draw(ax, ctx, rows):
        _lines(ax, rows, "loss_delta", _selectors(rows))
        dense = next(r["loss"] for r in rows if r["selector"] == "dense")
        ax.axhline(0, color="k", lw=0.8)
        ax.set_title(f"context {ctx} (dense {dense:.3f} nats/byte)")
        ax.set_ylabel("loss - dense, last tokens (nats/byte)")

    _context_panels(_by_context(res["loss"]), path, draw)


def plot_retrieval(res, path):
    def draw(ax, ctx, rows):
        _lines(ax, rows, "accuracy", _selectors(rows))
        template = rows[0]["template"]
        dense = next(r for r in res["retrieval"] if r["context"] == ctx and r["selector"] == "dense"
                     and r["template"] == template)
        ax.axhline(dense["accuracy"], color="k", ls="--", label="dense")
        ax.axhline(dense["chance_random_planted_value"], color="gray", ls=":", label="random planted value")
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(f"retrieval '{template}', context {ctx} (n={dense['n']})")
        ax.set_ylabel("exact match")

    _context_panels(_by_context([r for r in res["retrieval"] if r["selector"] != "dense"]), path, draw)


def plot_lowrank(res, path):
    rows = res["lowrank"]
    ctx = max(r["context"] for r in rows)
    rows = [r for r in rows if r["context"] == ctx]
    layers = sorted({r["layer"] for r in rows})
    heads = rows[0]["heads"]
    series = {f"per-page r{r}": ("per_page", r) for r in rows[0]["per_page"]}
    series.update({f"shared r{r}": ("shared", r) for r in rows[0]["shared"]})
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(layers) * heads), 4))
    labels = [f"L{l}H{h}" for l in layers for h in range(heads)]
    width = 0.8 / len(series)
    for i, (name, (kind, r)) in enumerate(series.items()):
        vals = []
        for l in layers:
            docs = [x for x in rows if x["layer"] == l]
            vals += [sum(d[kind][r][h] for d in docs) / len(docs) for h in range(heads)]
        ax.bar([j + i * width for j in range(len(labels))], vals, width, label=name)
    for r, v in rows[0]["shared_layer"].items():
        mean = sum(x["shared_layer"][r] for x in rows) / len(rows)
        ax.axhline(mean, ls=":", lw=0.8, color="k")
        ax.text(len(labels) - 0.5, mean, f"layer-shared r{r}", fontsize=7, va="bottom", ha="right")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(labels))], labels, fontsize=8)
    ax.set_ylabel("centred key energy captured")
    ax.set_title(f"page-local vs shared bases, context {ctx}")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_train(log, path):
    fig, ax = plt.subplots(figsize=(7, 4))
    steps = log["loss_curve"]
    ax.plot([s["t"] for s in steps], [s["loss"] for s in steps], lw=0.6, label="train (batch)")
    pts = log["held_out_curve"]["points"]
    ax.plot([p["t"] for p in pts], [p["held_out_loss"] for p in pts], marker="o",
            label=f"held-out ({log['held_out_curve']['context']} tokens)")
    ax.set_xlabel("seconds")
    ax.set_ylabel("loss (nats/byte)")
    ax.set_ylim(top=min(6.0, max(s["loss"] for s in steps)))
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tiny_lm.plot", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measure", required=True)
    ap.add_argument("--train-log")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--head-budget", type=int, default=256)
    args = ap.parse_args(argv)
    res = json.load(open(args.measure))
    os.makedirs(args.out_dir, exist_ok=True)
    out = lambda name: os.path.join(args.out_dir, name)  # noqa: E731
    if res.get("recall"):
        plot_recall(res, out("tiny_lm_recall.png"))
        plot_recall_heads(res, out("tiny_lm_recall_heads.png"), args.head_budget)
    if res.get("loss"):
        plot_loss(res, out("tiny_lm_loss.png"))
    if res.get("retrieval"):
        plot_retrieval(res, out("tiny_lm_retrieval.png"))
    if res.get("lowrank"):
        plot_lowrank(res, out("tiny_lm_lowrank.png"))
    if args.train_log:
        plot_train(json.load(open(args.train_log)), out("tiny_lm_train.png"))
    print(f"[plot] -> {args.out_dir}: {sorted(os.listdir(args.out_dir))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
