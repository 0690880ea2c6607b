"""One PNG of measure.py's JSON: per context, recall and output error, loss delta and retrieval vs budget.

    python -m benchmarks.smollm2.plot --result benchmarks/results/smollm2_accuracy.json --out PNG
"""

from __future__ import annotations

import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _lines(ax, rows, key, selectors):
    """key vs budget per selector, each in its own colour in every panel (tiny_lm.plot's colours follow
    the selectors a panel has)."""
    for i, spec in enumerate(selectors):
        pts = sorted((r["budget"], r[key]) for r in rows if r["selector"] == spec and r.get("budget") is not None)
        if pts:
            ax.plot(*zip(*pts), marker="o", color=f"C{i}", label=spec)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("token budget")


def _at(rows, ctx):
    return [r for r in rows if r["context"] == ctx]


def plot(result: dict, path: str) -> None:
    selectors = [s for s in result["args"]["selectors"].split(",") if s]
    contexts = sorted({r["context"] for part in ("recall_summary", "loss", "retrieval") for r in result.get(part, [])})
    panels = [("recall_summary", "recall_mean", "attention-mass recall"),
              ("recall_summary", "rel_error_mean", "attention output rel. error"),
              ("loss", "loss_delta", "loss - dense, last tokens (nats/token)"),
              ("retrieval", "accuracy", "retrieval exact match")]
    fig, axes = plt.subplots(len(panels), len(contexts), figsize=(4.2 * len(contexts), 3.2 * len(panels)),
                             squeeze=False)
    for col, ctx in enumerate(contexts):
        for row, (part, key, label) in enumerate(panels):
            ax, rows = axes[row, col], _at(result.get(part, []), ctx)
            if not rows:
                ax.axis("off")
                continue
            _lines(ax, rows, key, selectors)
            ax.set_ylabel(label, fontsize=8)
            dense = next((r for r in rows if r["selector"] == "dense"), None)
            if key == "rel_error_mean":
                ax.set_yscale("log")
            elif key == "loss_delta":
                ax.axhline(0, color="k", lw=0.8)
                ax.set_title(f"{ctx} tokens: dense {dense['loss']:.3f} nats/token", fontsize=9)
            elif key == "accuracy":
                ax.axhline(dense["accuracy"], color="k", ls="--", label="dense")
                ax.set_ylim(-0.05, 1.05)
                ax.set_title(f"{ctx} tokens, n={dense['n']} prompts", fontsize=9)
            else:
                ax.set_title(f"SmolLM2-135M, {ctx} tokens", fontsize=9)
            if col == 0 or key == "accuracy":
                ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.smollm2.plot", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--result", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    with open(args.result) as f:
        plot(json.load(f), args.out)
    print(f"[plot] -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
