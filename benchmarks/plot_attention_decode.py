"""Plot benchmarks/results/attention_decode.json -> attention_decode.png."""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(path="benchmarks/results/attention_decode.json", out="benchmarks/results/attention_decode.png"):
    d = json.load(open(path))
    rows = d["rows"]
    labels = [f"{r['shape'].split('-')[0]}\nbs{r['batch']} {r['context'] // 1024}K"
              + (f"\nprefilter {r['prefilter']}" if r.get("prefilter") else "") for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.9), 4.5))
    w = 0.27
    ax.bar([i - w for i in x], [r["dense_ms"] for r in rows], w, label="FlashInfer dense", color="#777")
    bottom = [0.0] * len(rows)
    for key, color in (("score_ms", "#c0392b"), ("select_ms", "#e67e22"), ("attend_ms", "#2980b9")):
        vals = [r[key] for r in rows]
        ax.bar(list(x), vals, w, bottom=bottom, label=f"LOCKS {key[:-3]} (alone)", color=color)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.bar([i + w for i in x], [r["locks_ms"] for r in rows], w, label="LOCKS step", color="#27ae60")
    ax.plot([i + w for i in x], [r["floor_locks_ms"] for r in rows], "k_", ms=14, label="LOCKS bandwidth floor")
    ax.set_xticks(list(x), labels, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("ms per decode step (attention, all layers)")
    ax.set_title(f"{d['gpu']}, budget {rows[0]['budget']}, git {d['git']}, {d['date'][:10]}", fontsize=9)
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:])
